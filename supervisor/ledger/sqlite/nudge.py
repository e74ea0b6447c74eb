"""Nudges: telling idle supervisors on this host that work just became due.

Each supervisor binds a Unix datagram socket (created owner-only; nothing listens on a network
port) in a folder that belongs to its database file: `<this user's private folder>/<hash of the
database's path>/`, the private folder being `$XDG_RUNTIME_DIR/yieldstar`, `/run/user/<uid>/yieldstar`,
`~/.yieldstar` or `/tmp/yieldstar-<uid>`, whichever comes first that no other user can have made
(`socket_folder` says which, and why in that order). The folder is not beside the database
because a socket path may be at most about 100 bytes long. `nudge(db_path)` sends one byte to
every socket there; a supervisor woken by it claims at once instead of waiting for its next poll.

A nudge is only a hint, and so is an announcement (below): losing one costs at most one poll
interval. Both are sent after the commit they tell of, so neither ever raises: an operation
that committed has succeeded, whatever happens to its news. A user with no private folder (a
squatted `/tmp/yieldstar-<uid>` and nowhere better) sends none; that and any other failure to
send is logged once per process.

Outcomes travel the same way the other way round: an application waiting for the result of
an execution (`worker.Client`, `handle.result()`) binds a socket in the subfolder `outcomes/`,
and the commit that makes an execution terminal (an acknowledgement of `completed` or `failed`,
a cancellation) sends its id there with `announce_ended(db_path, ids)`. The waiter reads the
record again only for the ids it waits for; a lost datagram costs it one slow poll.

Sockets whose owner is gone (a supervisor killed by SIGKILL cannot remove its own) are removed
by whoever finds them: a nudge that is refused, and every listener as it starts listening,
which sweeps its folder, so that a folder of dead supervisors' sockets does not grow.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import itertools
import os
import socket
from typing import Optional

from .socket_folder import NoPrivateFolder, log, socket_root

# An announcement larger than this names no ids (see `announce_ended`): well inside what a Unix
# datagram socket takes in one message by default.
MAX_DATAGRAM = 16_384


@functools.lru_cache(maxsize=64)
def nudge_dir(db_path: str) -> str:
    """The folder of the sockets of every supervisor of `db_path` (the same for every process).

    Worked out once per path and process: every acknowledgement that ends an execution announces
    it, and resolving the path, hashing it and checking the private root cost more than the
    announcement itself.

    Raises:
        NoPrivateFolder: this user has no private folder for sockets (see `socket_folder`).
    """
    digest = hashlib.sha256(os.fsencode(os.path.realpath(db_path))).hexdigest()[:24]
    return os.path.join(socket_root(), digest)


def outcomes_dir(db_path: str) -> str:
    """The folder of the sockets of every process waiting for outcomes of `db_path`."""
    return os.path.join(nudge_dir(db_path), "outcomes")


def nudge(db_path: str) -> None:
    """Wake the idle supervisors of `db_path` on this host. Never raises (see the module)."""
    try:
        _send_to_all(nudge_dir(db_path), b"!")
    except OSError as exc:
        _not_sent(exc)


def announce_ended(db_path: str, execution_ids: list[str]) -> None:
    """Tell every process waiting for outcomes of `db_path` that these executions are terminal.
    Never raises (see the module)."""
    message = "\n".join(execution_ids).encode()
    if len(message) > MAX_DATAGRAM:
        message = b""  # too many to name: "look at everything you wait for"
    try:
        _send_to_all(outcomes_dir(db_path), message)
    except OSError as exc:
        _not_sent(exc)


_told_not_sent = False  # this process has logged a failure to send


def _not_sent(exc: OSError) -> None:
    """Log the first failure to send of this process (a missing private folder was logged, with
    its fix, when it was found missing)."""
    global _told_not_sent
    if isinstance(exc, NoPrivateFolder) or _told_not_sent:
        return
    _told_not_sent = True
    log.warning("cannot send a nudge or an outcome announcement (%s): until one is sent, supervisors and waiting"
                " clients on this host find new work and outcomes at their next poll (logged once)", exc,
                extra={"event": "nudge_not_sent"})


def _send_to_all(folder: str, message: bytes) -> None:
    """Send `message` to every socket in `folder`, removing those nobody listens on."""
    try:
        names = os.listdir(folder)
    except OSError:
        return  # nobody listens (for outcomes, the usual case): one failed look-up, nothing sent
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sender.setblocking(False)
    try:
        for name in names:
            if not name.endswith(".sock"):
                continue  # the outcomes/ folder beside the supervisors' sockets
            path = os.path.join(folder, name)
            try:
                sender.sendto(message, path)
            except OSError as exc:
                if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                    _remove(path)
    finally:
        sender.close()


def _our_socket(name: str) -> bool:
    """A name this module gives, of a socket another process bound: `<pid>.sock` or `<pid>-<n>.sock`."""
    stem, dot, suffix = name.partition(".")
    pid, _, number = stem.partition("-")
    if not (dot and suffix == "sock" and pid.isdigit() and (number.isdigit() or not number and "-" not in stem)):
        return False
    return int(pid) != os.getpid()


def sweep(folder: str) -> int:
    """Remove the sockets in `folder` that no process listens on any more; returns how many.

    A socket is stale when connecting to it is refused: whatever its name's pid now belongs to,
    nobody reads it. Only names this module gives (`<pid>.sock`, `<pid>-<n>.sock`) are touched,
    and never this process's own."""
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    removed = 0
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        for name in names:
            if not _our_socket(name):
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


def _bind(folder: str, name: str) -> tuple[socket.socket, str]:
    """A non-blocking datagram socket bound at `folder/name`, owner read/write only."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = os.path.join(folder, name)
    _remove(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    old = os.umask(0o177)  # the socket file is created owner read/write only
    try:
        sock.bind(path)
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(old)
    sock.setblocking(False)
    sweep(folder)
    return sock, path


class NudgeListener:
    """The receiving end, owned by one supervisor. `fileno()` lets it join a `wait()` call."""

    def __init__(self, db_path: str):
        sock, self.path = _bind(nudge_dir(db_path), f"{os.getpid()}.sock")
        self._sock: Optional[socket.socket] = sock

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


class OutcomeListener:
    """The receiving end of `announce_ended`, owned by one waiting client. `fileno()` lets it
    join a `select()`; `read()` returns the ids announced since the last read."""

    _count = itertools.count(1)

    def __init__(self, db_path: str):
        self._sock, self.path = _bind(outcomes_dir(db_path), f"{os.getpid()}-{next(self._count)}.sock")

    def fileno(self) -> int:
        return self._sock.fileno()

    def read(self) -> Optional[set[str]]:
        """The ids announced since the last read; None when one announcement named none (too
        many to name), so that the reader looks at everything it waits for."""
        ids: set[str] = set()
        everything = False
        while True:
            try:
                data = self._sock.recv(MAX_DATAGRAM)
            except OSError:
                return None if everything else ids
            if data:
                ids.update(data.decode(errors="replace").split("\n"))
            else:
                everything = True

    def close(self) -> None:
        self._sock.close()
        _remove(self.path)
        try:
            os.rmdir(os.path.dirname(self.path))  # only if nobody else is waiting
        except OSError:
            pass
