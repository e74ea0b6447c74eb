"""One SQLite connection, its pragmas, the single way to run a write transaction, and the one
place where SQLite's errors become Yieldstar's.

Every read-modify-write goes through `Connection.write()`: `BEGIN IMMEDIATE` takes the
database's write lock up front, so two processes can never both read a row and then both
update it; an exception rolls back, and a normal exit commits. Single-statement fenced writes
(`renew`, `write_step`) are atomic on their own and run through `Connection.execute()`.

Statements run as they are given, in SQLite's SQL: the shared tables' come rendered by the
connection's `dialect` (`supervisor.ledger.sqlite.dialect`: `?` parameters, `rowid`, index hints,
no row locks).

Errors. Every `sqlite3` error raised while opening the file, by a statement, or by a
transaction's BEGIN or COMMIT leaves this module as a `StorageError` branch
(`supervisor.ledger.errors`), chosen by SQLite's primary result code, with a message that names the
file (and, for a lasting error, says what to do):

    SQLITE_BUSY, SQLITE_LOCKED                              StorageBusy         transient
    SQLITE_FULL, _IOERR, _NOMEM, _CANTOPEN, _PROTOCOL       StorageUnavailable  transient
    SQLITE_CORRUPT                                          StorageCorrupt      lasting
    SQLITE_NOTADB                                           NotALedger          lasting
    SQLITE_READONLY, _PERM, _AUTH                           LedgerGone          lasting

SQLite does not notice that the file was deleted or replaced while open (in WAL mode it writes on
into the unlinked file), so each write transaction first checks that the path still names the
file it opened, and raises `LedgerGone` if not. Nor does it notice a deleted -wal or -shm: it
goes on committing into the unlinked -wal, which no process that opens the ledger afterwards
reads (it makes a new one), so every commit since the last checkpoint is lost to the others and
two processes may claim the same execution with the same token. The -wal and -shm a connection
uses are created when it first reads a WAL file, and SQLite deletes them only when the last
connection to the file closes, which cannot happen while this one is open (it keeps a shared
lock on the file: see `files`). So a connection records them once in WAL mode (`use_wal`), and
a write looks at them again at most once every `FILE_CHECK_S`: one clock reading per write, and
a stat of each file once a second. That bounds what a deleted -wal can swallow to about a
second of this connection's writes; `check_files()` looks at all three files at once, without
the connection's lock, for a caller that must never wait for it (the supervisor's loop).

A call that fails leaves no transaction open (a failed COMMIT is rolled back), so the connection
stays usable and the same call may succeed once a transient fault clears. Any other
`sqlite3.Error` — `ProgrammingError` (a call on a closed backend), `InterfaceError`, a
constraint or syntax error — is a mistake in the calling code, not a storage failure: it
propagates unchanged, and nothing should catch it.

Waiting for the write lock. SQLite's own busy handler, when it finds the write lock taken,
sleeps 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100 ms and so on before it looks again, while a
commit of ours holds the lock for tens of microseconds: under contention, writers slept through
most of the time the lock was free. So once a connection is open its busy timeout is 0, and the
two places where it can meet a busy file try again here, as the opening steps do (`patiently`)
but with pauses of up to 20 µs, then up to twice as long each time up to 1 ms (Linux's timer
slack lets the shortest run to 60–100 µs), until `busy_timeout_s` (`BUSY_TIMEOUT_MS` unless
set otherwise) has passed, then report `StorageBusy`: a transaction's `BEGIN IMMEDIATE`, and a
single statement (`execute`). A busy statement changed nothing, so trying it again is safe. Nothing
else can be busy. Inside a write transaction, `BEGIN IMMEDIATE` holds the write lock, and a WAL
commit needs no other lock. Nor can a read: a WAL reader never waits for a writer, and it meets a
busy file only while another connection recovers the WAL or holds the file exclusively, both of
which need no other connection to have the file open, and a connection keeps the file open (with
a shared lock) from its first read on. That first read is made while it opens, under SQLite's
own busy handler (`PRAGMA synchronous` reads the schema).

Checkpoints. SQLite copies the WAL back into the database file once a commit leaves it longer
than the autocheckpoint (1000 pages by default), and the WAL starts again from its beginning only
when no reader is using it. With several processes writing at once there nearly always is one,
so past the threshold every commit ran a small checkpoint of its own, with two `fdatasync`s
(`synchronous=NORMAL` syncs the WAL before and the file after): 0.3 per 3-step workflow at
concurrency 4. Here the threshold is `WAL_AUTOCHECKPOINT_PAGES` (16 MiB of WAL with 4 KiB pages):
a third as many syncs, and about a tenth less CPU per workflow.

Opening. Switching a file to WAL needs an exclusive lock, and SQLite reports some lock
conflicts at once instead of calling the busy handler (two connections that each hold a shared
lock and both want to write: one of them must give way). So the steps that open a ledger run
under `patiently()`, which repeats a step that met a busy file, with a short random backoff,
until the busy timeout has passed: any number of processes may open one new file at once.
"""

from __future__ import annotations

import os
import random
import shlex
import sqlite3
import threading
import time
import urllib.parse
from contextlib import contextmanager
from typing import (
    Any,
    Callable,
    ContextManager,
    Iterator,
    NoReturn,
    Optional,
    Sequence,
    TypeVar,
)

from ..connection import Rows
from ..errors import (
    InvalidArgument,
    LedgerGone,
    NotALedger,
    StorageBusy,
    StorageCorrupt,
    StorageError,
    StorageUnavailable,
)
from .dialect import DIALECT

T = TypeVar("T")

DURABILITY = {"normal": "NORMAL", "full": "FULL"}
BUSY_TIMEOUT_MS = 15_000
WAL_AUTOCHECKPOINT_PAGES = 4_000  # see "Checkpoints" in the module docstring
# How long a write that met a busy file waits before it looks again (`patiently`): doubling up to the most.
FIRST_BUSY_PAUSE_S, LONGEST_BUSY_PAUSE_S = 20e-6, 1e-3
MEMORY = ":memory:"

# SQLite's primary result codes that are storage failures (https://sqlite.org/rescode.html).
SQLITE_PERM, SQLITE_BUSY, SQLITE_LOCKED, SQLITE_NOMEM, SQLITE_READONLY = 3, 5, 6, 7, 8
SQLITE_IOERR, SQLITE_CORRUPT, SQLITE_FULL, SQLITE_CANTOPEN, SQLITE_PROTOCOL = 10, 11, 13, 14, 15
SQLITE_AUTH, SQLITE_NOTADB = 23, 26
# Extended: the file was unlinked or renamed while open (SQLite checks before each write).
SQLITE_READONLY_DBMOVED = SQLITE_READONLY | (4 << 8)

# How often (s) a write looks at the ledger's -wal and -shm besides the ledger file itself.
FILE_CHECK_S = 1.0
WAL_FILES = ("-wal", "-shm")

# Pythons before 3.11 give no result code: SQLite's own message for each, first match wins.
_CODE_BY_MESSAGE = (
    ("database is locked", SQLITE_BUSY), ("is locked", SQLITE_LOCKED),
    ("database or disk is full", SQLITE_FULL), ("disk I/O error", SQLITE_IOERR), ("out of memory", SQLITE_NOMEM),
    ("unable to open database file", SQLITE_CANTOPEN), ("locking protocol", SQLITE_PROTOCOL),
    ("malformed", SQLITE_CORRUPT), ("file is not a database", SQLITE_NOTADB),
    ("readonly database", SQLITE_READONLY), ("access permission denied", SQLITE_PERM),
    ("authorization denied", SQLITE_AUTH),
)


def result_code(exc: sqlite3.Error) -> Optional[int]:
    """SQLite's (extended) result code for `exc`, or None when SQLite did not raise it."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code
    text = str(exc)
    return next((code for fragment, code in _CODE_BY_MESSAGE if fragment in text), None)


def storage_error(exc: sqlite3.Error, path: str) -> Optional[StorageError]:
    """The contract error for `exc` met on the ledger at `path`; None for a programming error."""
    code = result_code(exc)
    if code is None:
        return None
    primary = code & 0xFF
    quoted = shlex.quote(path)
    if primary in (SQLITE_BUSY, SQLITE_LOCKED):
        return StorageBusy(f"the ledger {path} is locked by another process: {exc} (busy timeout {BUSY_TIMEOUT_MS} ms)")
    if primary == SQLITE_FULL:
        return StorageUnavailable(f"the ledger {path} cannot grow: {exc}; free some disk space")
    if primary == SQLITE_IOERR:
        return StorageUnavailable(f"an I/O error on the ledger {path}: {exc}; check the disk and its file system")
    if primary == SQLITE_NOMEM:
        return StorageUnavailable(f"out of memory while using the ledger {path}: {exc}")
    if primary in (SQLITE_CANTOPEN, SQLITE_PROTOCOL):
        return StorageUnavailable(f"SQLite cannot open or lock the ledger {path} or its -wal/-shm files: {exc}")
    if primary == SQLITE_CORRUPT:
        return StorageCorrupt(
            f"the ledger {path} is corrupt ({exc}): stop every process using it; check it with"
            f" `sqlite3 {quoted} 'PRAGMA integrity_check'`; restore it from a backup, or recover what can be"
            f" read with `sqlite3 {quoted} .recover`")
    if primary == SQLITE_NOTADB:
        return NotALedger(f"{path} is not a Yieldstar ledger: {exc}; check the path")
    if code == SQLITE_READONLY_DBMOVED:
        return LedgerGone(f"the ledger {path} was deleted or moved while in use ({exc}): stop every process"
                          f" using it, and put the file back or start on a new one")
    if primary in (SQLITE_READONLY, SQLITE_PERM, SQLITE_AUTH):
        return LedgerGone(f"the ledger {path} can no longer be written ({exc}): check the owner and mode of"
                          f" {quoted} and its -wal and -shm files (`ls -l {quoted}*`) and that the disk is writable")
    return None


def patiently(step: Callable[[], T], *, deadline: float, first_pause_s: float = 0.001,
              longest_pause_s: float = 0.05) -> T:
    """Run `step`, again while it meets a busy file, until `deadline` (monotonic s): after a
    random pause of up to `first_pause_s`, then up to twice as long each time, up to
    `longest_pause_s`. The defaults suit the steps that open a ledger; a write waiting for the
    write lock pauses far less (see the module docstring)."""
    pause = first_pause_s
    while True:
        try:
            return step()
        except StorageBusy:
            if time.monotonic() + pause >= deadline:
                raise
        time.sleep(random.uniform(0, pause))  # apart, so that the waiters do not collide again
        pause = min(pause * 2, longest_pause_s)


def probe(path: str, look: Callable[[sqlite3.Connection], T]) -> Optional[T]:
    """Run `look(db)` in one read transaction on a read-only connection of its own.

    A read-only connection cannot change the file: unlike a writer, it neither rolls back a hot
    journal nor checkpoints a WAL when it closes, so a file is looked at before anything may
    write to it. Returns None when only a writer can read the file (a transaction that another
    program left half-done, which SQLite's recovery must roll back first).
    """
    uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
    try:
        db = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    except sqlite3.Error as exc:
        _raise_mapped(exc, path)
    try:
        db.execute("BEGIN")
        return look(db)
    except sqlite3.Error as exc:
        code = result_code(exc)
        if code is not None and code & 0xFF == SQLITE_READONLY and code != SQLITE_READONLY_DBMOVED:
            return None
        _raise_mapped(exc, path)
    finally:
        db.close()  # ends the read transaction too


def _raise_mapped(exc: sqlite3.Error, path: str) -> NoReturn:
    """Raise the contract error for `exc` (caused by it), or `exc` itself for a programming error."""
    error = storage_error(exc, path)
    if error is None:
        raise exc
    raise error from exc


def identity(path: str, known: Optional[tuple[int, int]] = None) -> Optional[tuple[int, int]]:
    """(st_dev, st_ino) of the file at `path`, not following a symlink; None when there is none,
    and `known` when it cannot be told (the folder's permissions: SQLite reports what matters)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError:
        return known
    return st.st_dev, st.st_ino


def check_durability(durability: Any) -> str:
    if not isinstance(durability, str) or durability not in DURABILITY:
        raise InvalidArgument(f"durability must be one of {sorted(DURABILITY)}, got {durability!r}")
    return durability


class Connection:
    """A thread-safe wrapper around one `sqlite3.Connection` in autocommit mode.

    It only connects and sets per-connection pragmas, which write nothing; the file's checks,
    its journal mode and its schema are `SqliteBackend`'s opening steps.
    """

    #: A write transaction takes the whole database's write lock (see the module docstring).
    whole_database_write_lock = True
    dialect = DIALECT

    def __init__(self, path: str, *, durability: str = "normal", functions: Sequence[tuple[str, int, Callable]] = ()):
        check_durability(durability)
        self.path = os.fspath(path)
        self._lock = threading.RLock()
        # How long a write waits for the write lock before it raises `StorageBusy`; 0 gives up
        # at once (the supervisor loop's own connection, which must not wait: see `LedgerCalls`).
        self.busy_timeout_s = BUSY_TIMEOUT_MS / 1000
        try:
            self._conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
            )
        except sqlite3.Error as exc:
            _raise_mapped(exc, self.path)
        try:
            for name, nargs, fn in functions:
                self._conn.create_function(name, nargs, fn, deterministic=True)
            self._conn.execute(f"PRAGMA synchronous = {DURABILITY[durability]}")  # reads the file: see below
            self._conn.execute("PRAGMA foreign_keys = ON")
            self._conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")
            self._conn.execute("PRAGMA busy_timeout = 0")  # waited out here instead (see the module docstring)
        except sqlite3.Error as exc:
            self._conn.close()
            _raise_mapped(exc, self.path)
        except BaseException:
            self._conn.close()
            raise
        # What each write transaction checks the path against (see the module docstring); an
        # absolute path, so that a chdir changes nothing.
        self._file = None if self.path == MEMORY else os.path.abspath(self.path)
        self._identity = None if self._file is None else identity(self._file)
        # The -wal and -shm this connection uses, (suffix, absolute path, identity) each: recorded
        # by `use_wal`. When a write next looks at them (monotonic s); never for a memory database.
        self._wal_files: tuple[tuple[str, str, tuple[int, int]], ...] = ()
        self._next_look = 0.0 if self._identity is not None else float("inf")

    def check_files(self) -> None:
        """Raise `LedgerGone` if the ledger file, its -wal or its -shm is no longer the file this
        connection opened: deleted, or replaced by another. It only looks at the files (a stat of
        each), takes no lock and waits for nothing, so any thread may call it at any time."""
        if self._identity is None:
            return
        if identity(self._file, self._identity) != self._identity:
            raise self._ledger_gone()
        changed = [(suffix, found) for suffix, path, known in self._wal_files
                   if (found := identity(path, known)) != known]
        if changed:
            raise self._wal_gone(changed)

    def _check_file(self) -> None:
        """Before each write: the ledger file (one stat), and every `FILE_CHECK_S` its -wal and -shm too."""
        if time.monotonic() >= self._next_look:
            self._look_at_files()
        elif self._identity is not None and identity(self._file, self._identity) != self._identity:
            raise self._ledger_gone()

    def _look_at_files(self) -> None:
        self.check_files()  # found gone, the time is not moved on: every later write looks again, and fails
        self._next_look = time.monotonic() + FILE_CHECK_S

    def _ledger_gone(self) -> LedgerGone:
        return LedgerGone(
            f"the ledger {self.path} was deleted or replaced while in use: whatever was written since went"
            f" into a file nobody can open. Stop every process using it; then restore the file, or start"
            f" them on a new one")

    def _wal_gone(self, changed: list[tuple[str, Optional[tuple[int, int]]]]) -> LedgerGone:
        """The error for a -wal or -shm (`changed`: (suffix, what the path names now) each) that is
        no longer the file this connection uses."""
        named = [f"its {suffix} file {self.path}{suffix} was {'deleted' if found is None else 'replaced by another'}"
                 for suffix, found in changed]
        return LedgerGone(
            f"while the ledger {self.path} was in use, {' and '.join(named)}: the work committed to the ledger"
            f" since its last checkpoint is gone, and whatever is written now goes where no process that opens"
            f" the ledger will see it. Stop every process using the ledger. The ledger file itself holds what was"
            f" checkpointed: restore it from a backup, or go on from it knowing that the most recent commits"
            f" were lost")

    @property
    def raw(self) -> sqlite3.Connection:
        return self._conn

    def use_wal(self) -> None:
        """Put the file in WAL mode, unless it is already (the switch takes an exclusive lock)."""
        if self.path == MEMORY:
            return
        with self._lock:
            try:
                mode = self._conn.execute("PRAGMA journal_mode").fetchone()[0]
                if mode != "wal":
                    mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                # A read: a file just switched has its -wal and -shm only from its next read on.
                self._conn.execute("PRAGMA schema_version").fetchone()
            except sqlite3.Error as exc:
                _raise_mapped(exc, self.path)
            if mode == "wal":
                self._wal_files = tuple((suffix, self._file + suffix, found) for suffix in WAL_FILES
                                        if (found := identity(self._file + suffix)) is not None)
        if mode != "wal":
            raise StorageUnavailable(f"SQLite could not put the ledger {self.path} in WAL mode (it stayed {mode})")

    def write(self, *, flush: bool = False, lock_wait_ms: Optional[int] = None) -> ContextManager[sqlite3.Connection]:
        """Run the block in one `BEGIN IMMEDIATE` transaction: commit on success, else roll back.
        `flush` (a claim's commit must survive a crash of the database server) changes nothing
        here: SQLite has no server, and its durability setting holds for every commit. Nor does
        `lock_wait_ms`: SQLite locks no rows, and its one write lock is waited for as by any
        writer (the busy timeout)."""
        return self._transaction("BEGIN IMMEDIATE", check_file=True)

    def read(self) -> ContextManager[sqlite3.Connection]:
        """Run the block in one read transaction, so its statements see one snapshot."""
        return self._transaction("BEGIN", check_file=False)

    @contextmanager
    def _transaction(self, begin: str, *, check_file: bool) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if check_file:
                self._check_file()
            try:
                self._conn.execute(begin)
            except sqlite3.Error as exc:
                self._again_while_busy(exc, begin)
            try:
                yield self._conn
            except sqlite3.Error as exc:
                self._roll_back()
                _raise_mapped(exc, self.path)
            except BaseException:
                self._roll_back()
                raise
            self._commit()

    def _commit(self) -> None:
        try:
            self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            # SQLite keeps the transaction open after some failed COMMITs (a busy one) and rolls
            # it back itself after others (disk full, I/O error): either way none is left open.
            self._roll_back()
            _raise_mapped(exc, self.path)

    def _roll_back(self) -> None:
        """End the open transaction, if SQLite has not already; the caller reports the error."""
        if not self._conn.in_transaction:
            return
        try:
            self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # SQLite still ends the transaction; the error that led here is the one to report

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        """One statement, atomic on its own; its rows are fetched at once."""
        # On every fenced write: a plain try costs less than a context manager, and the files are
        # looked at only once a second (see the module docstring).
        with self._lock:
            if time.monotonic() >= self._next_look:
                self._look_at_files()
            try:
                cursor = self._conn.execute(sql, params)
                return Rows(cursor.fetchall(), cursor.rowcount)
            except sqlite3.Error as exc:
                return self._again_while_busy(exc, sql, params)

    def _again_while_busy(self, exc: sqlite3.Error, sql: str, params: Sequence[Any] = ()) -> Rows:
        """After `sql` raised `exc`: run it again while the file is busy, until the busy timeout
        (see the module docstring); raise the contract error for `exc` if it was not busy."""
        if not isinstance(storage_error(exc, self.path), StorageBusy):
            _raise_mapped(exc, self.path)
        return patiently(lambda: self._rows(sql, params), deadline=time.monotonic() + self.busy_timeout_s,
                         first_pause_s=FIRST_BUSY_PAUSE_S, longest_pause_s=LONGEST_BUSY_PAUSE_S)

    def _rows(self, sql: str, params: Sequence[Any]) -> Rows:
        try:
            cursor = self._conn.execute(sql, params)
            return Rows(cursor.fetchall(), cursor.rowcount)
        except sqlite3.Error as exc:
            _raise_mapped(exc, self.path)

    def close(self) -> None:
        with self._lock:
            try:
                self._conn.close()
            except sqlite3.Error as exc:
                _raise_mapped(exc, self.path)
