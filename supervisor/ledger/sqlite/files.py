"""The ledger's files on disk, checked before SQLite opens them.

A ledger decides which side effects happen, so Yieldstar uses only files that nobody else could
have written, and never writes to a file it did not make:

- The ledger is created owner-only (0600) with `O_CREAT | O_EXCL | O_NOFOLLOW`: a symlink at the
  path, even a dangling one, is refused and nothing is created where it points. SQLite gives
  the `-wal`, `-shm` and `-journal` files it creates later the ledger's own mode.
- The ledger and its `-wal`, `-shm` and `-journal` files are refused (`UnsafeLedgerFile`) when
  one is a symlink, belongs to another user, or has any group or other permission bit; the
  message says how to fix it.
- A file that does not begin with SQLite's header is refused (`NotALedger`) before SQLite reads
  it, whatever its mode: "check the path" is what helps there. Whether an SQLite file is a
  Yieldstar ledger is decided after the checks of its owner and mode, on a read-only connection
  (`schema.recognise`), since SQLite creates a WAL file's -wal and -shm even to read it.

The folder is trusted: whoever may rename files in it could swap a file after these checks, so
keep a ledger in a folder that only its owner can write.

A descriptor opened here is not closed while a backend of this process uses the file. Closing
*any* descriptor of a file drops every POSIX lock the process holds on it, SQLite's included
(fcntl(2)): a check made by a process that already has a connection to the ledger (a supervisor
opens two) would take that connection's shared lock away, and another process's last close would
then see no reader left, checkpoint the ledger and delete its -wal and -shm while this one still
writes to them. So each file's first descriptor is shared by every backend of the process that
uses the file (`FileHold`), and closed only once the last of them has closed its connection.
"""

from __future__ import annotations

import errno
import os
import pwd
import shlex
import stat
import threading
from typing import Optional

from ..errors import (
    LedgerGone,
    NoLedger,
    NotALedger,
    StorageUnavailable,
    UnsafeLedgerFile,
)

SQLITE_HEADER = b"SQLite format 3\x00"
COMPANIONS = ("-wal", "-shm", "-journal")
OWNER_ONLY = 0o600

# (st_dev, st_ino) -> [a descriptor of that file, how many holds share it]
_held: dict[tuple[int, int], list[int]] = {}
_held_lock = threading.Lock()
_strays: list[int] = []


class FileHold:
    """A backend's share of the descriptor this process keeps of its ledger file."""

    def __init__(self, key: Optional[tuple[int, int]] = None):
        self._key = key

    def release(self) -> None:
        """Call once the backend's own connection is closed; the last release closes the file."""
        key, self._key = self._key, None
        if key is None:
            return
        with _held_lock:
            entry = _held[key]
            entry[1] -= 1
            if entry[1] == 0:
                del _held[key]
                os.close(entry[0])


def _hold(path: str) -> tuple[int, FileHold]:
    """A read-only descriptor of the file at `path`, shared with the other holds on that file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    with _held_lock:
        if st is not None and stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) in _held:
            entry = _held[(st.st_dev, st.st_ino)]
            entry[1] += 1
            return entry[0], FileHold((st.st_dev, st.st_ino))
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        opened = os.fstat(fd)
        key = (opened.st_dev, opened.st_ino)
        if key in _held:
            # The path named another file at the lstat: this is a second descriptor of a file
            # that is held, and closing it would drop the holders' locks. Keep it for good.
            _strays.append(fd)
            _held[key][1] += 1
            return _held[key][0], FileHold(key)
        _held[key] = [fd, 1]
        return fd, FileHold(key)


def check_ledger_file(path: str, *, create: bool) -> FileHold:
    """Check that `path` names an SQLite file (or none yet), creating an empty one when missing.

    An empty file is a new ledger (nobody wrote a schema into it yet) unless `create` is False.
    An SQLite file must then be private to this user; whether it is a Yieldstar ledger is
    decided next, on a read-only connection. Returns the caller's hold on the file: release it
    once its connection is closed.

    Raises:
        NoLedger: there is no file at `path` and `create` is False (or its folder is missing).
        UnsafeLedgerFile: the ledger or a companion is a symlink, another user's, or open to others.
        NotALedger: the path is not a regular file, or the file is not an SQLite database.
        LedgerGone: this user may not open or create the file.
        StorageUnavailable: the file system failed (disk full, I/O error, too many open files).
    """
    while True:
        try:
            fd, held = _hold(path)
        except FileNotFoundError:
            if not create:
                raise NoLedger(f"no ledger at {path}") from None
            _create(path)
            continue  # opened like any other, in case another process got there first
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _symlink(path) from None
            raise _os_error(path, exc) from None
        break
    try:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise NotALedger(f"{path} is not a Yieldstar ledger: it is not a regular file")
            first = os.pread(fd, len(SQLITE_HEADER), 0)
        except OSError as exc:
            raise _os_error(path, exc) from None
        if first and first != SQLITE_HEADER:
            # A file being created by SQLite elsewhere reads empty until its first page is whole:
            # the size grows only after the bytes are in place.
            raise NotALedger(f"{path} is not a Yieldstar ledger: it is not an SQLite database file; check the path")
        if not first and not create:
            raise NoLedger(f"no ledger at {path} (the file is empty)")
        # Before SQLite opens it: even a read-only connection creates the -wal and -shm of a WAL
        # file, with the file's own (here: unsafe) mode.
        _check_private(path, st)
    except BaseException:
        held.release()
        raise
    return held


def _check_private(path: str, st: os.stat_result) -> None:
    """Refuse a ledger (whose `st` is given), -wal, -shm or -journal that is a symlink, belongs
    to another user or that others may read or write: its contents cannot be trusted, and what
    it decides must not leak. The message says how to fix it."""
    _check_owner_and_mode(path, st, "the ledger")
    for companion, st in _companions(path):
        if stat.S_ISLNK(st.st_mode):
            raise _symlink(companion)
        _check_owner_and_mode(companion, st, f"the ledger's {companion[len(path) + 1:]} file")


def _companions(path: str):
    """(path, lstat) of each of the ledger's -wal, -shm and -journal files that exists."""
    for suffix in COMPANIONS:
        companion = path + suffix
        try:
            yield companion, os.lstat(companion)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise _os_error(companion, exc) from None


def create_owner_only(path: str) -> None:
    """Create an empty file at `path`, exactly 0600 whatever the umask, without following a
    symlink there. Raises `FileExistsError` when anything is at `path` (a symlink too), and the
    other `OSError`s as they come."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, OWNER_ONLY)
    try:
        os.fchmod(fd, OWNER_ONLY)  # exactly 0600, whatever the umask took away
    finally:
        os.close(fd)


def _create(path: str) -> None:
    try:
        create_owner_only(path)
    except FileExistsError:
        return  # another process created it, or a symlink is there: the caller looks again
    except FileNotFoundError:
        raise NoLedger(f"no ledger at {path}: the folder {os.path.dirname(path) or '.'} does not exist") from None
    except OSError as exc:
        raise _os_error(path, exc) from None


def _check_owner_and_mode(path: str, st: os.stat_result, what: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeLedgerFile(f"{what} {path} is not a regular file; remove it if no Yieldstar process is running")
    me = os.geteuid()
    quoted = shlex.quote(path)
    if st.st_uid != me:
        raise UnsafeLedgerFile(
            f"{what} {path} belongs to {_user(st.st_uid)}, not to {_user(me)} who runs Yieldstar: its owner could"
            f" have written anything into it. Run Yieldstar as its owner, or, if you trust its contents, take it"
            f" over: chown {_name(me)} {quoted} && chmod 600 {quoted}")
    loose = stat.S_IMODE(st.st_mode) & 0o077
    if loose:
        raise UnsafeLedgerFile(
            f"{what} {path} has mode {stat.S_IMODE(st.st_mode):04o}: other users could read or change it. If you"
            f" trust its contents, make it owner-only: chmod 600 {quoted}")


def _symlink(path: str) -> UnsafeLedgerFile:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return UnsafeLedgerFile(
        f"{path} is a symbolic link (to {target}); Yieldstar does not follow links to its ledger files:"
        f" give the real path, or replace the link by the file")


def _os_error(path: str, exc: OSError) -> Exception:
    """The contract error for an OSError met while checking or creating `path`."""
    reason = exc.strerror or str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return LedgerGone(f"cannot open {path}: {reason}; check the permissions of the file and its folder")
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return NoLedger(f"no ledger at {path} ({reason})")
    if exc.errno == errno.EISDIR:
        return NotALedger(f"{path} is not a Yieldstar ledger: it is a folder")
    return StorageUnavailable(f"cannot open {path}: {reason}")


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _user(uid: int) -> str:
    return f"{_name(uid)} (uid {uid})"
