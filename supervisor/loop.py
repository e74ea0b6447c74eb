"""The dispatcher loop: the supervisor's only thread that touches delivery state.

Each turn of the loop is a few named steps — check for a stop, take the ledger's replies, claim,
renew, beat, settle — and one `wait()` on everything that can need attention: each child's pipe
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

from worker._runtime.protocol import AppNotLoaded, Alive, Beat, Done, FromChild, LedgerNotOpened, Ready, Run, Stop

from .ledger.errors import TRANSIENT_KINDS, AppLoadFailed, DiedWhileStarting, LedgerUnusable, StorageError
from .ledger.contract import DueListener
from .ledger.values import LeaseLost, Renewed, Retry
from .ledger_calls import Acknowledge, Call, Claim, Ended, LedgerCalls, NextReadyAt, Release, Renew, Reply, Wakeup
from .pool import START_ATTEMPTS, Child, Delivery, Pool, describe_exit

log = logging.getLogger("yieldstar.supervisor")

EXIT_STOPPED = 0
EXIT_KILLED = 1  # a second stop request: children killed, leases left to expire
EXIT_LEDGER_UNUSABLE = 5  # the ledger file is corrupt, gone, foreign or no longer ours

# After a storage error, a call is made again after this backoff, doubling up to the maximum.
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 2.0
# How often the loop checks that the ledger's files are still the ones it opened.
FILE_CHECK_S = 1.0
# After a child could not be started (fork failed): when to try again.
TOP_UP_RETRY_S = 1.0


# What the log says when a delivery is lost (the chaos checker counts these lines: `chaos.evidence`).
LOST_LINE = "execution %s token %d: %s; killing worker pid %d so that it stops at once"
RENEWAL_FOUND_LOST = "the lease is lost"
# The same, in a worker of several deliveries: that one is told to stop, the others run on.
STOP_LINE = "execution %s token %d: %s; telling worker pid %d to stop it"
RELEASE_LINE = "execution %s token %d: %s; releasing it"  # its worker replaced (`replace_and_release`)

class DispatchLoop:
    """The dispatcher loop's state and its steps. Every step takes the time (`now`, monotonic
    seconds) as an argument and none blocks: waiting happens in `wait` alone."""

    def __init__(self, config, stats, pool: Pool, calls: LedgerCalls, renewals: LedgerCalls, *,
                 signals: Wakeup, stop_requests: Callable[[], int],
                 nudges: Optional[DueListener] = None, until_idle: bool = False,
                 on_delivery: Optional[Callable[[str, int, str, int], None]] = None):
        """
        Args:
            config: the `SupervisorConfig`.
            stats: the `Stats` the loop counts into.
            calls, renewals: the ledger threads (claims and settlements; renewals). The loop
                also asks `calls.backend` once a second whether the ledger's files are still
                the ones it opened (`check_files`).
            signals: woken by the stop-signal handler; `stop_requests()` says how many came.
            on_delivery: called after each delivery with (execution_id, token, outcome, ms).
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
        self.last_beat_at: Optional[float] = None
        self.grace_deadline: Optional[float] = None
        self.settle_deadline: Optional[float] = None  # after the grace period: how long releases may take
        self.ending: dict[tuple[str, int], Delivery] = {}  # replied to by their child, not yet settled
        self.start_deaths = 0  # children that died while loading the app, in a row
        self.ever_ready = False
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
                log.error("stopping: %s", self.fatal)
                return EXIT_LEDGER_UNUSABLE
            if self.idle_checked:
                log.info("idle: nothing running and nothing due")
                return EXIT_STOPPED
            self.stop_unconfirmed(now)
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
            log.warning("second stop request: killing %d running deliveries", self.running())
            return EXIT_KILLED
        if requests and self.grace_deadline is None:
            self.grace_deadline = now + self.cfg.grace_ms / 1000
            # Acknowledgements and releases wait on the database like any call; waiting for them
            # is bounded by a lease past the grace period, after which they are moot (the leases
            # expired).
            self.settle_deadline = self.grace_deadline + max(self.cfg.lease_ms / 1000, 1.0)
            log.info("stopping: no new claims; %d deliveries have %d ms to finish",
                     self.running(), self.cfg.grace_ms)
        if self.grace_deadline is None:
            return None
        if now >= self.grace_deadline and self.pool.busy():
            self.release_unfinished(now)
        if not self.pool.busy() and not self.ending and self.claiming == 0:
            return EXIT_STOPPED
        if self.settle_deadline is not None and now >= self.settle_deadline:
            log.warning("stopping with %d deliveries not yet settled: the database is not answering;"
                        " their leases are left to expire", len(self.ending))
            return EXIT_STOPPED
        return None

    def release_unfinished(self, now: float) -> None:
        """Grace is over: make sure the children still running are gone, then release their leases."""
        for child in self.pool.busy():
            deliveries = list(child.deliveries.values())
            self.pool.remove(child)  # killed and joined: it can write nothing more
            for delivery in deliveries:
                log.info("execution %s token %d: grace period over; releasing it",
                         delivery.lease.execution_id, delivery.lease.token)
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
                log.warning("%s succeeded again after %d failed attempts", kind.name, failing)
                del self.failing[kind]
            return
        self.stats.storage_errors += 1
        self.failing[kind] = failing + 1
        if not error.transient:
            self.fatal = self.fatal or error
        elif not failing:
            log.warning("%s failed, will retry: %s", kind.name, error)

    # -- claims ------------------------------------------------------------------------------

    def claim(self, now: float) -> None:
        """Claim for the idle workers that no claim in flight is for. A claim may be sent while
        another is in flight: a worker freed meanwhile need not wait for it, and its claim goes
        out with the acknowledgement that freed it, in one transaction (see `wait`)."""
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
        self.calls.submit(Claim(wanted, self.cfg.lease_ms, about=now))

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
        idle = self.takers(now, len(claimed)) if self.grace_deadline is None else []
        if claimed:
            self.next_unconfirmed = min(self.next_unconfirmed, sent_at + self.cfg.lease_ms / 1000)
        for each in claimed:
            lease = each.lease
            delivery = Delivery(lease, claimed_at=lease.expires_at - self.cfg.lease_ms,
                                held_until=sent_at + self.cfg.lease_ms / 1000)
            child = idle.pop(0) if idle else None
            start = None if each.input_json is None else (each.workflow, each.input_json)
            if child is not None and self.hand_over(child, delivery, now, start):
                continue
            # No child for it (one died, or the supervisor is stopping): give it back at once
            # instead of letting the execution wait out a whole lease.
            self.end(delivery, Retry("no worker could take it"), now)
        # A full batch means more may be waiting: claim again as soon as a child is free (as
        # after a nudge or a finished delivery that came while this claim was in flight).
        self.claim_wanted = self.claim_wanted or len(claimed) == limit
        if not claimed and self.claiming == 0 and (self.pool.idle() or self.until_idle):
            self.calls.submit(NextReadyAt(timed=True))

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
                  start: Optional[tuple[str, str]] = None) -> bool:
        """Send the delivery to `child`; `start`: (workflow, input) of a first delivery, which the
        child then need not read from the ledger (see `Claimed`)."""
        lease = delivery.lease
        if child.slots > 1 and not any(c is child for c in self.pool.children):
            # Listed once per free slot (`takers`): replaced while this claim's deliveries were
            # being handed out.
            return False
        child.take(delivery)
        if child.send(Run(lease, delivery.claimed_at, start)):
            return True
        log.warning("worker pid %d was gone when handed execution %s; replacing it", child.pid, lease.execution_id)
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
            self.next_poll = min(self.next_poll, now + wait_s)
        elif self.until_idle and not self.pool.busy() and not self.ending and self.claiming == 0:
            self.idle_checked = True

    # -- renewals ------------------------------------------------------------------------------

    def renew(self, now: float) -> None:
        """Renew every lease of a delivery whose child answered recently, and of every delivery
        whose acknowledgement is still on its way (a busy database must not lose it)."""
        if now < self.next_renewal:
            return
        self.next_renewal = now + self.cfg.renew_ms / 1000
        due = [d for d in self.renewable(now) if not d.renewing and not d.lost]
        for delivery in due:
            delivery.renewing, delivery.renew_sent_at = True, now
        if due:  # one call for the round: a few transactions for thousands of leases
            self.renewals.submit(Renew([d.lease for d in due], self.cfg.lease_ms, about=due))

    def renewable(self, now: float) -> list[Delivery]:
        limit = self.cfg.silent_limit_s
        running = [d for c in self.pool.children if now - c.last_answer <= limit for d in c.deliveries.values()]
        return running + list(self.ending.values())

    def on_renewed(self, reply: Reply, now: float) -> None:
        deliveries: list[Delivery] = reply.call.about
        for delivery in deliveries:
            delivery.renewing = False
        if reply.error is not None:
            return  # the leases have slack for the next round
        for delivery, renewal in zip(deliveries, reply.value):
            if isinstance(renewal, Renewed):
                delivery.lease = renewal.lease
                # The ledger set the new expiry after the call was sent: it lasts at least this long.
                delivery.held_until = max(delivery.held_until, delivery.renew_sent_at + self.cfg.lease_ms / 1000)
            elif isinstance(renewal, LeaseLost):
                self.lose(delivery, RENEWAL_FOUND_LOST, now)
            # else a row another transaction held (StorageBusy): the lease has slack for the next round

    def stop_unconfirmed(self, now: float) -> None:
        """Stop every delivery whose lease no renewal has confirmed for a whole lease length, and
        give the lease back. The ledger may have let it expire (a database that cannot be
        reached, or answers too slowly; this supervisor paused), and another supervisor claim it:
        this host's child must not go on calling the outside world beside the new holder. A
        worker of one delivery is killed; a worker of several is told to stop that one
        (`stop`), and the lease is given back once it has (`done`). The release is fenced like
        any: refused once another holder has the execution, and otherwise it ends the delivery
        at once instead of leaving it to expire (a renewal still on its way may have extended it
        meanwhile). Costs time, never correctness: the execution is delivered again. (The child
        itself keeps no such timer: what stops a stale write is the fencing token, checked by
        the ledger as the write lands, never a clock.)

        Only once the earliest `held_until` has passed (`next_unconfirmed`, a lower bound): a
        turn of the loop does not look at every delivery."""
        if now < self.next_unconfirmed:
            return
        earliest = float("inf")
        why = f"no renewal has confirmed its lease for {self.cfg.lease_ms} ms"
        for child in list(self.pool.children):
            held = [d for d in child.deliveries.values() if not d.lost]
            due = [d for d in held if now >= d.held_until]
            earliest = min([earliest] + [d.held_until for d in held if now < d.held_until])
            if not due:
                continue
            if not child.process.is_alive() or child.conn.poll(0):
                # It exited meanwhile (its supervisor unheard?), or it has reported: let its
                # sentinel, or its report, be read first, and say what happened; then look again.
                earliest = now
                continue
            self.stats.unconfirmed += len(due)
            if self.shared:
                for delivery in due:
                    self.stop(child, delivery, f"{why} (the database out of reach or too slow, or this supervisor"
                              " paused; another supervisor may hold it)", now, release=True)
                continue
            (delivery,) = due
            log.warning("execution %s token %d: %s (the database out of reach or too slow, or this supervisor paused);"
                        " another supervisor may hold it; killing worker pid %d and giving the lease back",
                        delivery.lease.execution_id, delivery.lease.token, why, child.pid)
            child.delivery = None
            self.replace(child)  # killed and joined: it can do nothing more
            self.end(delivery, Retry(why), now)
        self.next_unconfirmed = earliest

    def stop(self, child: Child, delivery: Delivery, why: str, now: float, *, release: bool = False) -> None:
        """Tell `child`, a worker of several deliveries, to stop `delivery` and leave its others
        running; `release`: give the lease back once it has stopped. No longer renewed from now
        on; its worker is replaced if it has not reported within the heartbeat tolerance."""
        delivery.lost = True
        delivery.stop_sent_at, delivery.stop_why, delivery.release_on_stop = now, why, release
        log.warning(STOP_LINE, delivery.lease.execution_id, delivery.lease.token, why, child.pid)
        child.send(Stop(delivery.lease.execution_id, delivery.lease.token))  # a dead one shows on its sentinel

    def replace_and_release(self, child: Child, why: str, now: float) -> None:
        """Kill `child`, make sure it is gone, start another in its place, and give back the
        lease of every delivery it held, so that each is delivered again at once instead of after
        its lease expires. (A release is fenced: one whose lease is lost already is refused, and
        counted lost.)"""
        deliveries = list(child.deliveries.values())
        child.deliveries = {}
        self.replace(child)  # killed and joined: it can write nothing more
        for delivery in deliveries:
            log.warning(RELEASE_LINE, delivery.lease.execution_id, delivery.lease.token, why)
            self.end(delivery, Retry(why), now)

    def lose(self, delivery: Delivery, why: str, now: float) -> None:
        """The delivery ended in the ledger (lost, or cancelled): kill its child, which may be
        inside a step calling the outside world, so that it stops at once."""
        child = self.child_of(delivery)
        if child is None or delivery.lost:
            return  # it raced the acknowledgement of this delivery: the acknowledgement decides
        if self.shared:
            # Its report, if already sent, is read as usual; a `Stop` for a delivery that has
            # ended is ignored by the worker.
            self.stop(child, delivery, why, now)
            return
        # What it said already still counts, as when a worker dies (`child_died`): a report of
        # this delivery waiting in its pipe settles it, and the worker, idle again, is kept.
        while child.delivery is delivery and child.conn.poll(0):
            self.receive(child, now)
        if child.delivery is not delivery:
            return
        delivery.lost = True
        self.stats.lost += 1
        log.warning(LOST_LINE, delivery.lease.execution_id, delivery.lease.token, why, child.pid)
        child.delivery = None
        self.replace(child)

    # -- deliveries ended elsewhere -------------------------------------------------------------

    def check_ended(self, now: float) -> None:
        """Once a heartbeat, ask the ledger whether any running delivery has ended there (an
        operator cancelled its execution): renewals alone would find out only at the next one."""
        if self.checking_ended or now < self.next_ended_check:
            return
        running = [d for c in self.pool.children for d in c.deliveries.values() if not d.lost]
        if running:
            self.checking_ended = True
            self.renewals.submit(Ended([d.lease for d in running], about=running))

    def on_ended(self, reply: Reply, now: float) -> None:
        self.checking_ended = False
        if reply.error is not None:
            return  # renewals still find lost leases; the next heartbeat asks again
        ended = {(lease.execution_id, lease.token) for lease in reply.value}
        for delivery in reply.call.about:
            if (delivery.lease.execution_id, delivery.lease.token) in ended:
                self.lose(delivery,
                          "its delivery ended in the ledger (cancelled, or claimed again after its lease expired)", now)

    def child_of(self, delivery: Delivery) -> Optional[Child]:
        return next((c for c in self.pool.children if c.deliveries.get(delivery.key) is delivery), None)

    # -- heartbeats ------------------------------------------------------------------------------

    def beat(self, now: float) -> None:
        if now < self.next_beat:
            return
        self.next_beat = now + self.cfg.heartbeat_ms / 1000
        limit = self.cfg.silent_limit_s
        if self.last_beat_at is not None and now - self.last_beat_at > limit:
            # This process itself was paused (SIGSTOP, an overloaded host): the children's
            # silence is ours. Judge them from now on; renewals and the fence sort out leases.
            log.warning("the supervisor was paused for %.1f s", now - self.last_beat_at)
            for child in self.pool.children:
                child.last_answer = now
                for delivery in child.deliveries.values():  # told to stop before the pause: from now on too
                    if delivery.stop_sent_at is not None:
                        delivery.stop_sent_at = now
            # Its workers may have given up on it during the pause and be reporting so now: let
            # them, and let the next renewal round decide about their leases, as before the pause.
            self.next_ended_check = now + self.cfg.renew_ms / 1000
        self.last_beat_at = now
        self.check_ended(now)
        for child in list(self.pool.children):
            if not child.ready:
                if now > child.start_deadline:
                    log.error("worker pid %d did not load the app within %.0f s; replacing it",
                              child.pid, self.pool.start_timeout_s)
                    self.replace(child)
                continue
            delivery = child.delivery
            expires = min((d.lease.expires_at for d in child.deliveries.values()), default=None)
            if not child.send(Beat(expires)):
                continue  # its death shows on its sentinel
            if now - child.last_answer > limit:
                # Frozen, or stuck in C code holding the GIL: no longer renewed (see renewable).
                # Kill it and leave its lease to expire. An idle one too: it would be handed a
                # lease it cannot run, and its pipe, unread, would fill up with beats until a send
                # blocked this loop.
                if self.shared and child.deliveries:
                    self.stats.children_killed += 1
                    self.replace_and_release(child, f"worker pid {child.pid} silent for"
                                             f" {now - child.last_answer:.1f} s, killed and replaced", now)
                    continue
                if delivery is not None:
                    log.warning("execution %s token %d: worker pid %d silent for %.1f s; killing and replacing it",
                                delivery.lease.execution_id, delivery.lease.token, child.pid,
                                now - child.last_answer)
                else:
                    log.warning("idle worker pid %d silent for %.1f s; killing and replacing it",
                                child.pid, now - child.last_answer)
                self.stats.children_killed += 1
                child.delivery = None
                self.replace(child)
                continue
            if self.shared:
                self.replace_unstoppable(child, now, limit)

    def replace_unstoppable(self, child: Child, now: float, limit: float) -> None:
        """A worker of several deliveries, one of which was told to stop longer than the heartbeat
        tolerance ago and has not reported (a sync step that sleeps, or code that ignores the
        cancellation): it is replaced, and its other deliveries are given back at once."""
        stuck = next((d for d in child.deliveries.values()
                      if d.stop_sent_at is not None and now - d.stop_sent_at > limit), None)
        if stuck is None:
            return
        log.warning("execution %s token %d: not stopped %.1f s after worker pid %d was told to stop it; killing"
                    " and replacing the worker, and releasing its %d other deliveries", stuck.lease.execution_id,
                    stuck.lease.token, now - stuck.stop_sent_at, child.pid, len(child.deliveries) - 1)
        self.stats.children_killed += 1
        self.replace_and_release(child, f"worker pid {child.pid} replaced: a delivery of it did not stop", now)

    # -- outcomes ------------------------------------------------------------------------------

    def end(self, delivery: Delivery, outcome, now: float) -> None:
        """A delivery's child is done with it: acknowledge its outcome, or release it."""
        delivery.outcome = outcome
        if isinstance(outcome, Retry) and outcome.storage_error not in (None, *TRANSIENT_KINDS):
            self.fatal = self.fatal or LedgerUnusable(outcome.reason)
        if isinstance(outcome, LeaseLost):
            self.stats.lost += 1
            self.settled(delivery, "lost")
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
                     reason.splitlines()[-1] if reason else "")
        else:
            setattr(self.stats, outcome.status, getattr(self.stats, outcome.status) + 1)
            status = outcome.status
        self.settled(delivery, status)
        self.claim_wanted = True

    def settled(self, delivery: Delivery, status: str) -> None:
        lease = delivery.lease
        log.info("delivery execution=%s token=%d outcome=%s duration_ms=%d",
                 lease.execution_id, lease.token, status, delivery.ms)
        if self.on_delivery is not None:
            self.on_delivery(lease.execution_id, lease.token, status, delivery.ms)

    # -- children ------------------------------------------------------------------------------

    def receive(self, child: Child, now: float) -> None:
        """Handle one message from a child."""
        try:
            message = child.conn.recv()
        except (EOFError, OSError):
            self.child_died(child)  # its end of the pipe closed: it exited or was killed
            return
        child.last_answer = now
        match message:
            case Alive():
                pass
            case _ if not child.ready:
                self.started(child, message)
            case Done():
                self.done(child, message, now)
            case _:
                log.error("unexpected message from worker pid %d: %r", child.pid, message)

    def done(self, child: Child, report: Done, now: float) -> None:
        """A child's report that it finished its delivery."""
        self.claim_wanted = True
        delivery = child.deliveries.pop((report.execution_id, report.token), None)
        if delivery is None:
            log.error("worker pid %d reported %s token %s, which it was not running", child.pid, report.execution_id,
                      report.token)
            return
        delivery.ms = report.ms
        outcome = report.outcome
        if delivery.release_on_stop and isinstance(outcome, LeaseLost):
            outcome = Retry(delivery.stop_why)  # stopped unconfirmed: give the lease back
        self.end(delivery, outcome, now)

    def started(self, child: Child, message: FromChild) -> None:
        """A child's first message: it loaded the app and may take deliveries, or it could not."""
        match message:
            case Ready():
                log.info("worker %d is ready: it loaded the app in %.1f s", child.pid,
                         time.monotonic() - child.launched)
                child.ready, child.start_deadline = True, None
                self.ever_ready = True
                self.start_deaths = 0
                self.claim_wanted = True
                return
            case LedgerNotOpened():  # the ledger, not the app: the message says what to do
                self.fatal = self.fatal or LedgerUnusable(message.error)
                return
            case AppNotLoaded():
                error = message.error  # "cannot load app APP: CAUSE", then the child's traceback
            case _:
                error = f"a worker process sent {message!r} before reporting that it loaded the app"
        if not self.ever_ready:
            raise AppLoadFailed(error)
        # The app no longer loads (edited on disk?). A replacement would fail alike: run on with
        # the children that remain, and stop only when none does.
        log.error("%s\nrunning with 1 worker fewer", error)
        self.pool.size -= 1
        self.pool.remove(child)
        if not self.pool.children:
            raise AppLoadFailed(error)

    def child_died(self, child: Child) -> None:
        # What it said before it died still counts: a delivery it reported done is settled.
        try:
            while child.ready and child.deliveries and child.conn.poll(0):
                message = child.conn.recv()
                if isinstance(message, Done):
                    self.done(child, message, time.monotonic())
        except (EOFError, OSError):
            pass
        child.process.join(1)
        delivery = child.delivery
        self.stats.child_deaths += 1
        if self.shared and child.deliveries:
            self.replace_and_release(child, f"worker pid {child.pid} {describe_exit(child.process)} mid-delivery",
                                     time.monotonic())
            return
        if delivery is not None:
            log.warning("execution %s token %d: worker pid %d %s mid-delivery; its lease is left to expire",
                        delivery.lease.execution_id, delivery.lease.token, child.pid, describe_exit(child.process))
        elif not child.ready:
            log.warning("worker pid %d %s while loading the app; replacing it", child.pid, describe_exit(child.process))
            self.start_deaths += 1
            if not self.ever_ready and self.start_deaths >= START_ATTEMPTS * self.pool.size:
                raise DiedWhileStarting(f"a worker process died while starting, {self.start_deaths} times in a row"
                                        f" (last: {describe_exit(child.process)})")
        else:
            log.warning("idle worker pid %d %s; replacing it", child.pid, describe_exit(child.process))
        child.delivery = None
        self.replace(child)

    def replace(self, child: Child) -> None:
        """Kill `child` (confirmed gone) and start another in its place, unless stopping. A child
        that cannot be started (no memory, no more processes) is tried again by `top_up`."""
        if self.grace_deadline is not None:
            self.pool.remove(child)
            return
        try:
            self.pool.replace(child)
        except OSError as exc:
            log.error("could not replace a worker: %s", exc)
            if child in self.pool.children:
                self.pool.children.remove(child)

    def top_up(self, now: float) -> None:
        """Start the children the pool lacks: at start-up, and after a start that failed."""
        if self.grace_deadline is not None or now < self.next_top_up:
            return
        try:
            self.pool.top_up()
        except OSError as exc:
            log.error("could not start a worker, will try again in %.0f s: %s", TOP_UP_RETRY_S, exc)
            self.next_top_up = now + TOP_UP_RETRY_S

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
}


def _backoff(failures: int, first_s: float) -> float:
    return min(BACKOFF_MAX_S, first_s * 2 ** min(failures - 1, 16))
