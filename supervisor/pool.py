"""The pool of child processes that run deliveries: started once, reused, replaced when they die.

Each child is a fresh interpreter (`python .../worker/_runtime/boot.py`), started by
fork-and-exec, which is safe beside the supervisor's threads (a bare fork could copy a lock
another thread holds), and which, unlike multiprocessing's `spawn`, never re-imports the
supervisor's `__main__`. It is started by the path of its first file, not with `-m`, so that a
`worker.py` or `supervisor.py` in its working folder (often the app's) cannot take the place of
yieldstar's packages (see `worker._runtime.boot`). On Linux, one such interpreter, the
template, imports the runtime and the app once and forks each worker (`template`): a fork is
milliseconds where an interpreter's imports are a tenth of a second of CPU, and hundreds of
workers are up in seconds on a small machine. The child
gets one end of a Unix socket pair as its pipe. Each child loads the user's app once, at start,
and then runs one delivery at a time, or up to `slots` at once (`supervise --workers`). Nothing here waits for a child to load the app: the
dispatcher reads each child's first report (`Ready`, or why not) like any other message, beating the children that are
ready while the others load.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Optional

from worker._runtime import protocol
from worker._runtime.protocol import EXIT_CODES, AppNotLoaded, Exit, FromChild, ToChild
from worker._runtime.template import TEMPLATE_FLAG

from .ledger.backends import anywhere
from .ledger.errors import AppLoadFailed, DiedWhileStarting
from .ledger.values import ExecutionLease
from .template import Template, reap_orphans, set_child_subreaper

log = logging.getLogger("yieldstar.supervisor")

# What a child process runs, by its path.
BOOT = os.path.join(os.path.dirname(os.path.abspath(protocol.__file__)), "boot.py")


def is_worker_command(command: Sequence[str]) -> bool:
    """Whether a process's command line (`psutil.Process.cmdline()`) is a pool child's (and not
    the template process's, which forks them)."""
    return BOOT in command[1:2] and TEMPLATE_FLAG not in command[2:3]


def is_template_command(command: Sequence[str]) -> bool:
    """Whether a process's command line is a pool's template process's (`template`)."""
    return BOOT in command[1:2] and TEMPLATE_FLAG in command[2:3]


class ChildProcess:
    """A child's process handle, with a `sentinel` that `multiprocessing.connection.wait()`
    reports ready when the process ends (a pidfd on Linux)."""

    def __init__(self, popen: subprocess.Popen):
        self._popen = popen
        self.pid = popen.pid
        self._pidfd: Optional[int] = None
        if hasattr(os, "pidfd_open"):
            try:
                self._pidfd = os.pidfd_open(popen.pid)
            except OSError:  # pragma: no cover - kernels before 5.3
                self._pidfd = None

    @property
    def sentinel(self):
        return self._pidfd

    @property
    def exitcode(self) -> Optional[int]:
        return self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def kill(self) -> None:
        if self.is_alive():
            try:
                self._popen.kill()
            except ProcessLookupError:  # pragma: no cover - exited in between
                pass

    def join(self, timeout: Optional[float] = None) -> None:
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


# Workers killed while starting are started again; this many such deaths in a row per worker,
# before any worker has loaded the app, stop the supervisor: a stray kill must not take it down,
# an app whose import always crashes the interpreter must.
START_ATTEMPTS = 3

# At most this many children load the app at once: a start-up of hundreds of workers on a small
# machine must not thrash, and the ones that are ready take deliveries while the rest load.
MAX_STARTING = 8
# Forked from the template, a worker has only its ledger connection to open: this many at once.
MAX_FORKED_STARTING = 64
# How long one turn of the dispatcher loop may spend starting workers (a fork is milliseconds):
# the workers already up must still hear their heartbeats.
TOP_UP_BUDGET_S = 0.05

# Worker processes per supervisor: past a few hundred, a host runs out of memory (each worker is
# an interpreter with the app loaded) long before it runs out of work. More deliveries at once
# come from several per worker (`--workers`), up to MAX_CONCURRENCY, and past that from more
# supervisors sharing the ledger.
MAX_WORKERS = 256
MAX_CONCURRENCY = 10_000


@dataclass
class Delivery:
    """One lease being worked on, from its claim to the reply that ends it."""

    lease: ExecutionLease
    claimed_at: int  # the ledger time of the claim (ms)
    workflow: str = ""  # as the claim found it ("" for a placeholder: tests of the loop by hand)
    # Until when (monotonic s) the ledger has confirmed the lease: the claim or the last renewal
    # that succeeded was sent at T, so the lease it set lasts at least until T + the lease length
    # by the ledger's clock. Past it, another holder may have the execution
    # (see `DispatchLoop.stop_unconfirmed`).
    held_until: float = 0.0
    renew_sent_at: float = 0.0  # when the renewal in flight was sent
    lost: bool = False  # the ledger said the lease is no longer ours
    renewing: bool = False  # a renewal is in flight
    outcome: object = None  # once the child replied: what to acknowledge (or Retry: release)
    ms: int = 0  # how long the child took
    retry_at: float = 0.0  # after a storage error: when to try the acknowledgement again
    failures: int = 0  # storage errors in a row on its acknowledgement or release
    # In a worker of several deliveries, once it was told to stop (`Stop`): when, and why.
    stop_sent_at: Optional[float] = None
    stop_why: str = ""
    release_on_stop: bool = False  # stopped unconfirmed: give the lease back once it stops
    # For the metrics (`delivery_metrics`): its execution's queue (its workflow is above), and
    # when (monotonic s) its claim's reply came.
    queue: str = ""
    since: float = 0.0

    @property
    def key(self) -> tuple:
        """(execution id, token): what its worker's report names."""
        if self.lease is None:  # a placeholder (tests of the loop by hand)
            return (None, id(self))
        return (self.lease.execution_id, self.lease.token)

    @property
    def log_fields(self) -> dict:
        """What a log line about it carries (`log_format`): its execution, token and workflow."""
        return {"execution_id": self.lease.execution_id, "token": self.lease.token, "workflow": self.workflow or None}


@dataclass
class Child:
    process: ChildProcess
    conn: object  # multiprocessing.connection.Connection
    pid: int
    last_answer: float = field(default_factory=time.monotonic)
    ready: bool = False  # False until it reports that it loaded the app
    launched: float = field(default_factory=time.monotonic)
    start_deadline: Optional[float] = None  # while not ready: when to give up on it
    slots: int = 1  # deliveries it runs at once
    workflows: Optional[frozenset] = None  # what its app registers, once it is ready
    # What it runs, by (execution id, token): handed over and not yet reported done.
    deliveries: dict[tuple, Delivery] = field(default_factory=dict)

    @property
    def busy(self) -> bool:
        return bool(self.deliveries)

    @property
    def free(self) -> int:
        """How many more deliveries it may take."""
        return self.slots - len(self.deliveries)

    @property
    def delivery(self) -> Optional[Delivery]:
        """The delivery of a one-slot worker (any one of them for more slots), None if idle."""
        return next(iter(self.deliveries.values()), None)

    @delivery.setter
    def delivery(self, delivery: Optional[Delivery]) -> None:
        """Make `delivery` the only one it runs (None: none)."""
        self.deliveries = {} if delivery is None else {delivery.key: delivery}

    def take(self, delivery: Delivery) -> None:
        self.deliveries[delivery.key] = delivery

    def drop(self, delivery: Delivery) -> None:
        self.deliveries.pop(delivery.key, None)

    def send(self, message: ToChild) -> bool:
        """False if the child's end of the pipe is gone (the child died or is dying)."""
        try:
            self.conn.send(message)
            return True
        except (OSError, ValueError):
            return False


def describe_exit(process) -> str:
    """Why a child process ended, from its exit code: a code we gave it, another code, or a signal."""
    code = process.exitcode
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"{EXIT_CODES.get(code, 'exited')} (exit code {code})"


class Pool:
    def __init__(self, size: int, *, app: str, db_path: str, durability: str, heartbeat_s: float, misses: int,
                 start_timeout_s: float = 60.0, slots: int = 1, log_format: str = "text",
                 max_payload_bytes: Optional[int] = None, template: bool = True,
                 reap_orphans: bool = False):
        """`size` worker processes, each running up to `slots` deliveries at once, each opening
        the ledger as the supervisor does (`durability`, `max_payload_bytes`), logging in
        `log_format` (`log_format.LogFormat`) on the stderr they share with the supervisor;
        forked from a template process where one can be used (`template`), else each a fresh
        interpreter. `reap_orphans`: every child of this process is the pool's (see `reap_orphans`)."""
        self.size = size
        self.slots = slots
        self.log_format = log_format
        self._args = (app, db_path, durability)
        self._max_payload_bytes = max_payload_bytes
        self._heartbeat_s = heartbeat_s
        self._misses = misses
        self.start_timeout_s = start_timeout_s
        self.children: list[Child] = []
        self.template: Optional[Template] = None  # while it forks the workers
        self._use_template = template
        self._reaps_orphans = reap_orphans
        self._subreaper = False  # this process was made a child subreaper, to adopt forked workers
        self.started_at = time.monotonic()

    def start(self) -> None:
        """Start the first children and return at once.

        Nothing here waits for a child: each reports that it loaded the app (or why it could
        not) with a message the dispatcher reads like any other, and takes deliveries only
        then, while the dispatcher beats the ones already ready and acts on stop signals.
        `top_up` starts the rest as the first ones finish loading. With a template process, the
        first ones are forked once it has imported the app (`wait_for_the_app`)."""
        self.started_at = time.monotonic()
        if self._use_template and set_child_subreaper(True):
            self._subreaper = True
            template = Template(BOOT, self._settings())
            try:
                template.start()
                self.template = template
            except OSError as exc:
                log.warning("cannot start the template process (%s): each worker is started as a fresh interpreter",
                            exc, extra={"event": "template_failed"})
        if self.template is None:
            self.top_up()

    def top_up(self, budget_s: Optional[float] = None, wait: bool = True) -> int:
        """Start children until the pool has `size` of them, at most MAX_STARTING loading at
        once (MAX_FORKED_STARTING forked ones), and, with `budget_s`, for about that long at
        most (the caller's loop has beats to send): returns how many were started. Without
        `wait`, workers are asked of the template and taken on a later call once it answered
        (`forking`): the dispatcher loop never waits for another process to be scheduled."""
        began = time.monotonic()
        started = 0
        if self.template is not None and not self.template.ready:
            return 0  # it is still importing the app: the first workers are forked once it has
        if self.template is not None and self.template.forking:
            fresh = [self._child(*launched) for launched in self._collect()]
            self.children += fresh
            started += len(fresh)
        loading = sum(1 for c in self.children if not c.ready)
        limit = MAX_FORKED_STARTING if self.template is not None else MAX_STARTING
        while len(self.children) < self.size and loading < limit:
            if started and budget_s is not None and time.monotonic() - began >= budget_s:
                break
            if not wait and self.template is not None:
                if not self.template.forking:
                    try:
                        self.template.request(min(self.size - len(self.children), limit - loading))
                    except OSError as exc:
                        self._template_failed(exc)
                        continue
                break
            fresh = [self._child(*launched) for launched in self._launch(min(self.size - len(self.children),
                                                                             limit - loading))]
            self.children += fresh
            loading += len(fresh)
            started += len(fresh)
        return started

    @property
    def forking(self) -> bool:
        """Workers were asked of the template and are not yet taken (`top_up(wait=False)`)."""
        return self.template is not None and self.template.forking > 0

    def _collect(self) -> list[tuple]:
        """The workers the template forked since it was asked, if it answered."""
        try:
            return self.template.collect()
        except OSError as exc:
            self._template_failed(exc)
            return []

    def _template_failed(self, exc: OSError) -> None:
        log.warning("the template process failed (%s): each worker from now on is started as a fresh"
                    " interpreter", exc, extra={"event": "template_failed"})
        self.drop_template()

    def _fresh(self) -> Child:
        return self._child(*self._launch(1)[0])

    def _child(self, process, conn) -> Child:
        return Child(process, conn, process.pid, start_deadline=time.monotonic() + self.start_timeout_s,
                     slots=self.slots)

    def _settings(self) -> dict:
        """What a child is told (the template too): its pipe's descriptor is added to it."""
        app, db_path, durability = self._args
        return {
            "app": app, "db_path": anywhere(db_path), "durability": durability,
            "max_payload_bytes": self._max_payload_bytes, "parent_pid": os.getpid(),
            "heartbeat_s": self._heartbeat_s, "misses": self._misses, "slots": self.slots,
            "log_format": self.log_format,
            # The child imports what the supervisor could import, as multiprocessing would arrange.
            "sys_path": [p for p in sys.path if p],
        }

    def _launch(self, count: int) -> list[tuple]:
        """Up to `count` new children's (process, this end of its pipe): forked by the template
        (one batch), or one fresh interpreter."""
        if self.template is not None and self.template.ready:
            try:
                return self.template.fork(count)
            except OSError as exc:
                self._template_failed(exc)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        settings = dict(self._settings(), fd=theirs.fileno())
        try:
            popen = subprocess.Popen([sys.executable, BOOT, json.dumps(settings)],
                                     pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        return [(ChildProcess(popen), Connection(ours.detach()))]

    def wait_for_the_app(self, wakeup, stopping: Callable[[], bool]) -> tuple[Child, FromChild] | None:
        """Wait for the first child's report on loading the app, before the ledger is opened.

        Returns `(child, message)`, a report the dispatcher hands on to its loop: the app loaded
        (or the ledger could not be opened, which is the loop's to report). Raises
        `AppLoadFailed` if the app cannot be loaded, and `DiedWhileStarting` if every attempt
        dies before reporting. Returns None if `stopping()` turns true first (`wakeup` is
        readable then), or once a child outlives its start deadline (the loop deals with it).
        This costs no time: no delivery can begin before a child has loaded the app anyway."""
        if self.template is not None and not self.template.ready:
            if not self._wait_for_the_template(wakeup, stopping):
                return None
            # A few only: the ones ready before the dispatcher loop runs have nobody to beat them.
            self.top_up(budget_s=TOP_UP_BUDGET_S)
        deaths = 0
        while not stopping():
            owners: list[tuple[object, Child]] = []
            for child in self.children:
                owners.append((child.conn, child))
                if child.process.sentinel is not None:
                    owners.append((child.process.sentinel, child))
            deadline = min(c.start_deadline for c in self.children if c.start_deadline is not None)
            if time.monotonic() >= deadline:
                return None
            ready = wait([wakeup] + [w for w, _ in owners], timeout=deadline - time.monotonic())
            for waitable in ready:
                child = next((c for w, c in owners if w is waitable), None)
                if child is None or not any(c is child for c in self.children):
                    continue  # the wakeup, or a child replaced earlier in this round
                try:
                    # A child that reported and then exited shows on both: its report comes first.
                    message = child.conn.recv() if child.conn.poll(0) else None
                except (EOFError, OSError):
                    message = None  # its end of the pipe closed: it died
                if message is not None:
                    child.last_answer = time.monotonic()  # heard from: its silence counts from now
                    if isinstance(message, AppNotLoaded):
                        raise AppLoadFailed(message.error)
                    return child, message
                child.process.join(1)  # it died before reporting (its sentinel, or end of file, says so)
                deaths += 1
                if deaths >= START_ATTEMPTS * self.size:
                    raise DiedWhileStarting(f"cannot load app {self._args[0]}: a worker process died while"
                                            f" loading it, {deaths} times in a row"
                                            f" (last: {describe_exit(child.process)})")
                log.warning("worker pid %d %s while loading the app; replacing it", child.pid,
                            describe_exit(child.process),
                            extra={"event": "worker_died", "worker_pid": child.pid,
                                   "exit": describe_exit(child.process)})
                self.replace(child)
        return None

    def _wait_for_the_template(self, wakeup, stopping: Callable[[], bool]) -> bool:
        """Wait until the template has imported the app, and keep it if it can fork workers
        (else each worker is started as a fresh interpreter). False if `stopping()` turns true
        first."""
        template = self.template
        deadline = time.monotonic() + self.start_timeout_s
        while not stopping():
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("the template process did not import the app within %.0f s: each worker is started as"
                            " a fresh interpreter", self.start_timeout_s, extra={"event": "template_failed"})
                self.drop_template()
                return True
            if template.control in wait([wakeup, template.control], left):
                answer = template.take_answer()
                if answer is None:
                    template.join(1.0)
                    log.warning("the template process died while importing the app (%s): each worker is started as a"
                                " fresh interpreter", describe_exit(template), extra={"event": "template_failed"})
                    self.drop_template()
                elif not answer:
                    log.info("the app starts a thread when imported, so workers cannot be forked from a template"
                             " process: each is started as a fresh interpreter", extra={"event": "template_unused"})
                    self.drop_template()
                return True
        return False

    def drop_template(self) -> None:
        """Stop the template process (if any): the workers it forked run on."""
        if self.template is not None:
            self.template.close()
            self.template = None

    def reap_orphans(self) -> int:
        """Wait for exited children that are neither workers nor the template: orphans a worker
        left, adopted as their subreaper. Only where every child of this process is the pool's
        (`yieldstar supervise`): another child's exit status would be taken from its owner."""
        if not (self._subreaper and self._reaps_orphans):
            return 0
        known = {c.pid for c in self.children}
        if self.template is not None and self.template.pid is not None:
            known.add(self.template.pid)
        return reap_orphans(known)

    def replace(self, child: Child, wait: bool = True) -> None:
        """Kill `child` if it still runs, make sure it is gone, and start another in its place.

        Returns at once: the new child is not `ready` until it reports that it loaded the app.
        Without `wait`, a worker forked by the template is only asked for: `top_up` takes it."""
        self.reap(child)
        if not wait and self.template is not None:
            self.children.remove(child)
            return
        self.children[self.children.index(child)] = self._fresh()

    def remove(self, child: Child) -> None:
        """Kill `child` if it still runs, make sure it is gone, and run on without it."""
        self.reap(child)
        self.children.remove(child)

    @staticmethod
    def reap(child: Child) -> None:
        child.process.kill()
        child.process.join()
        child.process.close()
        child.conn.close()

    @property
    def up(self) -> int:
        """How many children loaded the app (read from any thread: a status line)."""
        return sum(1 for c in list(self.children) if c.ready)

    def idle(self) -> list[Child]:
        """The ready children with a free slot."""
        return [c for c in self.children if c.ready and c.free > 0]

    def busy(self) -> list[Child]:
        return [c for c in self.children if c.busy]

    def shutdown(self, *, kill: bool = False, timeout_s: float = 5.0) -> None:
        """Ask every child to exit (or kill them), and wait until each is gone."""
        for child in self.children:
            if kill or not child.ready:  # one still loading the app has nothing to finish
                child.process.kill()
            else:
                child.send(Exit())
        deadline = time.monotonic() + timeout_s
        for child in self.children:
            child.process.join(max(0.0, deadline - time.monotonic()))
            self.reap(child)
        self.children = []
        self.drop_template()
        if self._subreaper:
            set_child_subreaper(False)
            self._subreaper = False
