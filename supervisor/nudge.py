"""Nudges: telling idle supervisors on this host that work just became due.

Each supervisor binds a Unix datagram socket (created owner-only; nothing listens on a network
port) in a folder that belongs to its database file: `$XDG_RUNTIME_DIR/yieldstar/<hash of the
database's path>/`, or `/tmp/yieldstar-<uid>/<hash>/`. The folder is not beside the database
because a socket path may be at most about 100 bytes long. `nudge(db_path)` sends one byte to every socket there; a supervisor
woken by it claims at once instead of waiting for its next poll. A nudge is only a hint:
losing one costs at most one poll interval, so every error is ignored.

Sockets whose owner is gone (a supervisor killed by SIGKILL cannot remove its own) are removed
by whoever finds them: a nudge that is refused, and every supervisor as it starts listening,
which sweeps its folder, so that a folder of dead supervisors' sockets does not grow.
"""

from __future__ import annotations

import errno
import hashlib
import os
import socket
import stat
from typing import Optional


def _private_root() -> str:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and len(runtime) < 40:
        root = os.path.join(runtime, "yieldstar")
    else:
        root = f"/tmp/yieldstar-{os.getuid()}"
    os.makedirs(root, mode=0o700, exist_ok=True)
    info = os.lstat(root)
    # A shared /tmp: refuse a folder someone else made (or a link planted) to catch our nudges.
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(f"{root} is not a private folder of this user")
    return root


def nudge_dir(db_path: str) -> str:
    """The folder of the sockets of every supervisor of `db_path` (the same for every process)."""
    digest = hashlib.sha256(os.path.realpath(db_path).encode()).hexdigest()[:24]
    return os.path.join(_private_root(), digest)


def nudge(db_path: str) -> None:
    try:
        folder = nudge_dir(db_path)
        names = os.listdir(folder)
    except OSError:
        return
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sender.setblocking(False)
    try:
        for name in names:
            path = os.path.join(folder, name)
            try:
                sender.sendto(b"!", path)
            except OSError as exc:
                if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                    _remove(path)
    finally:
        sender.close()


def sweep(folder: str) -> int:
    """Remove the sockets in `folder` that no process listens on any more; returns how many.

    A socket is stale when connecting to it is refused: whatever its name's pid now belongs to,
    nobody reads it. Only names this module gives (`<pid>.sock`) are touched."""
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    removed = 0
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        for name in names:
            stem, dot, suffix = name.partition(".")
            if not (stem.isdigit() and dot and suffix == "sock") or int(stem) == os.getpid():
                continue
            path = os.path.join(folder, name)
            try:
                probe.connect(path)
            except OSError as exc:
                if exc.errno == errno.ECONNREFUSED:
                    _remove(path)
                    removed += 1
            else:  # alive: start afresh, as a connected datagram socket cannot connect elsewhere
                probe.close()
                probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    finally:
        probe.close()
    return removed


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class NudgeListener:
    """The receiving end, owned by one supervisor. `fileno()` lets it join a `wait()` call."""

    def __init__(self, db_path: str):
        folder = nudge_dir(db_path)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        self.path = os.path.join(folder, f"{os.getpid()}.sock")
        _remove(self.path)
        self._sock: Optional[socket.socket] = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        old = os.umask(0o177)  # the socket file is created owner read/write only
        try:
            self._sock.bind(self.path)
        finally:
            os.umask(old)
        self._sock.setblocking(False)
        sweep(folder)

    def fileno(self) -> int:
        return self._sock.fileno()

    def drain(self) -> None:
        while True:
            try:
                self._sock.recv(64)
            except OSError:
                return

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            _remove(self.path)
            try:
                os.rmdir(os.path.dirname(self.path))  # only if no other supervisor is listening
            except OSError:
                pass
