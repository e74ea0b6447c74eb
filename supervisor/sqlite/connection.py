"""One SQLite connection, its pragmas, and the single way to run a write transaction.

Every read-modify-write goes through `Connection.write()`: `BEGIN IMMEDIATE` takes the
database's write lock up front, so two processes can never both read a row and then both
update it; an exception rolls back, and a normal exit commits. Single-statement fenced writes
(`renew`, `write_step`) are atomic on their own and run through `Connection.execute()`.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

from ..errors import InvalidArgument, StorageBusy

DURABILITY = {"normal": "NORMAL", "full": "FULL"}
BUSY_TIMEOUT_MS = 15_000


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc)
    return "locked" in text or "busy" in text


def _create_private(path: str) -> None:
    """Create the database file readable and writable by its owner only.

    SQLite gives the -wal and -shm files it creates later the same permissions.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    os.close(fd)


class Connection:
    """A thread-safe wrapper around one `sqlite3.Connection` in autocommit mode."""

    def __init__(self, path: str, *, durability: str = "normal", functions: Sequence[tuple[str, int, Callable]] = ()):
        if durability not in DURABILITY:
            raise InvalidArgument(f"durability must be one of {sorted(DURABILITY)}, got {durability!r}")
        self.path = os.fspath(path)
        if self.path != ":memory:":
            _create_private(self.path)
        self._lock = threading.RLock()
        self._conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
        )
        for name, nargs, fn in functions:
            self._conn.create_function(name, nargs, fn, deterministic=True)
        with self._busy(), self._closing_on_error():
            self._conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute(f"PRAGMA synchronous = {DURABILITY[durability]}")
            self._conn.execute("PRAGMA foreign_keys = ON")

    @contextmanager
    def _closing_on_error(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            self._conn.close()
            raise

    @property
    def raw(self) -> sqlite3.Connection:
        return self._conn

    @contextmanager
    def _busy(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                raise StorageBusy(f"database {self.path} is locked by another process: {exc}") from exc
            raise

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """Run the block in one `BEGIN IMMEDIATE` transaction: commit on success, else roll back."""
        with self._lock, self._busy():
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """Run the block in one read transaction, so its statements see one snapshot."""
        with self._lock, self._busy():
            self._conn.execute("BEGIN")
            try:
                yield self._conn
            finally:
                self._conn.execute("COMMIT")

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        """One statement, atomic on its own."""
        # On every fenced write: a plain try costs less than entering `_busy()`.
        with self._lock:
            try:
                return self._conn.execute(sql, params)
            except sqlite3.OperationalError as exc:
                if _is_busy(exc):
                    raise StorageBusy(f"database {self.path} is locked by another process: {exc}") from exc
                raise

    def close(self) -> None:
        with self._lock:
            self._conn.close()
