"""The supervisor's end of the template process, which forks its workers (`worker._runtime.template`).

A worker started as a fresh interpreter spends about a tenth of a second of CPU importing the
runtime and the app; 256 of them on two cores took half a minute to be up. The template imports
both once, and each worker is then a fork of it: a few milliseconds. The pool asks the template
for workers, sending it one end of a new socket pair for each (its pipe, as before), and gets
back their pids.

The worker is the supervisor's child all the same: the template forks a go-between that forks
the worker and exits, and the supervisor, a child subreaper (PR_SET_CHILD_SUBREAPER) while its
pool runs, adopts it. So the worker's parent-death signal and parent checks watch the
supervisor, never the template; the supervisor waits for it and reads its exit status like any
child's; and a template that dies (killed, out of memory) takes no worker with it: the next
worker is started as a fresh interpreter, as they all are where there is no template (not Linux,
or an app that starts a thread when imported, from which a fork is unsafe).

A child subreaper also adopts whatever a worker leaves behind when it dies (a subprocess of a
step, say). The template and the pool wait for their own processes; an orphan adopted this way
is reaped once the supervisor exits (by init), or, in `yieldstar supervise` (where every child
is the pool's), within seconds of its own exit (`reap_orphans`).
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Optional

from worker._runtime.template import CAN_FORK, MAX_BATCH, PID, TEMPLATE_FLAG

PR_SET_CHILD_SUBREAPER = 36
# The template answers in milliseconds, or seconds on a machine busy with deliveries; past this,
# it is taken for stuck.
FORK_TIMEOUT_S = 30.0


# Pools in this process that need it to be a child subreaper (several supervisors may run in one
# process): it stops being one when the last of them shuts down.
_subreaper_pools = 0
_subreaper_lock = threading.Lock()


def set_child_subreaper(on: bool) -> bool:
    """Make this process the child subreaper of its descendants (Linux), for one more pool (`on`),
    or for one fewer; False where it cannot be one."""
    global _subreaper_pools
    if not sys.platform.startswith("linux"):
        return False
    with _subreaper_lock:
        if _subreaper_pools == (0 if on else 1):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
                    return False
            except (OSError, AttributeError):  # pragma: no cover - no libc prctl
                return False
        _subreaper_pools += 1 if on else -1
        return True


class ForkedProcess:
    """A worker forked by the template and adopted by this process, with the interface of
    `pool.ChildProcess`: a pidfd `sentinel`, `exitcode` (negative: killed by that signal)."""

    def __init__(self, pid: int):
        self.pid = pid
        self._status: Optional[int] = None
        # The worker is this process's child (adopted before its pid was sent): its pid cannot be
        # reused before it is waited for, here.
        self._pidfd: Optional[int] = os.pidfd_open(pid)

    @property
    def sentinel(self):
        return self._pidfd

    def _poll(self, flags: int) -> Optional[int]:
        if self._status is None:
            try:
                pid, status = os.waitpid(self.pid, flags)
            except ChildProcessError:  # pragma: no cover - waited for elsewhere
                pid, status = self.pid, 0
            if pid:
                self._status = os.waitstatus_to_exitcode(status)
        return self._status

    @property
    def exitcode(self) -> Optional[int]:
        return self._poll(os.WNOHANG)

    def is_alive(self) -> bool:
        return self.exitcode is None

    def kill(self) -> None:
        if self.is_alive():
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:  # pragma: no cover - exited in between
                pass

    def join(self, timeout: Optional[float] = None) -> None:
        if self._status is not None:
            return
        if timeout is None:
            self._poll(0)
            return
        if self._pidfd is not None:
            select.select([self._pidfd], [], [], max(0.0, timeout))
        self._poll(os.WNOHANG)

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class Template:
    """The template process: started once per pool, asked for each worker."""

    def __init__(self, boot: str, settings: dict):
        self._boot = boot
        self._settings = settings
        self.control: Optional[socket.socket] = None
        self._popen: Optional[subprocess.Popen] = None
        self.ready = False  # it imported the app and forks workers on request
        self._pending: list[socket.socket] = []  # our ends of the pipes of workers asked for
        self._answer = b""  # their pids, as much as came yet
        self._asked_at = 0.0

    @property
    def pid(self) -> Optional[int]:
        return None if self._popen is None else self._popen.pid

    def start(self) -> None:
        """Start it (it then imports the app); OSError if it cannot be started."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        settings = dict(self._settings, control_fd=theirs.fileno())
        try:
            self._popen = subprocess.Popen([sys.executable, self._boot, TEMPLATE_FLAG, json.dumps(settings)],
                                           pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        self.control = ours

    def take_answer(self) -> Optional[bool]:
        """Read its first word, once `control` is readable: True if it will fork workers, False
        if it will not (the app started a thread), None if it died first."""
        try:
            word = self.control.recv(1)
        except OSError:
            word = b""
        self.ready = word == CAN_FORK
        return None if not word else self.ready

    @property
    def exitcode(self) -> Optional[int]:
        """Its exit code once it ended (negative: killed by that signal), else None."""
        return None if self._popen is None else self._popen.poll()

    def join(self, timeout: float) -> None:
        if self._popen is not None:
            try:
                self._popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass

    @property
    def forking(self) -> int:
        """Workers asked for whose pids have not come back yet."""
        return len(self._pending)

    def request(self, count: int) -> None:
        """Ask for up to `count` new workers (at most MAX_BATCH), unless some are asked for
        already; `collect` takes them. OSError if the template is gone."""
        if self._pending:
            return
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(max(1, min(count, MAX_BATCH)))]
        try:
            socket.send_fds(self.control, [b"w"], [theirs.fileno() for _, theirs in pairs])
        except BaseException:
            for ours, theirs in pairs:
                ours.close()
                theirs.close()
            raise
        for _, theirs in pairs:
            theirs.close()
        self._pending = [ours for ours, _ in pairs]
        self._answer = b""
        self._asked_at = time.monotonic()

    def collect(self, timeout: float = 0.0) -> list[tuple[ForkedProcess, Connection]]:
        """The workers asked for, each adopted by this process and with this end of its pipe,
        once the template has answered (within `timeout`), else []. OSError if the template is
        gone, could not fork any, or has not answered within FORK_TIMEOUT_S: it is stuck."""
        if not self._pending:
            return []
        size = PID.size * len(self._pending)
        deadline = time.monotonic() + timeout
        while len(self._answer) < size:
            if not select.select([self.control], [], [], max(0.0, deadline - time.monotonic()))[0]:
                if time.monotonic() - self._asked_at > FORK_TIMEOUT_S:
                    raise OSError(f"the template process did not answer within {FORK_TIMEOUT_S:.0f} s")
                return []
            chunk = self.control.recv(size - len(self._answer))
            if not chunk:
                raise OSError("the template process is gone")
            self._answer += chunk
        forked = []
        for ours, (pid,) in zip(self._pending, PID.iter_unpack(self._answer)):
            if pid > 0:
                forked.append((ForkedProcess(pid), Connection(ours.detach())))
            else:
                ours.close()
        self._pending, self._answer = [], b""
        if not forked:
            raise OSError("the template process could not fork a worker")
        return forked

    def fork(self, count: int = 1) -> list[tuple[ForkedProcess, Connection]]:
        """`request` and `collect`, waiting for the answer (before the dispatcher loop runs)."""
        self.request(count)
        forked = self.collect(timeout=FORK_TIMEOUT_S + 1)
        if not forked:
            raise OSError(f"the template process did not answer within {FORK_TIMEOUT_S:.0f} s")
        return forked

    def close(self) -> None:
        """Kill it (it holds nothing to finish, and may be busy importing the app) and wait for it."""
        self.ready = False
        for ours in self._pending:
            ours.close()
        self._pending = []
        if self.control is not None:
            self.control.close()
            self.control = None
        if self._popen is not None:
            self._popen.kill()
            self._popen.wait()
            self._popen = None


def reap_orphans(known: set[int]) -> int:
    """Wait for this process's children that have exited and that are not in `known` (orphans a
    worker left, adopted as their subreaper); returns how many. Linux only (reads /proc)."""
    reaped = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children") as file:
                pids = [int(p) for p in file.read().split()]
        except OSError:
            continue
        for pid in pids:
            if pid in known or not _exited(pid):
                continue
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    reaped += 1
            except ChildProcessError:
                pass
    return reaped


def _exited(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:][:1] == b"Z"
