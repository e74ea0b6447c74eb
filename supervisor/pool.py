"""The pool of child processes that run deliveries: started once, reused, replaced when they die.

Each child is a fresh interpreter (`python -m worker.child`), started by fork-and-exec, which is
safe beside the supervisor's threads (a bare fork could copy a lock another thread holds), and
which, unlike multiprocessing's `spawn`, never re-imports the supervisor's `__main__`. The child
gets one end of a Unix socket pair as its pipe. Each child loads the user's app once, at start,
and then runs one delivery at a time.
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
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Optional

import psutil

from worker.protocol import EXIT_CODES, READY

from .errors import YieldstarError
from .values import ExecutionLease

log = logging.getLogger("yieldstar.supervisor")


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


class AppLoadFailed(YieldstarError):
    """Raised when a child process cannot import the user's app."""


class DiedWhileStarting(AppLoadFailed):
    """Raised when a child process ended before it reported whether it loaded the app."""


# A worker killed by a signal while the pool first starts is started again, up to this many times
# in all: a stray kill must not take the supervisor down, a worker that always crashes must.
START_ATTEMPTS = 3


@dataclass
class Delivery:
    """One lease being worked on by one child."""

    lease: ExecutionLease
    started: float  # time.monotonic() when handed to the child
    lost: bool = False  # renewal found the lease lost
    told_to_stop: bool = False  # the child was sent STOP for it


@dataclass
class Child:
    process: ChildProcess
    conn: object  # multiprocessing.connection.Connection
    pid: int
    delivery: Optional[Delivery] = None
    last_answer: float = field(default_factory=time.monotonic)
    ready: bool = True  # False until a replacement reports that it loaded the app
    start_deadline: Optional[float] = None  # while not ready: when to give up on it

    @property
    def busy(self) -> bool:
        return self.delivery is not None

    def send(self, message: tuple) -> bool:
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
                 start_timeout_s: float = 60.0):
        self.size = size
        self._args = (app, db_path, durability)
        self._heartbeat_s = heartbeat_s
        self._misses = misses
        self.start_timeout_s = start_timeout_s
        self._me = psutil.Process(os.getpid())
        self.children: list[Child] = []

    def start(self) -> None:
        """Start every child at once, then wait for each to report that it loaded the app.

        Only the first start waits: a replacement starts in the background (`replace`), since
        loading an app can take seconds in which the other children must be heard and renewed.
        A child killed by a signal before it reported (not one that failed to load the app) is
        started again, as `replace` would after the start."""
        launched = [self._launch() for _ in range(self.size)]
        try:
            for slot in range(self.size):
                for attempt in range(1, START_ATTEMPTS + 1):
                    try:
                        self.children.append(self._await_ready(*launched[slot]))
                        break
                    except DiedWhileStarting as exc:
                        dead, conn = launched[slot]
                        if dead.exitcode is None or dead.exitcode >= 0 or attempt == START_ATTEMPTS:
                            raise
                        log.warning("%s; starting another", exc)
                        dead.close()
                        conn.close()
                        launched[slot] = self._launch()
        except BaseException:
            for process, conn in launched:
                process.kill()
                process.join()
            raise

    def _launch(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        app, db_path, durability = self._args
        settings = {
            "fd": theirs.fileno(), "app": app, "db_path": os.path.abspath(db_path), "durability": durability,
            "parent_pid": os.getpid(), "parent_started": self._me.create_time(),
            "heartbeat_s": self._heartbeat_s, "misses": self._misses,
            # The child imports what the supervisor could import, as multiprocessing would arrange.
            "sys_path": [p for p in sys.path if p],
        }
        try:
            popen = subprocess.Popen([sys.executable, "-m", "worker.child", json.dumps(settings)],
                                     pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        return ChildProcess(popen), Connection(ours.detach())

    def _await_ready(self, process, parent_conn) -> Child:
        if not parent_conn.poll(self.start_timeout_s):
            process.kill()
            process.join()
            raise AppLoadFailed(f"a worker process did not start within {self.start_timeout_s:.0f} s")
        try:
            message = parent_conn.recv()
        except EOFError:
            process.join(5)
            raise DiedWhileStarting(f"a worker process died while starting: {describe_exit(process)}") from None
        error = self.load_error(message)
        if error is not None:
            process.join(5)
            raise AppLoadFailed(error)
        return Child(process, parent_conn, process.pid)

    def load_error(self, message: tuple) -> Optional[str]:
        """None if `message` is a child's report that it loaded the app, else what went wrong."""
        if message[0] != READY:
            return f"a worker process sent {message[0]!r} before reporting that it loaded the app"
        if message[2] is not None:
            return f"a worker process could not load the app {self._args[0]!r}:\n{message[2]}"
        return None

    def replace(self, child: Child) -> Child:
        """Kill `child` if it still runs, make sure it is gone, and start another in its place.

        Returns at once: the new child is not `ready` until it reports that it loaded the app
        (a message the dispatcher reads like any other) and takes no delivery before."""
        self.reap(child)
        process, conn = self._launch()
        fresh = Child(process, conn, process.pid, ready=False,
                      start_deadline=time.monotonic() + self.start_timeout_s)
        self.children[self.children.index(child)] = fresh
        return fresh

    @staticmethod
    def reap(child: Child) -> None:
        child.process.kill()
        child.process.join()
        child.process.close()
        child.conn.close()

    def idle(self) -> list[Child]:
        return [c for c in self.children if c.ready and not c.busy]

    def busy(self) -> list[Child]:
        return [c for c in self.children if c.busy]

    def shutdown(self, *, kill: bool = False, timeout_s: float = 5.0) -> None:
        """Ask every child to exit (or kill them), and wait until each is gone."""
        for child in self.children:
            if kill:
                child.process.kill()
            else:
                child.send(("exit",))
        deadline = time.monotonic() + timeout_s
        for child in self.children:
            child.process.join(max(0.0, deadline - time.monotonic()))
            self.reap(child)
        self.children = []
