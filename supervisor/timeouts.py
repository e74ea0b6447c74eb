"""Workflow timeouts, enforced by every supervisor: a part of the dispatcher loop
(`loop.DispatchLoop` mixes it in, and owns its state). SPEC section 12.

The ledger records each execution's deadline at its admission; nothing happens at the deadline
itself. Once a renewal round (and at once when the supervisor starts, so that what passed its
deadline while no supervisor ran fails before anything claims it) the loop asks the ledger to fail
whatever is past its deadline, whichever workflow and whoever holds it (`TimeOut`, off the loop's
thread like every ledger call):

    round due, none in flight   -> TimeOut (one index read in the ledger when nothing is past)
    the reply names some        -> logged; the running deliveries are checked against the ledger
                                   at once (`Ended`), so that a timed-out one held here is stopped
                                   as a cancelled one is, and a claim looks again (with
                                   `--until-idle`, the next-ready check that may end the run)
    a storage error             -> made again at the next round
    stopping                    -> no more TimeOut

`--until-idle` waits for no deadline: it waits for what is running or due as ever, and an
execution it waits for times out at the round after its deadline.
"""

from __future__ import annotations

import logging
from typing import Optional

from .ledger_calls import Reply, TimeOut

log = logging.getLogger("yieldstar.supervisor")


class WorkflowTimeouts:
    """The dispatcher loop's steps for the workflow timeouts (see the module docstring); the state
    they use is `DispatchLoop`'s: `next_time_out` (monotonic s) and `timing_out` (a TimeOut in
    flight). The reply to its call is the loop's (`DispatchLoop.on_timed_out`), which hands it to
    `timed_out`."""

    def time_out(self, now: float) -> None:
        """Submit a TimeOut when a round is due and none is in flight."""
        if self.timing_out or self.grace_deadline is not None or now < self.next_time_out:
            return
        self.timing_out = True
        self.next_time_out = now + self.cfg.renew_ms / 1000
        self.calls.submit(TimeOut())

    def timed_out(self, reply: Reply, now: float) -> None:
        """The reply to a TimeOut: stop what it ended here, and claim again."""
        self.timing_out = False
        if reply.error is not None or not reply.value:
            return  # an error: the next round asks again
        for execution_id in reply.value:
            log.info("execution %s: failed as WorkflowTimedOut (not finished within its timeout)", execution_id,
                     extra={"event": "workflow_timed_out", "execution_id": execution_id, "outcome": "failed",
                            "error": {"type": "WorkflowTimedOut", "message": "not finished within its timeout"}})
        self.next_ended_check = min(self.next_ended_check, now)
        self.check_ended(now)  # `lease_keeping`: a timed-out delivery running here is stopped now
        self.claim_wanted = True

    def time_out_deadline(self) -> Optional[float]:
        """When the loop must wake for the next TimeOut, if any."""
        if self.timing_out or self.grace_deadline is not None:
            return None
        return self.next_time_out
