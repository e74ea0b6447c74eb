"""The supervisor: claims due executions, hands them to child processes, acknowledges outcomes.

    supervisor process                                         child processes (pool)
    +----------------------------------------------+          +-------------------------+
    | dispatcher loop (main thread)                |  ("run", id, token, expires)           |
    |   claim_due ---------------------------------|--------> | run_delivery            |
    |   wait() on pipes, child sentinels, nudges   |  ("beat", expires)  /  ("alive",)      |
    |   acknowledge / release <--------------------|<-------- |   write_step(token) --+  |
    | renewer thread (own connection)              |  ("done", id, token, outcome)     |  |
    |   renew every live lease of a live child     |          | parent watch thread   |  |
    +---------------------|------------------------+          +-----------------------|--+
                          v                                                           v
                     SQLite ledger file (WAL) <---- fenced by the token, in the same transaction

The parent holds the leases; children make their own fenced step writes with the token they
were sent. Heartbeats run both ways over each child's pipe: a child that stops hearing its
supervisor stops writing and exits (`worker.parent_watch`); a busy child that stops answering
is no longer renewed, is killed and replaced, and its lease is left to expire. A child that dies
is replaced and its lease is left to expire too: the execution is delivered again later.

Signals only set flags; the loop acts on them. The first SIGTERM/SIGINT stops claiming and lets
running deliveries finish within the grace period, then stops the rest (their children are
killed and confirmed gone before their leases are released) and `run()` returns 0. A second
signal kills the children at once and returns 1; their leases are left to expire.
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

from worker.protocol import ALIVE, BEAT, DONE, RUN, STOP

from .errors import InvalidArgument, StorageBusy, YieldstarError
from .nudge import NudgeListener
from .pool import AppLoadFailed, Child, Delivery, Pool, describe_exit
from .renewal import Renewer
from .sqlite.backend import open_backend
from .values import Completed, Failed, LeaseLost, Retry, Suspended

log = logging.getLogger("yieldstar.supervisor")


@dataclass(frozen=True)
class SupervisorConfig:
    """Timings are in ms. A lease must outlast several renewals, so that one late renewal (a busy
    database, a slow machine) does not lose it: `renew_ms` must be below `lease_ms`."""

    concurrency: int = 4
    lease_ms: int = 30_000
    renew_ms: int = 10_000
    heartbeat_ms: int = 1_000
    heartbeat_misses: int = 3  # silent intervals before a child gives up on us, or we on it
    poll_ms: int = 500
    grace_ms: int = 10_000
    durability: str = "normal"

    def __post_init__(self) -> None:
        for name in ("concurrency", "lease_ms", "renew_ms", "heartbeat_ms", "heartbeat_misses", "poll_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidArgument(f"{name} must be an int >= 1, got {value!r}")
        if not isinstance(self.grace_ms, int) or self.grace_ms < 0:
            raise InvalidArgument(f"grace_ms must be an int >= 0, got {self.grace_ms!r}")
        if self.renew_ms >= self.lease_ms:
            raise InvalidArgument(f"renew_ms ({self.renew_ms}) must be less than lease_ms ({self.lease_ms})")


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
        self._last_beat_at: Optional[float] = None
        self._lock = threading.Lock()  # guards Delivery objects shared with the renewer
        self._pool: Optional[Pool] = None

    # -- signals: flags only -------------------------------------------------------------------

    def request_stop(self, *_: object) -> None:
        self._stop_requests += 1

    def _install_signal_handlers(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, self.request_stop)
        return previous

    # -- the loop --------------------------------------------------------------------------------

    def run(self, *, until_idle: bool = False) -> int:
        """Supervise until stopped (or, with `until_idle`, until nothing is running or due).

        Returns the process exit code: 0 after a graceful stop or when idle, 1 after a second
        stop request.
        """
        cfg = self.config
        backend = open_backend(self.db_path, durability=cfg.durability)
        previous_handlers = self._install_signal_handlers()
        pool = self._pool = Pool(cfg.concurrency, app=self.app, db_path=self.db_path, durability=cfg.durability,
                                 heartbeat_s=cfg.heartbeat_ms / 1000, misses=cfg.heartbeat_misses)
        try:
            nudges: Optional[NudgeListener] = NudgeListener(self.db_path)
        except OSError as exc:
            log.warning("no nudge socket (%s): new work is found by polling every %d ms", exc, cfg.poll_ms)
            nudges = None
        renewer = Renewer(open_backend(self.db_path, durability=cfg.durability), lease_ms=cfg.lease_ms,
                          renew_s=cfg.renew_ms / 1000, live_deliveries=self._renewable, on_lost=self._lease_lost)
        try:
            pool.start()
            renewer.start()
            log.info("supervising %s on %s: concurrency %d, lease %d ms, renew every %d ms (pid %d)",
                     self.app, self.db_path, cfg.concurrency, cfg.lease_ms, cfg.renew_ms, os.getpid())
            return self._loop(backend, pool, nudges, until_idle)
        finally:
            renewer.stop()
            if nudges is not None:
                nudges.close()
            pool.shutdown(kill=self._stop_requests > 1)
            backend.close()
            for sig, handler in previous_handlers.items():
                signal.signal(sig, handler)

    def _loop(self, backend, pool: Pool, nudges: Optional[NudgeListener], until_idle: bool) -> int:
        cfg = self.config
        beat_s, poll_s = cfg.heartbeat_ms / 1000, cfg.poll_ms / 1000
        next_beat = next_poll = time.monotonic()
        claim_now = True
        grace_deadline: Optional[float] = None
        while True:
            now = time.monotonic()
            if self._stop_requests > 1:
                log.warning("second stop request: killing %d running deliveries", len(pool.busy()))
                return 1
            if self._stop_requests and grace_deadline is None:
                grace_deadline = now + cfg.grace_ms / 1000
                log.info("stopping: no new claims; %d deliveries have %d ms to finish",
                         len(pool.busy()), cfg.grace_ms)
            if grace_deadline is not None:
                if not pool.busy():
                    return 0
                if now >= grace_deadline:
                    self._release_unfinished(backend, pool)
                    return 0
            elif claim_now or now >= next_poll:
                claimed = self._claim(backend, pool)
                next_poll = now + min(poll_s, self._until_next_ready(backend)) if pool.idle() else now + poll_s
                # A full batch means more may be waiting: claim again as soon as a child is free.
                claim_now = claimed > 0 and not pool.idle()
                if until_idle and claimed == 0 and not pool.busy() and not self._work_pending(backend):
                    log.info("idle: nothing running and nothing due")
                    return 0

            if now >= next_beat:
                self._beat(pool)
                next_beat = now + beat_s

            deadline = min(next_beat, next_poll if grace_deadline is None else grace_deadline)
            waitables: list = [nudges] if nudges is not None else []
            owners: list[tuple[object, Child]] = []  # who each waitable belonged to when we waited
            for child in pool.children:
                owners.append((child.conn, child))  # a child's death also shows here, as end of file
                if child.process.sentinel is not None:
                    owners.append((child.process.sentinel, child))
            waitables += [waitable for waitable, _ in owners]
            for ready in wait(waitables, timeout=max(0.0, deadline - time.monotonic())):
                if ready is nudges:
                    nudges.drain()
                    claim_now = True
                    continue
                # Look the owner up as of the wait: a sentinel is a plain fd number, and the child
                # that replaced a dead one earlier in this round may have been given the same one.
                child = next((c for waitable, c in owners if waitable is ready), None)
                if child is None or not any(c is child for c in pool.children):
                    continue  # replaced earlier in this round
                if ready is child.conn and self._receive(backend, pool, child):
                    claim_now = True
                elif ready is not child.conn:
                    self._child_died(pool, child)
                    claim_now = True

    # -- steps of the loop -------------------------------------------------------------------

    def _claim(self, backend, pool: Pool) -> int:
        idle = pool.idle()
        if not idle:
            return 0
        try:
            leases = backend.executions.claim_due(limit=len(idle), duration=self.config.lease_ms)
        except YieldstarError as exc:
            log.warning("claim failed, will retry: %s", exc)
            return 0
        for lease, child in zip(leases, idle):
            delivery = Delivery(lease, time.monotonic())
            with self._lock:
                child.delivery = delivery
            child.last_answer = time.monotonic()
            child.send((RUN, lease.execution_id, lease.token, lease.expires_at))
        self.stats.claimed += len(leases)
        return len(leases)

    def _until_next_ready(self, backend) -> float:
        """Seconds until the next execution becomes claimable (a timer, a backoff, an expiry),
        so that an idle supervisor wakes for it instead of waiting for its next poll."""
        try:
            ready = backend.executions.next_ready_at()
        except YieldstarError:
            return self.config.poll_ms / 1000
        if ready is None:
            return self.config.poll_ms / 1000
        return max(0.005, (ready - backend.clock()) / 1000)

    def _work_pending(self, backend) -> bool:
        """Anything running anywhere, or due now or later: the until-idle test."""
        return backend.executions.next_ready_at() is not None

    def _beat(self, pool: Pool) -> None:
        cfg = self.config
        silent_limit = cfg.heartbeat_ms * cfg.heartbeat_misses / 1000
        now = time.monotonic()
        if self._last_beat_at is not None and now - self._last_beat_at > silent_limit:
            # This process itself was paused (SIGSTOP, an overloaded host): the children's
            # silence is ours. Judge them from now on; the renewer and the fence sort out leases.
            log.warning("the supervisor was paused for %.1f s", now - self._last_beat_at)
            for child in pool.children:
                child.last_answer = now
        self._last_beat_at = now
        for child in list(pool.children):
            if not child.ready:
                if now > child.start_deadline:
                    log.error("worker pid %d did not load the app within %.0f s; replacing it",
                              child.pid, pool.start_timeout_s)
                    self._replace(pool, child)
                continue
            delivery = child.delivery
            if delivery is not None and delivery.lost and not delivery.told_to_stop:
                delivery.told_to_stop = child.send((STOP,))
            child.send((BEAT, delivery.lease.expires_at if delivery else None))
            if child.busy and now - child.last_answer > silent_limit:
                # Frozen, or stuck in C code holding the GIL: the renewer has already stopped
                # renewing it (see _renewable). Kill it and leave its lease to expire.
                delivery = child.delivery
                log.warning("execution %s token %d: worker pid %d silent for %.1f s; killing and replacing it",
                            delivery.lease.execution_id, delivery.lease.token, child.pid, now - child.last_answer)
                self.stats.children_killed += 1
                self._replace(pool, child)

    def _receive(self, backend, pool: Pool, child: Child) -> bool:
        """Handle one message from a child; True when it freed a slot."""
        try:
            message = child.conn.recv()
        except (EOFError, OSError):
            self._child_died(pool, child)  # its end of the pipe closed: it exited or was killed
            return True
        child.last_answer = time.monotonic()
        if message[0] == ALIVE:
            return False
        if not child.ready:
            return self._started(pool, child, message)
        if message[0] != DONE:
            log.error("unexpected message from worker pid %d: %r", child.pid, message[:1])
            return False
        _, execution_id, token, outcome, ms = message
        delivery = child.delivery
        with self._lock:
            child.delivery = None
        if delivery is None or delivery.lease.token != token or delivery.lease.execution_id != execution_id:
            log.error("worker pid %d reported %s token %s, which it was not running", child.pid, execution_id, token)
            return True
        self._settle(backend, delivery, outcome, ms)
        return True

    def _started(self, pool: Pool, child: Child, message: tuple) -> bool:
        """A replacement child's first message: it loaded the app and may take deliveries."""
        error = pool.load_error(message)
        if error is None:
            child.ready, child.start_deadline = True, None
            return True
        # The app no longer loads (edited on disk?). A replacement would fail alike: run on with
        # the children that remain, and stop only when none does.
        log.error("%s\nrunning with %d worker(s) fewer", error, 1)
        pool.reap(child)
        pool.children.remove(child)
        if not pool.children:
            raise AppLoadFailed(error)
        return False

    def _settle(self, backend, delivery: Delivery, outcome, ms: int) -> None:
        lease = delivery.lease
        if isinstance(outcome, (Suspended, Completed, Failed)):
            reply = self._call(backend.executions.acknowledge, lease, outcome)
        elif isinstance(outcome, Retry):
            reply = self._call(backend.executions.release, lease)
            log.info("execution %s token %d asked to retry: %s", lease.execution_id, lease.token,
                     outcome.reason.strip().splitlines()[-1] if outcome.reason.strip() else "")
        else:
            reply = LeaseLost()
        status = "lost" if isinstance(reply, LeaseLost) else reply.status
        if isinstance(reply, LeaseLost) or reply is None:
            self.stats.lost += 1
            status = "lost"
        elif isinstance(outcome, Retry):
            self.stats.released += 1
        else:
            setattr(self.stats, outcome.status, getattr(self.stats, outcome.status) + 1)
        log.info("delivery execution=%s token=%d outcome=%s duration_ms=%d",
                 lease.execution_id, lease.token, status, ms)
        if self._on_delivery is not None:
            self._on_delivery(lease.execution_id, lease.token, status, ms)

    def _call(self, method, lease, *args):
        """A fenced ledger call that retries a busy database: the outcome is worth waiting for."""
        while True:
            try:
                return method(lease, *args)
            except StorageBusy as exc:
                log.warning("%s of %s token %d: %s; retrying", method.__name__, lease.execution_id, lease.token, exc)
                if self._stop_requests > 1:
                    return None

    def _child_died(self, pool: Pool, child: Child) -> None:
        child.process.join(1)
        delivery = child.delivery
        self.stats.child_deaths += 1
        if delivery is not None:
            log.warning("execution %s token %d: worker pid %d %s mid-delivery; its lease is left to expire",
                        delivery.lease.execution_id, delivery.lease.token, child.pid, describe_exit(child.process))
        elif not child.ready:
            log.warning("worker pid %d %s while loading the app; replacing it", child.pid, describe_exit(child.process))
        else:
            log.warning("idle worker pid %d %s; replacing it", child.pid, describe_exit(child.process))
        self._replace(pool, child)

    def _replace(self, pool: Pool, child: Child) -> None:
        with self._lock:
            child.delivery = None
        try:
            pool.replace(child)
        except (YieldstarError, OSError) as exc:
            log.error("could not replace a worker: %s", exc)
            pool.children.remove(child)

    def _release_unfinished(self, backend, pool: Pool) -> None:
        """Grace is over: make sure the children still running are gone, then release their leases."""
        for child in pool.busy():
            delivery = child.delivery
            pool.reap(child)  # killed and joined: it can write nothing more
            reply = self._call(backend.executions.release, delivery.lease)
            log.info("delivery execution=%s token=%d outcome=%s (grace period over)",
                     delivery.lease.execution_id, delivery.lease.token,
                     "released" if not isinstance(reply, LeaseLost) else "lost")
            with self._lock:
                child.delivery = None
        pool.children = [c for c in pool.children if c.process.is_alive()]

    # -- shared with the renewer ----------------------------------------------------------

    def _renewable(self) -> list[Delivery]:
        cfg = self.config
        silent_limit = cfg.heartbeat_ms * cfg.heartbeat_misses / 1000
        now = time.monotonic()
        pool = self._pool
        with self._lock:
            return [c.delivery for c in list(pool.children)
                    if c.delivery is not None and now - c.last_answer <= silent_limit]

    def _lease_lost(self, delivery: Delivery) -> None:
        # Runs on the renewer thread, which must not write to a child's pipe while the loop
        # does: the next heartbeat round tells the worker to stop.
        if not any(c.delivery is delivery for c in list(self._pool.children)):
            return  # the renewal raced the loop's own acknowledgement of this delivery: nothing lost
        log.warning("execution %s token %d: renewal found the lease lost; the worker will be told to stop",
                    delivery.lease.execution_id, delivery.lease.token)

