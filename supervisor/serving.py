"""What a supervisor serves, and its row among the live supervisors: a part of the dispatcher
loop (`loop.DispatchLoop` mixes it in, and owns its state). SPEC section 11, routing.

The supervisor learns its workflows from its workers: each reports the names its app registers
when it is ready (`Ready.workflows`). The loop claims only those (`Claim.workflows`), waits only
for those (`NextReadyAt.workflows`, so `--until-idle` counts only its own), and keeps a row in
the ledger's live supervisors saying so:

    first worker ready      -> served = its workflows; RecordQueues: its app's queue limits and
                               default queues (SPEC section 12), before the first claim;
                               `began_serving`: Register, and Unpark: their parked executions are
                               due again (new code may replay them)
    another worker ready    -> served = what every ready worker registers (the intersection);
                               a change (the app was edited on disk) is logged, registered and
                               unparked
    each renewal round      -> Seen: one small statement; a row found gone -> Register again;
                               an Unpark that met a storage error -> made again
    clean exit              -> Deregister

Why the intersection: a delivery goes to whichever worker has a free slot, so the loop may claim
only what every worker can run. A worker whose app lacks a workflow that was claimed anyway
releases its delivery (`Retry`, "UnknownWorkflow"), never fails it.

The row is a hint for operators and for "is this served": a storage error on any of these calls
is logged once (`count_failures`) and the call is made again at the next round. It costs an
operator a moment of a wrong "not served", never a delivery.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from typing import Optional

from .ledger_calls import Deregister, RecordQueues, Register, Seen, Unpark
from .pool import Child

log = logging.getLogger("yieldstar.supervisor")


def new_supervisor_id() -> str:
    """`host:pid:random`, readable and unique for the run."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Serving:
    """The dispatcher loop's steps that decide what it serves and keep its row among the live
    supervisors (see the module docstring); the state they use is `DispatchLoop`'s:
    `workflows` (None until a worker is ready), `supervisor_id`, `registered`, `started_at_ms`.
    The replies to its calls are the loop's (`DispatchLoop.on_registered`, `on_seen`)."""

    def worker_serves(self, child: Child, workflows: tuple[str, ...], queues: tuple = (), defaults: tuple = (),
                      schedules: tuple = ()) -> None:
        """A worker reported ready with the workflows its app registers, its queues and schedules."""
        child.workflows = frozenset(workflows)
        if self.queues is None:
            # The first ready worker's app: its queues' limits and the workflows' default queues
            # are recorded before the first claim (the calls are made in order), and the
            # schedules of its workflows that it no longer schedules are forgotten.
            unscheduled = tuple(sorted(set(workflows) - {schedule.workflow for schedule in schedules}))
            self.queues = RecordQueues(tuple(queues), tuple(defaults), unscheduled)
            self.record_queues()
        reports = [c.workflows for c in self.pool.children if c.ready and c.workflows is not None]
        served = frozenset.intersection(*reports)
        if self.workflows is None:
            self.workflows = served
            if served:
                log.info("serving %d workflow%s: %s", len(served), "" if len(served) == 1 else "s",
                         ", ".join(sorted(served)), extra={"event": "serving", "workflows": sorted(served)})
            else:
                log.warning("the app registers no workflow: nothing will be claimed",
                            extra={"event": "serving", "workflows": []})
            self.began_serving(served)
            return
        if served == self.workflows:
            return
        if child.workflows != self.workflows:
            log.warning("worker pid %d registers %s, where the workers before it registered %s (was the app changed"
                        " on disk?); claiming only what every worker runs: %s", child.pid, _names(child.workflows),
                        _names(self.workflows), _names(served),
                        extra={"event": "workflows_changed", "worker_pid": child.pid, "workflows": sorted(served)})
        else:
            log.info("every worker now registers %s: claiming them", _names(served),
                     extra={"event": "workflows_changed", "workflows": sorted(served)})
        self.workflows = served
        self.register()
        self.unpark()

    def began_serving(self, workflows: frozenset[str]) -> None:
        """The workflows this supervisor serves are known (its first worker is ready): record it
        among the live supervisors, and make the parked executions of these workflows due again
        (SPEC section 11: "a parked execution is tried again when a supervisor that serves its
        workflow starts"); one whose replay still diverges is parked again, at the cost of one
        delivery."""
        self.register()
        self.unpark()

    def unpark(self) -> None:
        """Submit the unparking of the served workflows' parked executions (again), with the
        claims: before the first claim of these workflows, and `--until-idle` does not call the
        supervisor idle before its reply (`unparking`)."""
        self.unpark_pending = False
        if self.workflows:
            self.unparking = True
            self.calls.submit(Unpark(self.workflows))

    def record_queues(self) -> None:
        """Submit the recording of the app's queues (again)."""
        self.queues_pending = False
        if self.queues is not None and (self.queues.queues or self.queues.defaults or self.queues.unscheduled):
            self.calls.submit(self.queues)

    def register(self) -> None:
        """Submit this supervisor's registration (again)."""
        cfg = self.cfg
        row = (("host", socket.gethostname()), ("pid", os.getpid()), ("workflows", tuple(sorted(self.workflows))),
               ("concurrency", cfg.concurrency), ("workers", cfg.processes), ("renew_ms", cfg.renew_ms),
               ("started_at", self.started_at_ms))
        self.registered, self.registering = False, True
        self.renewals.submit(Register(self.supervisor_id, row))

    def refresh_registration(self) -> None:
        """At each renewal round: say this supervisor is still running (or register it, when its
        registration has not succeeded yet)."""
        if self.workflows is None or self.grace_deadline is not None:
            return
        if self.unpark_pending:
            self.unpark()
        if self.queues_pending:
            self.record_queues()
        if self.registering:
            return
        if self.registered:
            self.registering = True
            self.renewals.submit(Seen(self.supervisor_id))
        else:
            self.register()

    def deregister(self) -> None:
        """A clean exit: the row goes (after the calls already submitted)."""
        if self.workflows is not None:
            self.renewals.submit(Deregister(self.supervisor_id))


def _names(workflows: Optional[frozenset[str]]) -> str:
    return "[" + ", ".join(sorted(workflows or ())) + "]"
