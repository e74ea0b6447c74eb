"""The child process: load the app once, then run deliveries the supervisor hands over.

With one slot (the default: one delivery per process), the main thread runs each delivery in
turn, and a lost lease or a cancel gets the whole process killed by the supervisor. With more
(`supervise --workers`), the worker runs up to that many at once (`deliveries`: async ones as
tasks of one event loop, sync ones on threads), and the supervisor stops one of them with a
`Stop` message. Either way the parent watch covers every delivery of the process.

The child opens its own connection to the ledger and makes every fenced write itself, with the
token it was sent; the supervisor only acknowledges. Anything a delivery raises that the driver
did not turn into an outcome is reported as `Retry`: a storage error as `Retry(reason,
storage_error=kind)`, like the driver's own, anything else with the traceback, so the supervisor
releases the lease and logs why.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import sys
import time
import traceback
from typing import Optional

from supervisor.ledger.errors import StorageError
from supervisor.ledger.backends import is_uri, open_backend
from supervisor.ledger.sqlite import socket_folder
from supervisor.log_format import configure

from . import tracing
from .abandoned import replace_reason
from .driver import raised_outside, run_delivery
from .parent_watch import ParentWatch, die_with_parent
from .pipe import Pipe
from .protocol import EXIT_APP_FAILED, EXIT_LEDGER_UNUSABLE, EXIT_OK, AppNotLoaded, Done, LedgerNotOpened, Ready, Run
from .loading import describe_load_failure, load_app
from .template import TEMPLATE_FLAG, serve as serve_as_template


def child_main(conn, app: str, db_path: str, durability: str, parent_pid: int, heartbeat_s: float,
               misses: int, slots: int = 1, log_format: str = "text", max_payload_bytes: Optional[int] = None) -> None:
    """Serve deliveries over `conn` until told to exit or orphaned; never returns."""
    die_with_parent(parent_pid)
    # In its supervisor's format: they share a stderr, whose lines must all be JSON or none.
    configure(logging.StreamHandler(sys.stderr), log_format, logging.WARNING, "yieldstar-worker")
    # A worker sends its nudges (ctx.start) from its supervisor's user and environment, so to the
    # same socket folder: when there is none, the supervisor says so once for all its workers,
    # which would each repeat it, and again every time one is replaced.
    logging.getLogger(socket_folder.LOGGER).setLevel(logging.ERROR)
    # `kill -USR1 <worker pid>` prints every thread's stack to the supervisor's log.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # Ctrl-C in a terminal signals the whole process group, and so do service managers stopping a
    # service (systemd's default KillMode sends SIGTERM to every process of the unit): shutting
    # down, and the grace period it gives running deliveries, is the supervisor's call.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    watch = ParentWatch(conn, parent_pid, heartbeat_s, misses)
    try:
        registry = load_app(app)
    except BaseException as exc:
        # The first line is the whole story for the operator; the traceback follows for --verbose.
        conn.send(AppNotLoaded(os.getpid(), f"cannot load app {app}: {describe_load_failure(exc)}\n"
                               + traceback.format_exc()))
        os._exit(EXIT_APP_FAILED)
    backend = _open_ledger(conn, db_path, durability, max_payload_bytes)
    watch.start()
    queues = tuple((q.name, q.concurrency, q.per_key, *(q.rate or (None, None))) for q in registry.queues())
    defaults = tuple((name, *default) for name, default in registry.defaults().items())
    watch.send(Ready(os.getpid(), tuple(sorted(registry.names())), tuple(registry.schedules()), queues, defaults))
    if slots > 1:
        # Imported here: a worker of one delivery has no use for its thread pool and group commit.
        from .deliveries import serve_many

        serve_many(backend, registry, watch, slots)

    while True:
        task = watch.next_task()
        if task is None:
            break
        if not isinstance(task, Run):
            continue  # a `Stop`: a one-slot worker is killed instead, and is never sent one
        lease = task.lease
        started = time.monotonic()
        steps: list[float] = []
        try:
            outcome = run_delivery(backend, lease, registry, may_write=watch.may_write, claimed_at=task.claimed_at,
                                   start=task.start, trace_context=task.trace_context, step_seconds=steps)
        except Exception as exc:
            outcome = raised_outside(exc)
        watch.send(Done(lease.execution_id, lease.token, outcome, int((time.monotonic() - started) * 1000),
                        replace_reason(), tuple(steps)))
    backend.close()
    tracing.flush()  # os._exit runs no atexit hook: the spans a batch still holds go now
    os._exit(EXIT_OK)


def _open_ledger(conn, db_path: str, durability: str, max_payload_bytes: Optional[int]):
    """The child's own connection. A transient storage error (a full disk, a lock held while the
    file is created) is waited out: it says nothing about the app, and a supervisor gives up on a
    child that does not start within its start timeout anyway. A lasting one is reported as what
    it is, so that the supervisor stops with it instead of taking it for a broken app."""
    delay = 0.05
    while True:
        try:
            return open_backend(db_path, durability=durability, max_payload_bytes=max_payload_bytes)
        except StorageError as exc:
            if not exc.transient:
                conn.send(LedgerNotOpened(os.getpid(), str(exc), exc.kind))
                os._exit(EXIT_LEDGER_UNUSABLE)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def main(argv: list[str]) -> None:
    """Serve as `boot` was asked to: `argv` is `[.../boot.py, SETTINGS_JSON]`, or for the
    template process that forks workers `[.../boot.py, TEMPLATE_FLAG, SETTINGS_JSON]`."""
    settings = json.loads(argv[-1])
    # After yieldstar's own packages were imported (this module's imports): the app's folder
    # comes first for the app's imports, and cannot take their place.
    for entry in reversed(settings["sys_path"]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    if argv[1:2] == [TEMPLATE_FLAG]:
        _preload(settings["db_path"], settings.get("slots", 1))
        # Returns in each worker it forks, with that worker's pipe.
        settings["fd"] = serve_as_template(settings["control_fd"], settings["app"], settings["parent_pid"])
    child_main(Pipe(settings["fd"]), settings["app"], settings["db_path"], settings["durability"],
               settings["parent_pid"], settings["heartbeat_s"], settings["misses"], settings.get("slots", 1),
               settings.get("log_format", "text"), settings.get("max_payload_bytes"))


def _preload(db_path: str, slots: int) -> None:
    """In the template: import what every worker it forks will import, once for all of them."""
    if slots > 1:
        from . import deliveries  # noqa: F401
    if is_uri(db_path):
        try:
            from supervisor.ledger.postgres import backend  # noqa: F401
        except ImportError:  # no psycopg: each worker reports it, as it would without a template
            pass
