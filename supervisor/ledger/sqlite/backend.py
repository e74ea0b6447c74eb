"""`SqliteBackend`: one connection to a ledger file, and the clients that share it.

Opening a ledger writes nothing until the file is known to be one (see `SqliteBackend._open`).

The default clock is the wall clock (`wall_clock`, looked up when a backend is opened: a chaos
run's supervisors get one with a skew from the harness: `supervisor/chaos/skewed_clock/`).
"""

from __future__ import annotations

import os
import time
from typing import Callable, Optional

from .. import arguments
from ..errors import InvalidArgument
from ..tables import LedgerTables, checked_delay, default_redelivery_delay
from . import files
from .connection import (
    BUSY_TIMEOUT_MS,
    MEMORY,
    Connection,
    check_durability,
    patiently,
    probe,
)
from .nudge import NudgeListener, OutcomeListener, announce_ended, nudge
from .schema import SCHEMA_VERSION, migrate, recognise

def wall_clock() -> int:
    """Milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000


def _max_or_null(a: Optional[int], b: Optional[int]) -> Optional[int]:
    """The later of two times, or NULL if either is (SQLite's own two-argument MAX, named the
    same on both backends: see `supervisor.ledger.postgres.connection.SESSION_FUNCTIONS`)."""
    return None if a is None or b is None else max(a, b)


class SqliteBackend(LedgerTables):
    """A ledger on one SQLite file. Any number of processes may open the same file at once.

    Raises (when opening):
        NoLedger: there is no file at `path` and `create` is False.
        UnsafeLedgerFile: the file, its -wal, -shm or -journal is a symlink, another user's, or
            open to other users.
        NotALedger: the file is not an SQLite database, or one that Yieldstar did not make.
        SchemaTooNew: a newer Yieldstar made it.
        LedgerGone: this user may not open or write the file.
        StorageBusy, StorageUnavailable: transient; opening again later may succeed.
    """

    def __init__(self, path, *, clock: Optional[Callable[[], int]] = None,
                 redelivery_delay: Optional[Callable[[int], int]] = None, durability: str = "normal",
                 create: bool = True, max_payload_bytes: Optional[int] = None):
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidArgument(f"path must be a str or os.PathLike, not {type(path).__name__}")
        if clock is not None and not callable(clock):
            raise InvalidArgument(f"clock must be callable, not {type(clock).__name__}")
        arguments.boolean("create", create)
        check_durability(durability)
        self.max_payload_bytes = arguments.max_payload_bytes("max_payload_bytes", max_payload_bytes)
        self.clock = clock or wall_clock
        self.redelivery_delay = checked_delay(redelivery_delay or default_redelivery_delay)
        self.path = os.fspath(path)
        self.durability = durability
        self._conn = self._open(create)
        self._open_tables()

    def _open(self, create: bool) -> Connection:
        """Open the ledger in steps, none of which writes before the file is known to be one.

        1. Check the file and its companions, creating an empty owner-only file when missing.
        2. Recognise the schema on a read-only connection: an SQLite file Yieldstar did not
           make is refused unchanged.
        3. Connect, switch to WAL unless the file is already, and create or migrate the
           schema only if it is not current (an open of a current ledger takes no write lock).
        Steps that meet a busy file are repeated until the busy timeout has passed.
        """
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        self._hold = files.FileHold()
        if self.path != MEMORY:
            self._hold = files.check_ledger_file(self.path, create=create)
        try:
            conn = self._connect(deadline)
        except BaseException:
            self._hold.release()
            raise
        return conn

    def _connect(self, deadline: float) -> Connection:
        version = 0
        if self.path != MEMORY:
            version = patiently(lambda: probe(self.path, self._recognise), deadline=deadline)
        functions = [("yieldstar_delay", 1, self.redelivery_delay), ("yieldstar_max", 2, _max_or_null)]
        conn = patiently(lambda: Connection(self.path, durability=self.durability, functions=functions),
                         deadline=deadline)
        try:
            if version is None:  # only a writer can read the file: recognise it on this one
                version = patiently(lambda: self._recognise_on(conn), deadline=deadline)
            patiently(conn.use_wal, deadline=deadline)
            if version < SCHEMA_VERSION:
                patiently(lambda: self._migrate(conn), deadline=deadline)
        except BaseException:
            conn.close()
            raise
        return conn

    def _recognise(self, db) -> int:
        return recognise(db, self.path)

    def _recognise_on(self, conn: Connection) -> int:
        with conn.read() as db:
            return recognise(db, self.path)

    def _migrate(self, conn: Connection) -> None:
        if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
            return  # another process opening the file at the same time created the schema
        with conn.write() as db:
            migrate(db, self.path)

    def spot_twin(self) -> Optional["SqliteBackend"]:
        """A second connection to the file that never waits for its write lock (busy timeout 0),
        with durability "normal" only: a "full" commit syncs the disk (see `LedgerTables.spot_twin`)."""
        if self.durability != "normal" or self.path == MEMORY:
            return None
        twin = SqliteBackend(self.path, clock=self.clock, redelivery_delay=self.redelivery_delay,
                             durability=self.durability, create=False, max_payload_bytes=self.max_payload_bytes)
        twin._conn.busy_timeout_s = 0
        return twin

    def check_files(self) -> None:
        """The ledger file, its -wal and its -shm must be the files this backend opened (see
        `Connection.check_files`; its writes look at them too, once a second)."""
        self._conn.check_files()

    def _announce_due(self) -> None:
        nudge(self.path)

    def _announce_ended(self, execution_ids: list[str]) -> None:
        if self.path != MEMORY:
            announce_ended(self.path, execution_ids)

    def listen_for_due(self) -> NudgeListener:
        """What an idle supervisor waits on: nudged when work becomes due on this host."""
        return NudgeListener(self.path)

    def listen_for_outcomes(self) -> OutcomeListener:
        """A listener told the ids of executions as they become terminal (see `supervisor.ledger.sqlite.nudge`):
        what `worker.Client` waits on. Raises `OSError` if no socket can be made."""
        if self.path == MEMORY:
            raise OSError("an in-memory ledger has no neighbours to hear from")
        return OutcomeListener(self.path)

    def close(self) -> None:
        self._conn.close()
        self._hold.release()  # after the connection: see `files`


def open_backend(path, *, clock=None, redelivery_delay=None, durability="normal", create=True,
                 max_payload_bytes=None) -> SqliteBackend:
    """Open the ledger at `path`, creating it when missing unless `create` is False (then a
    missing file raises `NoLedger("no ledger at PATH")` and nothing is created). See SPEC
    section 3, and `SqliteBackend` for what opening raises."""
    return SqliteBackend(path, clock=clock, redelivery_delay=redelivery_delay, durability=durability, create=create,
                         max_payload_bytes=max_payload_bytes)
