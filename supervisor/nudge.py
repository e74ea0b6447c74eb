"""Nudges: telling idle supervisors on this host that work just became due.

Each supervisor binds a Unix datagram socket in `<db>.nudge/` (created owner-only; nothing
listens on a network port). `nudge(db_path)` sends one byte to every socket there; a supervisor
woken by it claims at once instead of waiting for its next poll. A nudge is only a hint:
losing one costs at most one poll interval, so every error is ignored, and sockets whose owner
is gone are removed.
"""

from __future__ import annotations

import errno
import os
import socket
from typing import Optional


def nudge_dir(db_path: str) -> str:
    return os.path.abspath(db_path) + ".nudge"


def nudge(db_path: str) -> None:
    folder = nudge_dir(db_path)
    try:
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
