"""The app's schedules, admitted as their ticks come due: a part of the dispatcher loop
(`loop.DispatchLoop` mixes it in, and owns its state). SPEC section 12.

The supervisor learns its app's schedules from its workers (`Ready.schedules`), keeps those of
the workflows it serves, and asks the ledger to admit whatever tick is due, off the loop's thread
like every ledger call (`AdmitTicks`, made by the claims' ledger thread):

    first worker ready        -> schedules known: AdmitTicks at once (a new schedule is recorded;
                                 one whose ticks were missed while no supervisor ran gets its
                                 latest missed tick admitted)
    the reply                 -> sleep until the earliest next tick of them all, by the ledger's
                                 clock (the reply's `clock_ms`), then AdmitTicks again; a tick
                                 admitted wakes the claims, as any admit does
    a storage error           -> AdmitTicks again after a backoff: a delay, never a lost tick
                                 (the ledger admits the latest due one when it answers) nor a
                                 doubled one (the ledger's compare-and-set)
    stopping                  -> no more AdmitTicks

Every supervisor serving the workflow does this; the ledger admits each tick once among them
(`tables.schedules`). `--until-idle` waits for the first AdmitTicks' reply (a tick due at the
start is run) and never for a future tick.
"""

from __future__ import annotations

import logging
from typing import Optional

from .ledger.ticks import Schedule, tick_id
from .ledger_calls import AdmitTicks, Reply
from .pool import Child

log = logging.getLogger("yieldstar.supervisor")

# A tick's wake-up comes at least this long after a reply (s): a clock read between the ledger's
# `now` and the tick may round the wait to nothing.
TICK_WAIT_MIN_S = 0.005
# The longest the loop sleeps between AdmitTicks (s): a schedule another supervisor changed, or a
# clock that jumped, is looked at again at least this often.
TICK_WAIT_MAX_S = 60.0
TICK_BACKOFF_MIN_S = 0.05
TICK_BACKOFF_MAX_S = 2.0


class Scheduling:
    """The dispatcher loop's steps for the app's schedules (see the module docstring); the state
    they use is `DispatchLoop`'s: `schedules` (None until a worker is ready), `next_ticks_at`
    (monotonic s), `ticking` (an AdmitTicks in flight), `tick_failures`. The reply to its call is the
    loop's (`DispatchLoop.on_ticks_admitted`), which hands it to `ticks_admitted`."""

    def worker_schedules(self, child: Child, schedules: tuple[Schedule, ...], now: float) -> None:
        """A worker reported ready with its app's schedules: keep those of the workflows served
        (the first worker's; a later worker's differing ones are logged and taken: the app changed)."""
        served = self.workflows or frozenset()
        mine = tuple(s for s in schedules if s.workflow in served)
        if self.schedules == mine:
            return
        if self.schedules is not None:
            log.warning("worker pid %d declares the schedules %s, where the workers before it declared %s (was the app"
                        " changed on disk?); following the new ones", child.pid, _specs(mine), _specs(self.schedules),
                        extra={"event": "schedules_changed", "worker_pid": child.pid})
        elif mine:
            log.info("keeping %d schedule%s: %s", len(mine), "" if len(mine) == 1 else "s", _specs(mine),
                     extra={"event": "schedules_kept"})
        self.schedules = mine
        self.next_ticks_at = now

    def admit_ticks(self, now: float) -> None:
        """Submit an AdmitTicks when one is due and none is in flight."""
        if not self.schedules or self.ticking or self.grace_deadline is not None or now < self.next_ticks_at:
            return
        self.ticking = True
        self.calls.submit(AdmitTicks(self.schedules, timed=True))

    def ticks_admitted(self, reply: Reply, now: float) -> None:
        """The reply to an AdmitTicks (`DispatchLoop.on_ticks_admitted`): when to make the next."""
        self.ticking = False
        self.ticks_checked = True
        if reply.error is not None:
            self.tick_failures += 1
            self.next_ticks_at = now + min(TICK_BACKOFF_MAX_S, TICK_BACKOFF_MIN_S * 2 ** min(self.tick_failures - 1, 16))
            return
        self.tick_failures = 0
        upcoming = [record.next_tick for record in reply.value if record.next_tick is not None]
        for record in reply.value:
            if record.admitted:
                self.claim_wanted = True
                execution_id = tick_id(record.name, record.last_tick)
                log.info("schedule %s: admitted execution %s", record.name, execution_id,
                         extra={"event": "schedule_tick_admitted", "schedule": record.name,
                                "execution_id": execution_id})
        wait_s = TICK_WAIT_MAX_S
        if upcoming:
            wait_s = min(wait_s, max(TICK_WAIT_MIN_S, (min(upcoming) - reply.clock_ms) / 1000))
        self.next_ticks_at = now + wait_s

    def ticks_deadline(self) -> Optional[float]:
        """When the loop must wake for the next AdmitTicks, if any."""
        if not self.schedules or self.ticking or self.grace_deadline is not None:
            return None
        return self.next_ticks_at


def _specs(schedules) -> str:
    return ", ".join(f"{s.workflow} ({s.spec}{'' if s.timezone is None else ' ' + s.timezone})"
                     for s in schedules) or "none"
