"""The supervisor: claims due executions, hands them to child processes, acknowledges outcomes.

    supervisor process                                          child processes (pool)
    +-----------------------------------------------+          +-------------------------+
    | dispatcher loop (main thread): owns all state |  ("run", id, token, expires, claimed_at)
    |   wait() on pipes, child sentinels, nudges,   |--------> | run_delivery            |
    |   signals and the two ledger wake-ups         |  ("beat", expires)  /  ("alive",)      |
    |   claim / beat / renew / settle as steps      |<-------- |   write_step(token) --+  |
    |        | submit             ^ replies         |  ("done", id, token, outcome)     |  |
    | ledger thread: claim_due, acknowledge,        |          | parent watch thread   |  |
    |   release, next_ready_at (own connection)     |          +-----------------------|--+
    | renewal thread: renew (own connection)        |                                  |
    +--------|--------------------------------------+                                  v
             v                                                                         v
        SQLite ledger file (WAL) <-------- fenced by the token, in the same transaction

The parent holds the leases; children make their own fenced step writes with the token they
were sent. Heartbeats run both ways over each child's pipe: a child that stops hearing its
supervisor stops writing and exits (`worker.parent_watch`); a busy child that stops answering
is no longer renewed, is killed and replaced, and its lease is left to expire. A child that dies
is replaced and its lease is left to expire too: the execution is delivered again later.

The loop never waits for the database (`ledger_calls`): a write lock held by another process,
a full disk or a slow file system delays claims and acknowledgements, never a heartbeat. Storage
errors are replies like any other: a transient one (busy, disk full, I/O) is logged and the call
is made again after a backoff; a lasting one (a corrupt, deleted or foreign file) stops the
supervisor with exit code 5 and a message that says what to do.

Signals only set flags (and wake the loop); the loop acts on them, also while the pool is still
starting. The first SIGTERM/SIGINT stops claiming and lets running deliveries finish within the
grace period, then stops the rest (their children are killed and confirmed gone before their
leases are released) and `run()` returns 0. A second signal kills the children at once and
returns 1; their leases are left to expire.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Callable, Optional

from worker.protocol import ALIVE, BEAT, DONE, RUN

from .errors import InvalidArgument, LedgerGone, LedgerUnusable, StorageError, TRANSIENT_KINDS
from .ledger_calls import Call, LedgerCalls, Reply, Wakeup
from .nudge import NudgeListener
from .pool import (MAX_CONCURRENCY, START_ATTEMPTS, AppLoadFailed, Child, Delivery, DiedWhileStarting, Pool,
                   describe_exit)
from .sqlite.backend import open_backend
from .values import Completed, Failed, LeaseLost, Renewed, Retry, Suspended

log = logging.getLogger("yieldstar.supervisor")

EXIT_STOPPED = 0
EXIT_KILLED = 1  # a second stop request: children killed, leases left to expire
EXIT_LEDGER_UNUSABLE = 5  # the ledger file is corrupt, gone, foreign or no longer ours

# After a storage error, a call is made again after this backoff, doubling up to the maximum.
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 2.0
# How often the loop checks that the ledger file is still the one it opened.
FILE_CHECK_S = 1.0


@dataclass(frozen=True)
class SupervisorConfig:
    """Timings are in ms. A lease must outlast several renewals, so that one late renewal (a busy
    database, a slow machine) does not lose it: `renew_ms` must be below `lease_ms`. Left out,
    `renew_ms` is a third of the lease and `heartbeat_ms` 1000, or a tenth of the lease when
    that is shorter."""

    concurrency: int = 4
    lease_ms: int = 30_000
    renew_ms: Optional[int] = None
    heartbeat_ms: Optional[int] = None
    heartbeat_misses: int = 3  # silent intervals before a child gives up on us, or we on it
    poll_ms: int = 500
    grace_ms: int = 10_000
    durability: str = "normal"

    def __post_init__(self) -> None:
        lease = self.lease_ms
        if isinstance(lease, int) and not isinstance(lease, bool) and lease >= 1:
            if self.renew_ms is None:
                object.__setattr__(self, "renew_ms", max(1, lease // 3))
            if self.heartbeat_ms is None:
                object.__setattr__(self, "heartbeat_ms", max(1, min(1000, lease // 10)))
        for name in ("concurrency", "lease_ms", "renew_ms", "heartbeat_ms", "heartbeat_misses", "poll_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidArgument(f"{name} must be an int >= 1, got {value!r}")
        if self.concurrency > MAX_CONCURRENCY:
            raise InvalidArgument(
                f"concurrency must be at most {MAX_CONCURRENCY} (one worker process each), got {self.concurrency}:"
                " run more supervisors on the same ledger for more")
        if not isinstance(self.grace_ms, int) or isinstance(self.grace_ms, bool) or self.grace_ms < 0:
            raise InvalidArgument(f"grace_ms must be an int >= 0, got {self.grace_ms!r}")
        if self.renew_ms >= self.lease_ms:
            raise InvalidArgument(f"renew_ms ({self.renew_ms}) must be less than lease_ms ({self.lease_ms})")

    @property
    def silent_limit_s(self) -> float:
        """How long a child may go unheard before it counts as frozen."""
        return self.heartbeat_ms * self.heartbeat_misses / 1000


@dataclass
class Stats:
    claimed: int = 0
    completed: int = 0
    failed: int = 0
    suspended: int = 0
    released: int = 0
    lost: int = 0
    child_deaths: int = 0
    children_killed: int = 0
    storage_errors: int = 0


class Supervisor:
    def __init__(self, db_path: str, app: str, config: SupervisorConfig = SupervisorConfig(), *,
                 on_delivery: Optional[Callable[[str, int, str, int], None]] = None):
        """
        Args:
            db_path: the ledger file, shared with any other supervisor on this host.
            app: the user's workflows, as a module name or a .py path (loaded by each child).
            on_delivery: called after each delivery with (execution_id, token, outcome, ms).
        """
        self.db_path = db_path
        self.app = app
        self.config = config
        self.stats = Stats()
        self._on_delivery = on_delivery
        self._stop_requests = 0
        self._signals = Wakeup()

    # -- signals: flags only -------------------------------------------------------------------

    def request_stop(self, *_: object) -> None:
        self._stop_requests += 1
        self._signals.wake()

    def _install_signal_handlers(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, self.request_stop)
        return previous

    # -- the run ---------------------------------------------------------------------------------

    def run(self, *, until_idle: bool = False) -> int:
        """Supervise until stopped (or, with `until_idle`, until nothing is running or due).

        Returns the process exit code: 0 after a graceful stop or when idle, 1 after a second
        stop request, 5 when the ledger became unusable (the log says why and what to do).
        """
        cfg = self.config
        previous_handlers = self._install_signal_handlers()
        calls = renewals = None
        try:
            calls = LedgerCalls(open_backend(self.db_path, durability=cfg.durability), "ledger-calls")
            renewals = LedgerCalls(open_backend(self.db_path, durability=cfg.durability), "lease-renewals")
            self._file_identity = _identity(self.db_path)
        except LedgerUnusable as exc:
            log.error("%s", exc)
            self._close(calls, renewals)
            self._restore(previous_handlers)
            return EXIT_LEDGER_UNUSABLE
        pool = Pool(cfg.concurrency, app=self.app, db_path=self.db_path, durability=cfg.durability,
                    heartbeat_s=cfg.heartbeat_ms / 1000, misses=cfg.heartbeat_misses)
        try:
            nudges: Optional[NudgeListener] = NudgeListener(self.db_path)
        except OSError as exc:
            log.warning("no nudge socket (%s): new work is found by polling every %d ms", exc, cfg.poll_ms)
            nudges = None
        loop = _Loop(self, pool, calls, renewals, nudges, until_idle)
        try:
            pool.start()
            log.info("supervising %s on %s: concurrency %d, lease %d ms, renew every %d ms (pid %d)",
                     self.app, self.db_path, cfg.concurrency, cfg.lease_ms, cfg.renew_ms, os.getpid())
            return loop.run()
        finally:
            if nudges is not None:
                nudges.close()
            pool.shutdown(kill=self._stop_requests > 1 or loop.fatal is not None)
            self._close(calls, renewals)
            self._restore(previous_handlers)

    @staticmethod
    def _close(*all_calls: Optional[LedgerCalls]) -> None:
        for calls in all_calls:
            if calls is not None:
                calls.close()

    @staticmethod
    def _restore(previous_handlers: dict) -> None:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)


def _identity(path: str) -> Optional[tuple[int, int]]:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


class _Loop:
    """The dispatcher loop's state and its steps. Every step takes the time (`now`, monotonic
    seconds) as an argument and none blocks: waiting happens in `_wait` alone."""

    def __init__(self, supervisor: Supervisor, pool: Pool, calls: LedgerCalls, renewals: LedgerCalls,
                 nudges: Optional[NudgeListener], until_idle: bool):
        self.s = supervisor
        self.cfg = supervisor.config
        self.stats = supervisor.stats
        self.pool = pool
        self.calls = calls
        self.renewals = renewals
        self.nudges = nudges
        self.until_idle = until_idle
        self.fatal: Optional[StorageError] = None
        self.clock = calls.backend.clock
        now = time.monotonic()
        self.claim_wanted = True  # something may have become claimable: claim as soon as a child is free
        self.claiming = False  # a claim is in flight
        self.next_poll = now
        self.claim_failures = 0
        self.next_beat = now
        self.next_renewal = now + self.cfg.renew_ms / 1000
        self.next_file_check = now + FILE_CHECK_S
        self.last_beat_at: Optional[float] = None
        self.grace_deadline: Optional[float] = None
        self.settle_deadline: Optional[float] = None  # after the grace period: how long releases may take
        self.ending: dict[tuple[str, int], Delivery] = {}  # replied to by their child, not yet settled
        self.start_deaths = 0  # children that died while loading the app, in a row
        self.ever_ready = False
        self.idle_checked = False  # until_idle: a next_ready_at is in flight

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> int:
        while True:
            now = time.monotonic()
            code = self.check_stop(now)
            if code is not None:
                return code
            self.take_replies(now)
            self.check_file(now)
            if self.fatal is not None:
                log.error("stopping: %s", self.fatal)
                return EXIT_LEDGER_UNUSABLE
            if self.idle_checked:
                log.info("idle: nothing running and nothing due")
                return EXIT_STOPPED
            self.claim(now)
            self.renew(now)
            self.beat(now)
            self.settle_due(now)
            if self.grace_deadline is None:
                self.pool.top_up()
            self.wait(self.deadline(now))

    # -- stop ------------------------------------------------------------------------------------

    def check_stop(self, now: float) -> Optional[int]:
        """The exit code once the loop should end, else None."""
        requests = self.s._stop_requests
        if requests > 1:
            log.warning("second stop request: killing %d running deliveries", len(self.pool.busy()))
            return EXIT_KILLED
        if requests and self.grace_deadline is None:
            self.grace_deadline = now + self.cfg.grace_ms / 1000
            log.info("stopping: no new claims; %d deliveries have %d ms to finish",
                     len(self.pool.busy()), self.cfg.grace_ms)
        if self.grace_deadline is None:
            return None
        if now >= self.grace_deadline and self.pool.busy():
            self.release_unfinished(now)
        if not self.pool.busy() and not self.ending and not self.claiming:
            return EXIT_STOPPED
        if self.settle_deadline is not None and now >= self.settle_deadline:
            log.warning("stopping with %d deliveries not yet settled: the database is not answering;"
                        " their leases are left to expire", len(self.ending))
            return EXIT_STOPPED
        return None

    def release_unfinished(self, now: float) -> None:
        """Grace is over: make sure the children still running are gone, then release their leases."""
        for child in self.pool.busy():
            delivery = child.delivery
            self.pool.remove(child)  # killed and joined: it can write nothing more
            log.info("execution %s token %d: grace period over; releasing it",
                     delivery.lease.execution_id, delivery.lease.token)
            self.end(delivery, Retry("the supervisor stopped"), now)
        # Releases wait on the database like any call; waiting for them is bounded by the lease,
        # after which they are moot (the leases expired).
        self.settle_deadline = now + max(self.cfg.lease_ms / 1000, 1.0)

    # -- ledger replies ----------------------------------------------------------------------

    def take_replies(self, now: float) -> None:
        for reply in self.calls.replies() + self.renewals.replies():
            if reply.error is not None:
                self.storage_error(reply)
            handler = getattr(self, f"on_{reply.call.method}")
            handler(reply, now)

    def storage_error(self, reply: Reply) -> None:
        error = reply.error
        self.stats.storage_errors += 1
        if not error.transient:
            self.fatal = self.fatal or error
        else:
            log.warning("%s failed, will retry: %s", reply.call.method, error)

    # -- claims ------------------------------------------------------------------------------

    def claim(self, now: float) -> None:
        if self.claiming or self.grace_deadline is not None:
            return
        if not (self.claim_wanted or now >= self.next_poll):
            return
        idle = self.pool.idle()
        if not idle:
            return
        self.claiming, self.claim_wanted = True, False
        self.next_poll = now + self.cfg.poll_ms / 1000
        self.calls.submit(Call("claim_due", kwargs={"limit": len(idle), "duration": self.cfg.lease_ms},
                               about=len(idle)))

    def on_claim_due(self, reply: Reply, now: float) -> None:
        self.claiming = False
        if reply.error is not None:
            self.claim_failures += 1
            self.next_poll = now + _backoff(self.claim_failures, self.cfg.poll_ms / 1000)
            return
        self.claim_failures = 0
        leases = reply.value
        self.stats.claimed += len(leases)
        idle = self.pool.idle() if self.grace_deadline is None else []
        for lease in leases:
            delivery = Delivery(lease, now, claimed_at=lease.expires_at - self.cfg.lease_ms)
            child = idle.pop(0) if idle else None
            if child is not None and self.hand_over(child, delivery, now):
                continue
            # No child for it (one died, or the supervisor is stopping): give it back at once
            # instead of letting the execution wait out a whole lease.
            self.end(delivery, Retry("no worker could take it"), now)
        # A full batch means more may be waiting: claim again as soon as a child is free.
        self.claim_wanted = len(leases) == reply.call.about
        if not leases and (self.pool.idle() or self.until_idle):
            self.calls.submit(Call("next_ready_at"))

    def hand_over(self, child: Child, delivery: Delivery, now: float) -> bool:
        lease = delivery.lease
        child.delivery = delivery
        child.last_answer = now
        if child.send((RUN, lease.execution_id, lease.token, lease.expires_at, delivery.claimed_at)):
            return True
        log.warning("worker pid %d was gone when handed execution %s; replacing it", child.pid, lease.execution_id)
        child.delivery = None
        self.stats.child_deaths += 1
        self.replace(child)
        return False

    def on_next_ready_at(self, reply: Reply, now: float) -> None:
        """When the next execution becomes claimable (a timer, a backoff, an expiry), so that an
        idle supervisor wakes for it instead of waiting for its next poll."""
        if reply.error is not None:
            return
        ready = reply.value
        if ready is not None:
            wait_s = max(0.005, (ready - self.clock()) / 1000)
            self.next_poll = min(self.next_poll, now + wait_s)
        elif self.until_idle and not self.pool.busy() and not self.ending and not self.claiming:
            self.idle_checked = True

    # -- renewals ------------------------------------------------------------------------------

    def renew(self, now: float) -> None:
        """Renew every lease of a delivery whose child answered recently, and of every delivery
        whose acknowledgement is still on its way (a busy database must not lose it)."""
        if now < self.next_renewal:
            return
        self.next_renewal = now + self.cfg.renew_ms / 1000
        for delivery in self.renewable(now):
            if not delivery.renewing and not delivery.lost:
                delivery.renewing = True
                self.renewals.submit(Call("renew", (delivery.lease,), {"duration": self.cfg.lease_ms}, about=delivery))

    def renewable(self, now: float) -> list[Delivery]:
        limit = self.cfg.silent_limit_s
        running = [c.delivery for c in self.pool.children
                   if c.delivery is not None and now - c.last_answer <= limit]
        return running + list(self.ending.values())

    def on_renew(self, reply: Reply, now: float) -> None:
        delivery: Delivery = reply.call.about
        delivery.renewing = False
        if reply.error is not None:
            return  # the lease has slack for the next round
        if isinstance(reply.value, Renewed):
            delivery.lease = reply.value.lease
            return
        child = self.child_of(delivery)
        if child is None:
            return  # it raced the acknowledgement of this delivery: the acknowledgement decides
        delivery.lost = True
        self.stats.lost += 1
        log.warning("execution %s token %d: the lease is lost; killing worker pid %d so that it stops at once",
                    delivery.lease.execution_id, delivery.lease.token, child.pid)
        child.delivery = None
        self.replace(child)

    def child_of(self, delivery: Delivery) -> Optional[Child]:
        return next((c for c in self.pool.children if c.delivery is delivery), None)

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
        self.last_beat_at = now
        for child in list(self.pool.children):
            if not child.ready:
                if now > child.start_deadline:
                    log.error("worker pid %d did not load the app within %.0f s; replacing it",
                              child.pid, self.pool.start_timeout_s)
                    self.replace(child)
                continue
            delivery = child.delivery
            if not child.send((BEAT, delivery.lease.expires_at if delivery else None)):
                continue  # its death shows on its sentinel
            if child.busy and now - child.last_answer > limit:
                # Frozen, or stuck in C code holding the GIL: no longer renewed (see renewable).
                # Kill it and leave its lease to expire.
                log.warning("execution %s token %d: worker pid %d silent for %.1f s; killing and replacing it",
                            delivery.lease.execution_id, delivery.lease.token, child.pid, now - child.last_answer)
                self.stats.children_killed += 1
                child.delivery = None
                self.replace(child)

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
            self.calls.submit(Call("release", (delivery.lease,), about=delivery))
        else:
            self.calls.submit(Call("acknowledge", (delivery.lease, delivery.outcome), about=delivery))

    def settle_due(self, now: float) -> None:
        """Try again the acknowledgements and releases that a storage error held up."""
        for delivery in self.ending.values():
            if delivery.retry_at <= now:
                self.submit_settle(delivery)

    def on_acknowledge(self, reply: Reply, now: float) -> None:
        self.on_settle(reply, now)

    def on_release(self, reply: Reply, now: float) -> None:
        self.on_settle(reply, now)

    def on_settle(self, reply: Reply, now: float) -> None:
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
        if self.s._on_delivery is not None:
            self.s._on_delivery(lease.execution_id, lease.token, status, delivery.ms)

    # -- children ------------------------------------------------------------------------------

    def receive(self, child: Child, now: float) -> None:
        """Handle one message from a child."""
        try:
            message = child.conn.recv()
        except (EOFError, OSError):
            self.child_died(child)  # its end of the pipe closed: it exited or was killed
            return
        child.last_answer = now
        if message[0] == ALIVE:
            return
        if not child.ready:
            self.started(child, message)
            return
        if message[0] != DONE:
            log.error("unexpected message from worker pid %d: %r", child.pid, message[:1])
            return
        _, execution_id, token, outcome, ms = message
        delivery = child.delivery
        child.delivery = None
        self.claim_wanted = True
        if delivery is None or delivery.lease.token != token or delivery.lease.execution_id != execution_id:
            log.error("worker pid %d reported %s token %s, which it was not running", child.pid, execution_id, token)
            return
        delivery.ms = ms
        self.end(delivery, outcome, now)

    def started(self, child: Child, message: tuple) -> None:
        """A child's first message: it loaded the app and may take deliveries, or it could not."""
        error = self.pool.load_error(message)
        if error is None:
            child.ready, child.start_deadline = True, None
            self.ever_ready = True
            self.start_deaths = 0
            self.claim_wanted = True
            return
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
        child.process.join(1)
        delivery = child.delivery
        self.stats.child_deaths += 1
        if delivery is not None:
            log.warning("execution %s token %d: worker pid %d %s mid-delivery; its lease is left to expire",
                        delivery.lease.execution_id, delivery.lease.token, child.pid, describe_exit(child.process))
        elif not child.ready:
            log.warning("worker pid %d %s while loading the app; replacing it", child.pid, describe_exit(child.process))
            self.start_deaths += 1
            if not self.ever_ready and self.start_deaths >= START_ATTEMPTS:
                raise DiedWhileStarting(f"a worker process died while starting, {self.start_deaths} times in a row"
                                        f" (last: {describe_exit(child.process)})")
        else:
            log.warning("idle worker pid %d %s; replacing it", child.pid, describe_exit(child.process))
        child.delivery = None
        self.replace(child)

    def replace(self, child: Child) -> None:
        try:
            self.pool.replace(child)
        except OSError as exc:
            log.error("could not replace a worker: %s", exc)
            self.pool.children.remove(child)

    # -- the file ------------------------------------------------------------------------------

    def check_file(self, now: float) -> None:
        """The ledger must still be the file this supervisor opened: one deleted or replaced
        under it would take every write of its workers to a file nobody else reads."""
        if now < self.next_file_check:
            return
        self.next_file_check = now + FILE_CHECK_S
        if _identity(self.s.db_path) != self.s._file_identity:
            self.fatal = self.fatal or LedgerGone(
                f"the ledger {self.s.db_path} was deleted or replaced while in use; restore it, then restart")

    # -- waiting ---------------------------------------------------------------------------------

    def deadline(self, now: float) -> float:
        deadlines = [self.next_beat, self.next_file_check]
        if self.grace_deadline is None and self.pool.idle() and not self.claiming:
            deadlines.append(self.next_poll)
        elif self.grace_deadline is not None:
            deadlines.append(self.grace_deadline)
            if self.settle_deadline is not None:
                deadlines.append(self.settle_deadline)
        if any(c.delivery is not None and not c.delivery.lost for c in self.pool.children) or self.ending:
            deadlines.append(self.next_renewal)
        deadlines += [d.retry_at for d in self.ending.values()]
        return min(deadlines)

    def wait(self, deadline: float) -> None:
        waitables: list = [self.calls, self.renewals, self.s._signals]
        if self.nudges is not None:
            waitables.append(self.nudges)
        owners: list[tuple[object, Child]] = []  # who each waitable belonged to when we waited
        for child in self.pool.children:
            owners.append((child.conn, child))  # a child's death also shows here, as end of file
            if child.process.sentinel is not None:
                owners.append((child.process.sentinel, child))
        waitables += [waitable for waitable, _ in owners]
        for ready in wait(waitables, timeout=max(0.0, deadline - time.monotonic())):
            now = time.monotonic()
            if ready is self.nudges:
                self.nudges.drain()
                self.claim_wanted = True
                continue
            if ready is self.s._signals:
                self.s._signals.drain()
                continue
            if ready is self.calls or ready is self.renewals:
                continue  # replies are taken at the top of the loop
            # Look the owner up as of the wait: a sentinel is a plain fd number, and the child
            # that replaced a dead one earlier in this round may have been given the same one.
            child = next((c for waitable, c in owners if waitable is ready), None)
            if child is None or not any(c is child for c in self.pool.children):
                continue  # replaced earlier in this round
            if ready is child.conn:
                self.receive(child, now)
            else:
                self.child_died(child)


def _backoff(failures: int, first_s: float) -> float:
    return min(BACKOFF_MAX_S, first_s * 2 ** min(failures - 1, 16))
