"""The supervisor: claims due executions, hands them to child processes, acknowledges outcomes.

    supervisor process                                          child processes (pool)
    +-----------------------------------------------+          +-------------------------+
    | dispatcher loop (main thread): owns all state |  Run(lease, claimed_at, start)        |
    |   wait() on pipes, child sentinels, nudges,   |--------> | run_delivery            |
    |   signals and the two ledger wake-ups         |  Stop(id, token) (--workers only)     |
    |   claim / beat / renew / settle as steps      |  Beat(expires) / Alive()               |
    |        | submit             ^ replies         |<-------- |   write_step(token) --+  |
    | ledger thread: claim_deliveries, acknowledge, |  Done(id, token, outcome, ms)     |  |
    |   release, next_ready_at (own connection)     |          | parent watch thread   |  |
    | renewal thread: renew (own connection)        |          +-----------------------|--+
    +--------|--------------------------------------+                                  |
             v                                                                         v
        SQLite ledger file (WAL) <-------- fenced by the token, in the same transaction

By default each child runs one delivery at a time (`concurrency` children). With `workers=P`
there are P children, each running up to ceil(concurrency / P) deliveries at once: async
workflows as tasks of one event loop, sync ones on threads (`worker._runtime.deliveries`), each
with its own token and fenced writes on the child's one connection.

The parent holds the leases; children make their own fenced step writes with the token they
were sent. Heartbeats run both ways over each child's pipe: a child that stops hearing its
supervisor stops writing and exits (`worker._runtime.parent_watch`); a busy child that stops answering
is no longer renewed, is killed and replaced, and its lease is left to expire. A child that dies
is replaced and its lease is left to expire too: the execution is delivered again later. (A
child of several deliveries that dies or is killed has each of them released at once instead,
once it is confirmed gone: see `loop`.)

The loop never waits for the database (`ledger_calls`): a write lock held by another process,
a full disk or a slow file system delays claims and acknowledgements, never a heartbeat. Storage
errors are replies like any other: a transient one (busy, disk full, I/O) is logged and the call
is made again after a backoff; a lasting one (a corrupt, deleted or foreign file) stops the
supervisor with exit code 5 and a message that says what to do.

Routing (SPEC section 11): each worker reports the workflows its app registers when it is ready,
and the supervisor claims only those (`serving`): executions of other workflows are left to the
supervisors that serve them, and `--until-idle` does not wait for them. While it runs, the
supervisor has a row among the ledger's live supervisors (`backend.supervisors`), seen again at
every renewal round and removed at a clean exit.

The app is loaded before the ledger is opened: the workers start first, and the supervisor
opens its connections once one of them reports that it loaded the app (they open the ledger only
then, too). An app that cannot be loaded (a mistyped path, a syntax error, an exception on
import) stops the supervisor with `AppLoadFailed` and leaves no ledger file behind. This costs
no time, as nothing can be delivered before a worker has loaded the app anyway.

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
from typing import Callable, Optional

from worker._runtime.loading import check_app_name

from .delivery_metrics import DeliveryMetrics
from .ledger import arguments
from .ledger.backends import open_backend, shown
from .ledger.errors import AppLoadFailed, AppNotFound, InvalidArgument, LedgerUnusable, StorageError
from .ledger_calls import INLINE_SLOW_S, LedgerCalls, Wakeup
from .log_format import LogFormat
from .loop import EXIT_KILLED, EXIT_LEDGER_UNUSABLE, EXIT_STOPPED, DispatchLoop
from .pool import MAX_CONCURRENCY, MAX_WORKERS, Pool

log = logging.getLogger("yieldstar.supervisor")

__all__ = ["Supervisor", "SupervisorConfig", "Stats", "EXIT_STOPPED", "EXIT_KILLED", "EXIT_LEDGER_UNUSABLE"]


@dataclass(frozen=True)
class SupervisorConfig:
    """Timings are in ms. A lease must outlast several renewals, so that one late renewal (a busy
    database, a slow machine) does not lose it: `renew_ms` must be below `lease_ms`. Left out,
    `renew_ms` is a third of the lease and `heartbeat_ms` 1000, or a tenth of the lease when
    that is shorter."""

    concurrency: int = 4
    workers: Optional[int] = None  # worker processes; None: one per delivery (`concurrency` of them)
    lease_ms: int = 30_000
    renew_ms: Optional[int] = None
    heartbeat_ms: Optional[int] = None
    heartbeat_misses: int = 3  # silent intervals before a child gives up on us, or we on it
    poll_ms: int = 500
    grace_ms: int = 10_000
    durability: str = "normal"
    listen: bool = True  # False: no nudges (a pooler that cannot LISTEN); new work is found by polling
    log_format: LogFormat = LogFormat.TEXT  # the workers' log lines: as the supervisor's (`log_format`)
    # The size limit of a payload the supervisor and its workers write (a step's result, a
    # workflow's result or error), in bytes of UTF-8 JSON; None: the ledger's default (4 MiB).
    max_payload_bytes: Optional[int] = None

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
            raise InvalidArgument(f"concurrency must be at most {MAX_CONCURRENCY}, got {self.concurrency}:"
                                  " run more supervisors on the same ledger for more")
        if self.workers is None and self.concurrency > MAX_WORKERS:
            raise InvalidArgument(
                f"concurrency must be at most {MAX_WORKERS} without workers (one process per delivery), got"
                f" {self.concurrency}: add --workers P (workers=P), P up to {MAX_WORKERS}, to run up to"
                f" {MAX_CONCURRENCY:,} deliveries in P processes")
        if self.workers is not None:
            if not isinstance(self.workers, int) or isinstance(self.workers, bool) or not 1 <= self.workers <= MAX_WORKERS:
                raise InvalidArgument(f"workers must be an int from 1 to {MAX_WORKERS}, got {self.workers!r}")
        arguments.boolean("listen", self.listen)
        try:
            object.__setattr__(self, "log_format", LogFormat(self.log_format))
        except ValueError:
            raise InvalidArgument(f"log_format must be one of {', '.join(f.value for f in LogFormat)},"
                                  f" got {self.log_format!r}") from None
        if self.max_payload_bytes is not None:
            arguments.max_payload_bytes("max_payload_bytes", self.max_payload_bytes)
        if not isinstance(self.grace_ms, int) or isinstance(self.grace_ms, bool) or self.grace_ms < 0:
            raise InvalidArgument(f"grace_ms must be an int >= 0, got {self.grace_ms!r}")
        if self.renew_ms >= self.lease_ms:
            raise InvalidArgument(f"renew_ms ({self.renew_ms}) must be less than lease_ms ({self.lease_ms})")

    @property
    def processes(self) -> int:
        """How many worker processes run: `workers`, or one per delivery."""
        return self.concurrency if self.workers is None else self.workers

    @property
    def slots(self) -> int:
        """How many deliveries one worker process runs at once: ceil(concurrency / workers)."""
        return -(-self.concurrency // self.processes)

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
    unconfirmed: int = 0  # deliveries stopped because no renewal confirmed their lease in time
    storage_errors: int = 0


class Supervisor:
    def __init__(self, db_path: str, app: str, config: SupervisorConfig = SupervisorConfig(), *,
                 on_delivery: Optional[Callable[[str, int, str, int], None]] = None,
                 metrics: Optional[DeliveryMetrics] = None, reap_orphans: bool = False):
        """
        Args:
            db_path: the ledger file, shared with any other supervisor on this host.
            app: the user's workflows, as a module name or a .py path (loaded by each child).
            on_delivery: called after each delivery with (execution_id, token, outcome, ms).
            metrics: told of each claim, step report, delivery's end and storage error (the
                `PrometheusMetrics` of `supervise --metrics`); None: nobody is.
            reap_orphans: every child of this process is the supervisor's (`yieldstar supervise`):
                it may wait for the orphans a worker leaves behind, which it adopts (see `template`).
        """
        self.db_path = db_path
        self.app = app
        self.config = config
        self.stats = Stats()
        self._on_delivery = on_delivery
        self._metrics = metrics
        self._reap_orphans = reap_orphans
        self._stop_requests = 0
        self._signals = Wakeup()
        self._pool: Optional[Pool] = None
        self._loop: Optional[DispatchLoop] = None

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
        try:
            check_app_name(self.app)  # a mistyped APP is refused at once, before any process starts
        except AppNotFound as exc:
            raise AppLoadFailed(f"cannot load app {self.app}: {exc}") from None
        previous_handlers = self._install_signal_handlers()
        pool = Pool(cfg.processes, app=self.app, db_path=self.db_path, durability=cfg.durability,
                    max_payload_bytes=cfg.max_payload_bytes,
                    heartbeat_s=cfg.heartbeat_ms / 1000, misses=cfg.heartbeat_misses, slots=cfg.slots,
                    log_format=cfg.log_format, reap_orphans=self._reap_orphans)
        self._pool = pool
        calls = renewals = nudges = loop = None
        try:
            pool.start()
            # The ledger is opened only once the app is known to load: an app that cannot be
            # loaded leaves no ledger file behind (a mistyped path must not create a database).
            first = pool.wait_for_the_app(self._signals, lambda: self._stop_requests > 0)
            if self._stop_requests:
                log.info("stopped while the workers were loading the app", extra={"event": "supervisor_stopped"})
                return EXIT_STOPPED
            try:
                # A call made on the spot holds up the heartbeats: one that takes a tenth of
                # their tolerance sends the next ones to the thread for a while.
                calls = self._ledger_calls("ledger-calls", gathering=True, inline=True,
                                           inline_slow_s=min(INLINE_SLOW_S, cfg.silent_limit_s / 10))
                if calls is not None:
                    renewals = self._ledger_calls("lease-renewals")
            except LedgerUnusable as exc:
                log.error("%s", exc, extra={"event": "ledger_unusable"})
                return EXIT_LEDGER_UNUSABLE
            if calls is None or renewals is None:
                log.info("stopped while waiting for the ledger", extra={"event": "supervisor_stopped"})
                return EXIT_STOPPED
            if not cfg.listen:
                log.info("not listening for nudges: new work is found by polling every %d ms", cfg.poll_ms,
                         extra={"event": "polling_only", "poll_ms": cfg.poll_ms})
            else:
                try:
                    nudges = calls.backend.listen_for_due()
                except (OSError, StorageError) as exc:
                    log.warning("no nudge socket (%s): new work is found by polling every %d ms", exc, cfg.poll_ms,
                                extra={"event": "no_nudge_socket", "poll_ms": cfg.poll_ms})
            loop = self._loop = DispatchLoop(cfg, self.stats, pool, calls, renewals, signals=self._signals,
                                             stop_requests=lambda: self._stop_requests, nudges=nudges,
                                             until_idle=until_idle, on_delivery=self._on_delivery,
                                             metrics=self._metrics)
            shape = "" if cfg.slots == 1 else f" in {cfg.processes} workers of up to {cfg.slots} deliveries"
            log.info("supervising %s on %s: concurrency %d%s, lease %d ms, renew every %d ms (pid %d)",
                     self.app, shown(self.db_path), cfg.concurrency, shape, cfg.lease_ms, cfg.renew_ms, os.getpid(),
                     extra={"event": "supervisor_started", "supervisor_id": loop.supervisor_id, "app": self.app,
                            "concurrency": cfg.concurrency, "workers": cfg.processes, "slots": cfg.slots,
                            "lease_ms": cfg.lease_ms, "renew_ms": cfg.renew_ms})
            if first is not None:
                loop.started(*first)
            try:
                return loop.run()
            except AppLoadFailed as exc:
                if str(exc).startswith("cannot load app"):
                    raise
                raise AppLoadFailed(f"cannot load app {self.app}: {exc}") from None
        finally:
            if nudges is not None:
                nudges.close()
            killed = self._stop_requests > 1 or loop is None or loop.fatal is not None
            pool.shutdown(kill=killed)
            # Told to stop at once, or with nothing left to write: do not wait for a busy database.
            if loop is not None and not killed:
                loop.deregister()  # after the calls in flight, before the threads stop
            self._close(calls, renewals, timeout=0.5 if killed else 5.0)
            self._restore(previous_handlers)

    def _ledger_calls(self, name: str, *, inline: bool = False, **options) -> Optional[LedgerCalls]:
        """A ledger thread with a backend of its own, and with `inline` one more for the calls
        made on the spot where the backend has one (`spot_twin`: on SQLite, one that gives up at
        once on a busy file, and whose commits sync nothing). A transient storage error (a
        server restarting, a session killed, a busy file) is waited out with a growing delay, as
        a child waits it out: it costs time, not the supervisor. None if told to stop meanwhile."""
        delay = 0.05
        while True:
            backend = spot = None
            try:
                backend = open_backend(self.db_path, durability=self.config.durability,
                                       max_payload_bytes=self.config.max_payload_bytes)
                if inline:
                    spot = backend.spot_twin()
                return LedgerCalls(backend, name, inline=spot, **options)
            except StorageError as exc:
                for opened in (backend, spot):
                    if opened is not None:
                        opened.close()
                if not exc.transient:
                    raise
                if delay == 0.05:
                    log.warning("cannot open the ledger yet, will retry: %s", exc, extra={"event": "ledger_retry"})
            if self._stop_requests:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    @property
    def workflows(self) -> Optional[frozenset[str]]:
        """The workflows this supervisor serves (claims): None until its first worker reported
        them (see `serving`)."""
        loop = self._loop
        return None if loop is None else loop.workflows

    @property
    def running(self) -> int:
        """Deliveries running now: for a status line, read from any thread."""
        pool = self._pool
        return 0 if pool is None else sum(len(child.deliveries) for child in list(pool.children))

    @property
    def workers(self) -> int:
        """Worker processes now (started, loading the app or ready): for a status line."""
        pool = self._pool
        return 0 if pool is None else len(pool.children)

    @property
    def workers_up(self) -> int:
        """Worker processes that loaded the app and take deliveries: for a status line."""
        pool = self._pool
        return 0 if pool is None else pool.up

    @staticmethod
    def _close(*all_calls: Optional[LedgerCalls], timeout: float = 5.0) -> None:
        for calls in all_calls:
            if calls is not None:
                calls.close(timeout)

    @staticmethod
    def _restore(previous_handlers: dict) -> None:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
