"""The dispatcher loop: the supervisor's only thread that touches delivery state.

Each turn of the loop is a few named steps — check for a stop, take the ledger's replies, admit
due ticks of the app's schedules, fail what is past its workflow timeout, claim, renew, beat,
settle — and one `wait()` on everything that can need attention: each child's pipe
and process sentinel, the nudge socket, the stop-signal wake-up and the wake-ups of the two
ledger threads (`ledger_calls`). No step waits for the database: a call is submitted, and its
reply is handled on a later turn, so a held write lock or a full disk delays claims and
acknowledgements and never a heartbeat. (On SQLite the calls are made on the spot, on a
connection of the loop's own, when that cannot wait: the write lock is free, and the commit
syncs nothing; otherwise the thread makes them. See `ledger_calls`.) Every step takes the time
as an argument.

A delivery's life: claimed (a `Claim`'s reply) -> handed to an idle ready child (`Run`; a child
found dead gets nothing, and the lease is released at once) -> renewed while its child answers
-> the child's `Done` -> acknowledged or released (retried after a backoff while the database
fails, renewed meanwhile) -> settled. A renewal that finds the lease lost kills the child: it
may be inside a step calling the outside world, and a stale delivery must not hold a slot. So
does a lease that no renewal has confirmed for a whole lease length (the database cut off or
not answering): another supervisor may hold the execution by then, and the child must not go
on running its steps beside the new holder's.

With `--workers`, a child holds up to `slots` deliveries (`Child.deliveries`, by execution and
token), and the loop claims for free slots, never more than `concurrency` in flight in all:

    claimed -> Run to the worker with a free slot, in turn -> renewed while the worker answers
      -> Done(execution, token) -> acknowledged or released -> settled
    lease lost / cancelled -> Stop(execution, token) to its worker alone -> its Done (LeaseLost)
      `- no Done within the heartbeat tolerance -> worker killed and replaced, its others released
    lease unconfirmed for a lease length -> Stop, and the lease released once it has stopped
    worker dead, killed, frozen -> replaced (confirmed gone), every delivery it held released

A released delivery is delivered again at once, its recorded steps replayed; a release is fenced
like any write, so one whose lease is already lost is refused and counted lost.
"""

from __future__ import annotations

import logging
import selectors
import time
from typing import Callable, Optional

from worker._runtime.protocol import Run

from .delivery_metrics import DeliveryMetrics
from .lease_keeping import ENDED_IN_LEDGER, LOST_LINE, RENEWAL_FOUND_LOST, STOP_LINE, LeaseKeeping
from .ledger.contract import DueListener
from .ledger.errors import TRANSIENT_KINDS, LedgerUnusable, StorageError
from .ledger.values import LeaseLost, Renewed, Retry, Suspended
from .ledger_calls import (Acknowledge, AdmitTicks, Call, Claim, Deregister, Ended, LedgerCalls, NextReadyAt,
                           RecordQueues, Register, Release, Renew, Reply, Seen, TimeOut, Unpark, Wakeup)
from .log_format import delivery_error, error_text
from .pool import Child, Delivery, Pool
from .scheduling import Scheduling
from .serving import Serving, new_supervisor_id
from .timeouts import WorkflowTimeouts
from .worker_watch import ORPHAN_CHECK_S, RELEASE_LINE, WorkerWatch

__all__ = ["DispatchLoop", "ON_REPLY", "EXIT_STOPPED", "EXIT_KILLED", "EXIT_LEDGER_UNUSABLE",
           # the log lines: `chaos.evidence`
           "LOST_LINE", "RENEWAL_FOUND_LOST", "ENDED_IN_LEDGER", "STOP_LINE", "RELEASE_LINE"]

log = logging.getLogger("yieldstar.supervisor")

EXIT_STOPPED = 0
EXIT_KILLED = 1  # a second stop request: children killed, leases left to expire
EXIT_LEDGER_UNUSABLE = 5  # the ledger file is corrupt, gone, foreign or no longer ours

# After a storage error, a call is made again after this backoff, doubling up to the maximum.
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 2.0
# How often the loop checks that the ledger's files are still the ones it opened.
FILE_CHECK_S = 1.0


class DispatchLoop(LeaseKeeping, WorkerWatch, Serving, Scheduling, WorkflowTimeouts):
    """The dispatcher loop's state and its steps. Every step takes the time (`now`, monotonic
    seconds) as an argument and none blocks: waiting happens in `wait` alone. The steps that keep
    leases are in `lease_keeping`, those that watch the worker processes in `worker_watch`, those
    that decide which workflows it serves and keep its row among the live supervisors in
    `serving`, those that admit the app's schedules' ticks in `scheduling`, those that fail the
    executions past their workflow timeout in `timeouts`."""

    def __init__(self, config, stats, pool: Pool, calls: LedgerCalls, renewals: LedgerCalls, *,
                 signals: Wakeup, stop_requests: Callable[[], int],
                 nudges: Optional[DueListener] = None, until_idle: bool = False,
                 on_delivery: Optional[Callable[[str, int, str, int], None]] = None,
                 metrics: Optional[DeliveryMetrics] = None):
        """
        Args:
            config: the `SupervisorConfig`.
            stats: the `Stats` the loop counts into.
            calls, renewals: the ledger threads (claims and settlements; renewals). The loop
                also asks `calls.backend` once a second whether the ledger's files are still
                the ones it opened (`check_files`).
            signals: woken by the stop-signal handler; `stop_requests()` says how many came.
            on_delivery: called after each delivery with (execution_id, token, outcome, ms).
            metrics: told of each claim, step report, delivery's end and storage error
                (`supervise --metrics`); None: nobody is.
        """
        self.cfg = config
        self.stats = stats
        self.pool = pool
        self.calls = calls
        self.renewals = renewals
        self.nudges = nudges
        self.until_idle = until_idle
        self.signals = signals
        self.stop_requests = stop_requests
        self.on_delivery = on_delivery
        self.metrics = metrics or DeliveryMetrics()
        self.fatal: Optional[StorageError] = None
        self.failing: dict[type[Call], int] = {}  # storage errors in a row, by kind of call
        now = time.monotonic()
        self.claim_wanted = True  # something may have become claimable: claim as soon as a child is free
        self.claiming = 0  # claims in flight
        self.promised = 0  # idle workers the claims in flight are for
        self.checking_ended = False  # an `ended` call is in flight
        self.next_ended_check = now
        self.next_poll = now
        self.claim_failures = 0
        self.next_beat = now
        self.next_renewal = now + self.cfg.renew_ms / 1000
        self.next_file_check = now + FILE_CHECK_S
        self.next_top_up = now
        self.next_orphan_check = now + ORPHAN_CHECK_S
        self.topping_up = False  # the last top_up stopped at its time budget: more to start at once
        self.last_beat_at: Optional[float] = None
        self.grace_deadline: Optional[float] = None
        self.settle_deadline: Optional[float] = None  # after the grace period: how long releases may take
        self.ending: dict[tuple[str, int], Delivery] = {}  # replied to by their child, not yet settled
        self.start_deaths = 0  # children that died while loading the app, in a row
        self.ever_ready = False
        self.all_up = False  # every worker of the pool was up once (and it was logged)
        self.idle_checked = False  # until_idle: nothing runs anywhere and nothing is due
        # Workers of several deliveries each (`--workers`): one delivery is stopped with a message,
        # and a worker killed or dead costs its deliveries a release. Else one per process: a
        # worker is killed to stop its delivery, and a dead one's lease is left to expire.
        self.shared = pool.slots > 1
        # The earliest `held_until` of the deliveries running (a lower bound, kept as claims come),
        # so that `stop_unconfirmed` and `deadline` need not look at every delivery on every turn:
        # shared workers hold thousands.
        self.next_unconfirmed = float("inf")
        self._selector: Optional[selectors.BaseSelector] = None  # see `selector`
        self._watched: list[Child] = []  # the children it watches
        # Routing (`serving`): the workflows it claims, None until a worker reported them, and
        # its row among the live supervisors.
        self.workflows: Optional[frozenset[str]] = None
        self.supervisor_id = new_supervisor_id()
        self.registered = False  # its registration succeeded (and was not found gone since)
        self.registering = False  # a Register or Seen is in flight
        self.unpark_pending = False  # an Unpark met a storage error: made again at the next round
        self.unparking = False  # an Unpark is in flight
        self.queues: Optional[RecordQueues] = None  # the app's queues, from its first ready worker
        self.queues_pending = False  # recording them met a storage error: made again at the next round
        self.started_at_ms: Optional[int] = None  # the ledger's time of its first registration
        # Schedules (`scheduling`): those of the served workflows, None until a worker reported them.
        self.schedules: Optional[tuple] = None
        self.next_ticks_at = now  # monotonic s: when to ask the ledger to admit due ticks
        self.ticking = False  # an AdmitTicks is in flight
        self.ticks_checked = False  # an AdmitTicks was answered (until_idle waits for the first)
        self.tick_failures = 0
        self.blocked_polls = 0  # claims in a row that found nothing though something was due
        # Workflow timeouts (`timeouts`): the first TimeOut at once, then one a renewal round.
        self.next_time_out = now
        self.timing_out = False  # a TimeOut is in flight

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> int:
        try:
            return self._run()
        finally:
            if self._selector is not None:
                self._selector.close()

    def _run(self) -> int:
        while True:
            now = time.monotonic()
            code = self.check_stop(now)
            if code is not None:
                return code
            self.take_replies(now)
            self.check_files(now)
            if self.fatal is not None:
                log.error("stopping: %s", self.fatal, extra={"event": "ledger_unusable"})
                return EXIT_LEDGER_UNUSABLE
            if self.idle_checked:
                log.info("idle: nothing running and nothing due", extra={"event": "supervisor_idle"})
                return EXIT_STOPPED
            self.stop_unconfirmed(now)
            self.admit_ticks(now)
            self.time_out(now)
            self.claim(now)
            self.renew(now)
            self.beat(now)
            self.settle_due(now)
            self.top_up(now)
            self.wait(self.deadline(now))

    # -- stop ------------------------------------------------------------------------------------

    def check_stop(self, now: float) -> Optional[int]:
        """The exit code once the loop should end, else None."""
        requests = self.stop_requests()
        if requests > 1:
            log.warning("second stop request: killing %d running deliveries", self.running(),
                        extra={"event": "supervisor_killing", "running": self.running()})
            return EXIT_KILLED
        if requests and self.grace_deadline is None:
            self.grace_deadline = now + self.cfg.grace_ms / 1000
            # Acknowledgements and releases wait on the database like any call; waiting for them
            # is bounded by a lease past the grace period, after which they are moot (the leases
            # expired).
            self.settle_deadline = self.grace_deadline + max(self.cfg.lease_ms / 1000, 1.0)
            log.info("stopping: no new claims; %d deliveries have %d ms to finish", self.running(), self.cfg.grace_ms,
                     extra={"event": "supervisor_stopping", "running": self.running(), "grace_ms": self.cfg.grace_ms})
        if self.grace_deadline is None:
            return None
        if now >= self.grace_deadline and self.pool.busy():
            self.release_unfinished(now)
        if not self.pool.busy() and not self.ending and self.claiming == 0:
            return EXIT_STOPPED
        if self.settle_deadline is not None and now >= self.settle_deadline:
            log.warning("stopping with %d deliveries not yet settled: the database is not answering;"
                        " their leases are left to expire", len(self.ending),
                        extra={"event": "settling_abandoned", "unsettled": len(self.ending)})
            return EXIT_STOPPED
        return None

    def release_unfinished(self, now: float) -> None:
        """Grace is over: make sure the children still running are gone, then release their leases."""
        for child in self.pool.busy():
            deliveries = list(child.deliveries.values())
            self.pool.remove(child)  # killed and joined: it can write nothing more
            for delivery in deliveries:
                log.info("execution %s token %d: grace period over; releasing it", delivery.lease.execution_id,
                         delivery.lease.token, extra={"event": "grace_over", **delivery.log_fields})
                self.end(delivery, Retry("the supervisor stopped"), now)

    # -- ledger replies ----------------------------------------------------------------------

    def take_replies(self, now: float) -> None:
        for reply in self.calls.replies() + self.renewals.replies():
            self.count_failures(reply)
            ON_REPLY[type(reply.call)](self, reply, now)

    def count_failures(self, reply: Reply) -> None:
        """Log the first storage error of a run of them, and the call that ends the run: a disk
        that stays full for a minute is two lines per kind of call, not thousands."""
        kind, error = type(reply.call), reply.error
        failing = self.failing.get(kind, 0)
        if error is None:
            if failing:
                log.warning("%s succeeded again after %d failed attempts", kind.name, failing,
                            extra={"event": "storage_recovered", "call": kind.name, "attempts": failing})
                del self.failing[kind]
            return
        self.stats.storage_errors += 1
        self.metrics.storage_error(kind.name)
        self.failing[kind] = failing + 1
        if not error.transient:
            self.fatal = self.fatal or error
        elif not failing:
            log.warning("%s failed, will retry: %s", kind.name, error,
                        extra={"event": "storage_error", "call": kind.name, "storage_error": error.kind})

    # -- claims ------------------------------------------------------------------------------

    def claim(self, now: float) -> None:
        """Claim for the idle workers that no claim in flight is for. A claim may be sent while
        another is in flight: a worker freed meanwhile need not wait for it, and its claim goes
        out with the acknowledgement that freed it, in one transaction (see `wait`)."""
        # No worker is ready before its report said what it serves (`serving`): `workflows` is
        # set by the time there is a free slot to claim for.
        if self.grace_deadline is not None:
            return
        if not (self.claim_wanted or now >= self.next_poll):
            return
        wanted = self.free_slots(now) - self.promised
        if wanted <= 0:
            return
        self.claim_wanted = False
        self.claiming += 1
        self.promised += wanted
        self.next_poll = now + self.cfg.poll_ms / 1000
        self.calls.submit(Claim(wanted, self.cfg.lease_ms, about=now, workflows=self.workflows))

    def on_claimed(self, reply: Reply, now: float) -> None:
        limit, sent_at = reply.call.limit, reply.call.about
        self.claiming -= 1
        self.promised -= limit
        if reply.error is not None:
            self.claim_failures += 1
            self.next_poll = now + _backoff(self.claim_failures, self.cfg.poll_ms / 1000)
            return
        self.claim_failures = 0
        claimed = reply.value
        self.stats.claimed += len(claimed)
        if claimed:
            self.blocked_polls = 0
        idle = self.takers(now, len(claimed)) if self.grace_deadline is None else []
        if claimed:
            self.next_unconfirmed = min(self.next_unconfirmed, sent_at + self.cfg.lease_ms / 1000)
        for each in claimed:
            lease = each.lease
            delivery = Delivery(lease, claimed_at=lease.expires_at - self.cfg.lease_ms, workflow=each.workflow,
                                held_until=sent_at + self.cfg.lease_ms / 1000, queue=each.queue or "", since=now)
            self.metrics.claimed(delivery, each.due_at)
            child = idle.pop(0) if idle else None
            start = None if each.input_json is None else (each.workflow, each.input_json)
            if child is not None and self.hand_over(child, delivery, now, start, each.trace_context):
                continue
            # No child for it (one died, or the supervisor is stopping): give it back at once
            # instead of letting the execution wait out a whole lease.
            self.end(delivery, Retry("no worker could take it"), now)
        # A full batch means more may be waiting: claim again as soon as a child is free (as
        # after a nudge or a finished delivery that came while this claim was in flight).
        self.claim_wanted = self.claim_wanted or len(claimed) == limit
        if not claimed and self.claiming == 0 and (self.pool.idle() or self.until_idle):
            self.calls.submit(NextReadyAt(timed=True, workflows=self.workflows))

    def idle(self, now: float) -> list[Child]:
        """The workers with a free slot that may take a delivery: heard from within two
        heartbeats (each answers every beat), so that one frozen moments ago, not yet found
        silent, gets none."""
        recent = 2 * self.cfg.heartbeat_ms / 1000
        return [c for c in self.pool.idle() if now - c.last_answer <= recent]

    def free_slots(self, now: float) -> int:
        """How many deliveries the workers may take now: a free slot each, and no more than
        `concurrency` running in all (P workers of ceil(N / P) slots may hold more than N)."""
        room = self.cfg.concurrency - self.running()
        return max(0, min(room, sum(c.free for c in self.idle(now))))

    def takers(self, now: float, count: int) -> list[Child]:
        """Up to `count` workers to hand claimed deliveries to, one entry per free slot, taken in
        turn from each worker so that the deliveries spread over the workers."""
        idle = self.idle(now)
        count = min(count, self.free_slots(now))
        out: list[Child] = []
        turn = 0
        while len(out) < count and idle:
            idle = [c for c in idle if c.free > turn]
            out += idle[:count - len(out)]
            turn += 1
        return out

    def running(self) -> int:
        """Deliveries handed to a worker and not yet reported done by it."""
        return sum(len(c.deliveries) for c in self.pool.children)

    def hand_over(self, child: Child, delivery: Delivery, now: float,
                  start: Optional[tuple[str, str]] = None, trace_context: Optional[str] = None) -> bool:
        """Send the delivery to `child`; `start`: (workflow, input) of a first delivery, which the
        child then need not read from the ledger; `trace_context`: its start's (see `Claimed`)."""
        lease = delivery.lease
        if child.slots > 1 and not any(c is child for c in self.pool.children):
            # Listed once per free slot (`takers`): replaced while this claim's deliveries were
            # being handed out.
            return False
        child.take(delivery)
        if child.send(Run(lease, delivery.claimed_at, start, trace_context)):
            return True
        log.warning("worker pid %d was gone when handed execution %s; replacing it", child.pid, lease.execution_id,
                    extra={"event": "worker_died", "worker_pid": child.pid, **delivery.log_fields})
        child.drop(delivery)
        self.stats.child_deaths += 1
        self.replace_and_release(child, f"worker pid {child.pid} was gone", now)  # its others, if any
        return False

    def on_next_ready_at(self, reply: Reply, now: float) -> None:
        """When the next execution becomes claimable (a timer, a backoff, an expiry), so that an
        idle supervisor wakes for it instead of waiting for its next poll."""
        if reply.error is not None:
            return
        ready = reply.value
        if ready is not None:
            # The ledger's time comes with the reply: this thread never reads it (on PostgreSQL
            # that is a round trip, which could block every heartbeat behind a lost server).
            wait_s = max(0.005, (ready - reply.clock_ms) / 1000)
            if ready <= reply.clock_ms:
                # Due, yet the claim before found nothing: held back by its queue's limit (SPEC
                # section 12) or by another claimer's row locks, or it became due just after
                # that claim. Try again soon, then less and less often, up to the poll interval:
                # a saturated queue's backlog must not make an idle supervisor spin.
                self.blocked_polls += 1
                wait_s = min(self.cfg.poll_ms / 1000, 0.005 * 2 ** min(self.blocked_polls - 1, 16))
            self.next_poll = min(self.next_poll, now + wait_s)
        elif (self.until_idle and not self.pool.busy() and not self.ending and self.claiming == 0
              and not self.unparking and not self.unpark_pending and not self.ticking
              and (not self.schedules or self.ticks_checked)):
            # A schedule's next tick is not waited for: `--until-idle` runs what is due now.
            self.idle_checked = True

    # -- what renewals and `Ended` found (acted on in `lease_keeping`) ------------------------

    def on_renewed(self, reply: Reply, now: float) -> None:
        deliveries: list[Delivery] = reply.call.about
        for delivery in deliveries:
            delivery.renewing = False
        if reply.error is not None:
            return  # the leases have slack for the next round
        for delivery, renewal in zip(deliveries, reply.value, strict=True):
            if isinstance(renewal, Renewed):
                delivery.lease = renewal.lease
                # The ledger set the new expiry after the call was sent: it lasts at least this long.
                delivery.held_until = max(delivery.held_until, delivery.renew_sent_at + self.cfg.lease_ms / 1000)
            elif isinstance(renewal, LeaseLost):
                self.lose(delivery, RENEWAL_FOUND_LOST, now)
            # else a row another transaction held (StorageBusy): the lease has slack for the next round

    def on_ended(self, reply: Reply, now: float) -> None:
        self.checking_ended = False
        if reply.error is not None:
            return  # renewals still find lost leases; the next heartbeat asks again
        ended = {(lease.execution_id, lease.token) for lease in reply.value}
        for delivery in reply.call.about:
            if (delivery.lease.execution_id, delivery.lease.token) in ended:
                self.lose(delivery, ENDED_IN_LEDGER, now)

    # -- this supervisor among the live ones (the calls are made in `serving`) ----------------

    def on_registered(self, reply: Reply, now: float) -> None:
        self.registering = False
        if reply.error is None:
            self.registered = True
            self.started_at_ms = reply.value.started_at

    def on_seen(self, reply: Reply, now: float) -> None:
        self.registering = False
        if reply.error is None and reply.value is False:
            log.info("this supervisor's registration was gone (not seen for three renewal intervals): registering"
                     " again", extra={"event": "registration_lost", "supervisor_id": self.supervisor_id})
            self.registered = False

    def on_unparked(self, reply: Reply, now: float) -> None:
        self.unparking = False
        if reply.error is not None:
            self.unpark_pending = True
        elif reply.value:
            self.claim_wanted = True
            log.info("unparked %d execution%s: parked when their replay diverged under earlier code, due again for"
                     " this code to replay", reply.value, "" if reply.value == 1 else "s",
                     extra={"event": "executions_unparked", "count": reply.value})

    def on_ticks_admitted(self, reply: Reply, now: float) -> None:
        self.ticks_admitted(reply, now)  # `scheduling`

    def on_timed_out(self, reply: Reply, now: float) -> None:
        self.timed_out(reply, now)  # `timeouts`

    def on_queues_recorded(self, reply: Reply, now: float) -> None:
        if reply.error is not None:
            self.queues_pending = True  # made again at the next renewal round
        elif reply.value:
            log.info("recorded the limits of %d queue%s", reply.value, "" if reply.value == 1 else "s",
                     extra={"event": "queues_recorded", "count": reply.value})

    def on_deregistered(self, reply: Reply, now: float) -> None:
        pass  # made as the supervisor exits: nobody waits for it

    # -- outcomes ------------------------------------------------------------------------------

    def end(self, delivery: Delivery, outcome, now: float) -> None:
        """A delivery's child is done with it: acknowledge its outcome, or release it."""
        delivery.outcome = outcome
        if isinstance(outcome, Retry) and outcome.storage_error not in (None, *TRANSIENT_KINDS):
            self.fatal = self.fatal or LedgerUnusable(outcome.reason)
        if isinstance(outcome, LeaseLost):
            self.stats.lost += 1
            self.settled(delivery, "lost", now)
            return
        self.ending[(delivery.lease.execution_id, delivery.lease.token)] = delivery
        self.submit_settle(delivery)

    def submit_settle(self, delivery: Delivery) -> None:
        delivery.retry_at = float("inf")  # in flight
        if isinstance(delivery.outcome, Retry):
            self.calls.submit(Release(delivery.lease, about=delivery))
        else:
            self.calls.submit(Acknowledge(delivery.lease, delivery.outcome, about=delivery))

    def settle_due(self, now: float) -> None:
        """Try again the acknowledgements and releases that a storage error held up."""
        for delivery in self.ending.values():
            if delivery.retry_at <= now:
                self.submit_settle(delivery)

    def on_settled(self, reply: Reply, now: float) -> None:
        delivery: Delivery = reply.call.about
        if reply.error is not None:
            delivery.failures += 1
            delivery.retry_at = now + _backoff(delivery.failures, BACKOFF_MIN_S)
            return
        del self.ending[(delivery.lease.execution_id, delivery.lease.token)]
        outcome = delivery.outcome
        if isinstance(reply.value, LeaseLost):
            self.stats.lost += 1
            status = "lost"
        elif isinstance(outcome, Retry):
            self.stats.released += 1
            status = "released"
            reason = outcome.reason.strip()
            log.info("execution %s token %d asked to retry: %s", delivery.lease.execution_id, delivery.lease.token,
                     reason.splitlines()[-1] if reason else "",
                     extra={"event": "delivery_retry", "reason": reason, **delivery.log_fields})
        else:
            setattr(self.stats, outcome.status, getattr(self.stats, outcome.status) + 1)
            status = outcome.status
            if isinstance(outcome, Suspended) and outcome.diverged is not None:
                log.warning("execution %s token %d diverged from its recorded steps and is parked: %s",
                            delivery.lease.execution_id, delivery.lease.token, outcome.diverged,
                            extra={"event": "replay_diverged", "detail": outcome.diverged, **delivery.log_fields})
        self.settled(delivery, status, now)
        self.claim_wanted = True

    def settled(self, delivery: Delivery, status: str, now: float) -> None:
        lease = delivery.lease
        self.metrics.ended(delivery, status, now)
        # A failed delivery's line says why: its error's type and message (`log_format`); as JSON,
        # so does a delivery suspended to retry a failed step.
        error = delivery_error(delivery.outcome)
        log.info("delivery execution=%s token=%d outcome=%s duration_ms=%d%s", lease.execution_id, lease.token,
                 status, delivery.ms, f" error={error_text(error)}" if error and status == "failed" else "",
                 extra={"event": "delivery_ended", **delivery.log_fields, "outcome": status,
                        "duration_ms": delivery.ms, "error": error})
        if self.on_delivery is not None:
            self.on_delivery(lease.execution_id, lease.token, status, delivery.ms)

    # -- the files -----------------------------------------------------------------------------

    def check_files(self, now: float) -> None:
        """The ledger's files must still be the ones this supervisor opened: a ledger, -wal or -shm
        deleted or replaced under it would take every write of its workers where no other process
        reads, and another supervisor would run their executions again. Also while idle (the
        check's time is among `deadline`'s). The backend only looks at its files here (nothing on
        a database server): no lock, no database call, so the loop never waits for it."""
        if now < self.next_file_check:
            return
        self.next_file_check = now + FILE_CHECK_S
        try:
            self.calls.backend.check_files()
        except LedgerUnusable as exc:
            self.fatal = self.fatal or exc

    # -- waiting ---------------------------------------------------------------------------------

    def deadline(self, now: float) -> float:
        deadlines = [self.next_beat, self.next_file_check]
        if self.topping_up:
            deadlines.append(self.next_top_up)
        if self.grace_deadline is None and self.free_slots(now) > self.promised:
            deadlines.append(self.next_poll)
        elif self.grace_deadline is not None:
            # Once the grace period is over, only the settlements' replies (or their deadline)
            # are worth waking for.
            deadlines += [self.grace_deadline if self.grace_deadline > now else self.settle_deadline]
        held = [self.next_unconfirmed] if self.running() else []
        if held or self.ending:
            deadlines.append(self.next_renewal)
        deadlines += held
        deadlines += [d.retry_at for d in self.ending.values()]
        for step in (self.ticks_deadline(), self.time_out_deadline()):
            if step is not None:
                deadlines.append(step)
        return min(deadlines)

    def wait(self, deadline: float) -> None:
        # What this turn decided goes to the ledger thread together: a finished child's
        # acknowledgement and the claim for the slot it freed can then share one commit.
        self.calls.flush()
        # Calls made on the spot have their replies already: take them on the next turn.
        timeout = 0.0 if self.calls.has_replies() else max(0.0, deadline - time.monotonic())
        for key, _ in self.selector().select(timeout):
            now = time.monotonic()
            ready, child = key.fileobj, key.data
            if ready is self.nudges:
                self.nudges.drain()
                self.claim_wanted = True
                continue
            if ready is self.signals:
                self.signals.drain()
                continue
            if child is None:
                ready.drain()  # a ledger thread's replies: they are taken at the top of the loop
                continue
            # The owner is the child registered with the descriptor: a sentinel is a plain fd
            # number, and the child that replaced a dead one earlier in this round may have been
            # given the same one.
            if not any(c is child for c in self.pool.children):
                continue  # replaced earlier in this round
            if ready is child.conn:
                self.receive(child, now)
            else:
                self.child_died(child)

    def selector(self) -> selectors.BaseSelector:
        """The one selector `wait` waits on: the ledger threads' wake-ups, the stop signals, the
        nudges, and each child's pipe and process sentinel (its death shows on both: end of file
        on the pipe, the sentinel readable). Made again only when the children have changed
        (one started, replaced or removed), not on every turn: registering a dozen descriptors
        cost more than the rest of a turn."""
        children = list(self.pool.children)
        if self._selector is not None and len(children) == len(self._watched) and all(
                a is b for a, b in zip(children, self._watched)):
            return self._selector
        if self._selector is not None:
            self._selector.close()
        self._selector, self._watched = selectors.DefaultSelector(), children
        for waitable in (self.calls, self.renewals, self.signals, self.nudges):
            if waitable is not None:
                self._selector.register(waitable, selectors.EVENT_READ)
        for child in children:
            self._selector.register(child.conn, selectors.EVENT_READ, child)
            if child.process.sentinel is not None:
                self._selector.register(child.process.sentinel, selectors.EVENT_READ, child)
        return self._selector


# The handler of each kind of call's reply, by the call's type: a handler renamed or gone fails
# here, at import, not when its first reply comes (and a test checks that every call has one).
ON_REPLY: dict[type[Call], Callable[[DispatchLoop, Reply, float], None]] = {
    Claim: DispatchLoop.on_claimed,
    NextReadyAt: DispatchLoop.on_next_ready_at,
    Renew: DispatchLoop.on_renewed,
    Ended: DispatchLoop.on_ended,
    Acknowledge: DispatchLoop.on_settled,
    Release: DispatchLoop.on_settled,
    Register: DispatchLoop.on_registered,
    Seen: DispatchLoop.on_seen,
    Deregister: DispatchLoop.on_deregistered,
    Unpark: DispatchLoop.on_unparked,
    AdmitTicks: DispatchLoop.on_ticks_admitted,
    RecordQueues: DispatchLoop.on_queues_recorded,
    TimeOut: DispatchLoop.on_timed_out,
}


def _backoff(failures: int, first_s: float) -> float:
    return min(BACKOFF_MAX_S, first_s * 2 ** min(failures - 1, 16))
