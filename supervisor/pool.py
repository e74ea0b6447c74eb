"""The pool of child processes that run deliveries: started once, reused, replaced when they die.

Children are started with the `spawn` method: a fresh interpreter, safe beside the supervisor's
threads (forking a process that has threads can copy a held lock into the child). Each child
loads the user's app once, at start, and then runs one delivery at a time.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Optional

import psutil

from worker.child import child_main
from worker.protocol import EXIT_CODES, READY

from .errors import YieldstarError
from .values import ExecutionLease

_spawn = multiprocessing.get_context("spawn")


class AppLoadFailed(YieldstarError):
    """Raised when a child process cannot import the user's app."""


@dataclass
class Delivery:
    """One lease being worked on by one child."""

    lease: ExecutionLease
    started: float  # time.monotonic() when handed to the child
    lost: bool = False  # renewal found the lease lost
    told_to_stop: bool = False  # the child was sent STOP for it


@dataclass
class Child:
    process: multiprocessing.process.BaseProcess
    conn: object  # multiprocessing.connection.Connection
    pid: int
    delivery: Optional[Delivery] = None
    last_answer: float = field(default_factory=time.monotonic)

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
        self._start_timeout_s = start_timeout_s
        self._me = psutil.Process(os.getpid())
        self.children: list[Child] = []

    def start(self) -> None:
        """Start every child at once, then wait for each to report that it loaded the app."""
        launched = [self._launch() for _ in range(self.size)]
        try:
            for process, conn in launched:
                self.children.append(self._await_ready(process, conn))
        except BaseException:
            for process, conn in launched:
                process.kill()
                process.join()
            raise

    def _start_child(self) -> Child:
        return self._await_ready(*self._launch())

    def _launch(self):
        parent_conn, child_conn = _spawn.Pipe(duplex=True)
        process = _spawn.Process(
            target=child_main,
            args=(child_conn, *self._args, os.getpid(), self._me.create_time(), self._heartbeat_s, self._misses),
            name="yieldstar-worker",
            daemon=True,
        )
        process.start()
        child_conn.close()
        return process, parent_conn

    def _await_ready(self, process, parent_conn) -> Child:
        if not parent_conn.poll(self._start_timeout_s):
            process.kill()
            raise AppLoadFailed(f"a worker process did not start within {self._start_timeout_s:.0f} s")
        try:
            tag, pid, error = parent_conn.recv()
        except EOFError:
            process.join(5)
            raise AppLoadFailed(f"a worker process died while starting: {describe_exit(process)}") from None
        assert tag == READY
        if error is not None:
            process.join(5)
            raise AppLoadFailed(f"a worker process could not load the app {self._args[0]!r}:\n{error}")
        return Child(process, parent_conn, pid)

    def replace(self, child: Child) -> Child:
        """Kill `child` if it still runs, make sure it is gone, and start another in its place."""
        self.reap(child)
        fresh = self._start_child()
        self.children[self.children.index(child)] = fresh
        return fresh

    @staticmethod
    def reap(child: Child) -> None:
        if child.process.is_alive():
            child.process.kill()
        child.process.join()
        child.conn.close()

    def idle(self) -> list[Child]:
        return [c for c in self.children if not c.busy]

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
