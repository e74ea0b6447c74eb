"""The child's watch on its supervisor: heartbeats in, answers out, and a quick exit when orphaned.

Whichever thread is free reads the pipe. The main thread, while it waits for work
(`next_task()`), so that a delivery handed over wakes it directly, with nothing passed between
threads; a watch thread, while a delivery runs, every half heartbeat, so that beats are answered
while the main thread is busy in a workflow (the supervisor gives up on a child only after
`misses` heartbeats of silence). A worker that runs several deliveries at once (`Deliveries`)
runs none on its main thread, which then reads the pipe all the time; the watch covers every
delivery of the worker alike: `may_write()` is each one's write door. The watch thread also makes the checks below, whoever reads.
The child treats its supervisor as gone when any of these happens, and then shuts its write door
(`may_write()` turns false) and exits at once:

- the pipe closes (the supervisor exited or was killed);
- its parent process changes, or the pid now belongs to a younger process (pid reuse), checked
  against the supervisor's start time counted from boot (`process_start`; never its wall-clock
  start time: that moves whenever the system clock is stepped, and a child comparing it would
  take a live supervisor for a dead one);
- no heartbeat for `misses` heartbeat intervals (the supervisor is frozen, e.g. SIGSTOP); while
  a delivery runs, up to half a heartbeat more, as the watch thread reads every half heartbeat.

On Linux the kernel also delivers SIGKILL when the supervisor dies (PR_SET_PDEATHSIG), so an
orphan cannot even finish the statement it is in.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from typing import NoReturn, Optional

from .protocol import EXIT_PARENT_GONE, Alive, Beat, Exit, FromChild, Run, Stop, ToChild

PR_SET_PDEATHSIG = 1
ALIVE = Alive()  # every answer to a beat is the same one
log = logging.getLogger("yieldstar.worker")


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):  # pragma: no cover - no libc prctl
            pass
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(EXIT_PARENT_GONE)


def process_start(pid: int) -> Optional[float]:
    """When process `pid` started, in a form that no clock step changes and that a later process
    given the same pid does not share; None if there is no such process.

    On Linux: clock ticks since boot, read from /proc (psutil would give the same, but importing it
    is about a tenth of a worker's start). Elsewhere: psutil's creation time."""
    if sys.platform.startswith("linux"):
        try:
            with open(f"/proc/{pid}/stat", "rb") as file:
                stat = file.read()
        except OSError:
            return None
        # The command name, second, is in parentheses and may hold anything, spaces and
        # parentheses too; the start time is the 22nd field, so the 20th after the name.
        return float(stat[stat.rindex(b")") + 2:].split()[19])
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


class ParentWatch:
    def __init__(self, conn, parent_pid: int, heartbeat_s: float, misses: int):
        self._conn = conn
        self._parent_pid = parent_pid
        # Taken while the parent is known to be alive (`die_with_parent` checked): the process is
        # its pid and its start time.
        self._parent_started = process_start(parent_pid)
        if self._parent_started is None:
            os._exit(EXIT_PARENT_GONE)
        self._limit = heartbeat_s * misses
        self._check_every = heartbeat_s / 2
        self._reading = threading.Lock()  # held by the thread reading the pipe
        self._tasks: collections.deque[Run | Stop | Exit] = collections.deque()  # not yet taken
        self._send_lock = threading.Lock()
        self._last_beat = time.monotonic()
        self._gone = False
        self._thread = threading.Thread(target=self._run, name="parent-watch", daemon=True)

    def start(self) -> None:
        # Silence counts from now: the supervisor cannot beat a child that is still loading the app.
        self._last_beat = time.monotonic()
        self._thread.start()

    def may_write(self) -> bool:
        """False once the supervisor is gone or silent for too long."""
        if self._gone:
            return False
        if time.monotonic() - self._last_beat > self._limit:
            self._leave("no heartbeat")
            return False
        return True

    def send(self, message: FromChild) -> None:
        with self._send_lock:
            self._conn.send(message)

    def next_task(self) -> Optional[Run | Stop]:
        """The next `Run` or `Stop` from the supervisor, or None when it says `Exit`; waits for
        it, answering heartbeats meanwhile."""
        with self._reading:
            while not self._tasks:
                self._take(self._receive())
            message = self._tasks.popleft()
        return None if isinstance(message, Exit) else message

    def _receive(self) -> ToChild:
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            self._leave("pipe closed")

    def _take(self, message: ToChild) -> None:
        self._last_beat = time.monotonic()
        match message:
            case Beat():
                try:
                    self.send(ALIVE)
                except OSError:
                    self._leave("pipe closed")
            case Run() | Stop() | Exit():
                self._tasks.append(message)

    def _parent_alive(self) -> bool:
        return os.getppid() == self._parent_pid and process_start(self._parent_pid) == self._parent_started

    def _leave(self, why: str) -> NoReturn:
        self._gone = True
        log.warning("supervisor pid %d is gone (%s): no more writes, exiting", self._parent_pid, why,
                    extra={"event": "supervisor_gone", "reason": why})
        # Exit from here, whatever the main thread is doing: it may be blocked in a step that
        # would otherwise go on to write. SQLite rolls back a transaction cut short.
        os._exit(EXIT_PARENT_GONE)

    def _run(self) -> None:
        while True:
            time.sleep(self._check_every)
            if self._reading.acquire(blocking=False):  # else the main thread is reading
                try:
                    while self._conn.poll(0):
                        self._take(self._receive())
                except (EOFError, OSError):
                    self._leave("pipe closed")
                finally:
                    self._reading.release()
            if time.monotonic() - self._last_beat > self._limit:
                self._leave("no heartbeat")
            elif not self._parent_alive():
                self._leave("parent gone")
