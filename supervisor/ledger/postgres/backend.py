"""The ledger on a PostgreSQL database: `PostgresBackend(uri)`.

The tables' logic is the modules both backends share (`supervisor.ledger.tables`), run on a
`supervisor.ledger.postgres.connection.Connection`, whose `dialect` (`supervisor.ledger.postgres.
dialect`) renders each shared statement in PostgreSQL's form, with the row locks it names: one
set of rules, so both backends give the same replies and the same errors. The executions table's batch
of acknowledgements and claim is one round trip, a function of PostgreSQL's own
(`supervisor.ledger.postgres.executions`).

Time. With `clock=None`, every time the ledger decides on (claimability, expiry, timers,
`created_at`) is the database server's clock (`clock.ServerClock`: read once a second, carried
forward on the process's monotonic clock, never ahead of the server), so supervisors on hosts
whose clocks disagree still agree on which leases are live. `clock=` and `now=` are
honoured as on SQLite, for tests.
"""

from __future__ import annotations

from typing import Callable, Optional

from .. import arguments
from ..errors import InvalidArgument, NoLedger, StorageError
from ..tables import (
    CHECKED_DELAYS,
    LedgerTables,
    checked_delay,
    default_redelivery_delay,
)
from . import incarnation, notify
from .clock import ServerClock
from .connection import Connection, check_uri, redacted
from .executions import PostgresExecutionTable, batch_function
from .schema import SCHEMA_VERSION, migrate, recognise

SERVER_CLOCK = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"


class PostgresBackend(LedgerTables):
    execution_table = PostgresExecutionTable

    def __init__(self, uri, *, clock: Optional[Callable[[], int]] = None,
                 redelivery_delay: Optional[Callable[[int], int]] = None, durability: str = "normal",
                 create: bool = True, max_payload_bytes: Optional[int] = None):
        check_uri(uri)
        if clock is not None and not callable(clock):
            raise InvalidArgument(f"clock must be callable, not {type(clock).__name__}")
        arguments.boolean("create", create)
        self.max_payload_bytes = arguments.max_payload_bytes("max_payload_bytes", max_payload_bytes)
        self.path = redacted(uri)
        self.redelivery_delay = checked_delay(redelivery_delay or default_redelivery_delay)
        self.durability = durability
        delays = [self.redelivery_delay(n) for n in range(1, CHECKED_DELAYS + 1)]
        self._schema_ready = False  # until then a new session checks only that it may write
        self._incarnation: Optional[str] = None
        self._conn = Connection(uri, durability=durability, delays=delays, functions=batch_function(),
                                on_session=self._on_session)
        self.clock = clock or ServerClock(self._read_server_clock)
        self.one_clock = clock is None
        try:
            with self._conn.write() as db:
                version = recognise(db, self.path)
                if version == 0 and not create:
                    raise NoLedger(f"no ledger in the database {self.path}")
                if version < SCHEMA_VERSION:
                    migrate(db, self.path)
            self._schema_ready = True
            if self._incarnation is not None:
                incarnation.settle(self._conn, self._incarnation, self._clock, self.path)
        except BaseException:
            self._conn.close()
            raise
        self._uri = uri
        self._open_tables()

    def _on_session(self, conn) -> None:
        """Each new session, before its first statement: refuse a standby, and raise the epoch if
        the ledger now runs on another server than before (`incarnation`)."""
        self._incarnation = incarnation.read(conn, self.path)
        if self._schema_ready and self._incarnation is not None:
            incarnation.settle(self._conn, self._incarnation, self._clock, self.path)

    def _announce_due(self) -> None:
        try:
            notify.notify_due(self._conn)
        except StorageError:
            pass  # a hint: the supervisors' polling finds the work anyway

    def _announce_ended(self, execution_ids: list[str]) -> None:
        try:
            notify.notify_ended(self._conn, execution_ids)
        except StorageError:
            pass  # a hint: waiting clients poll

    def listen_for_due(self) -> notify.Listener:
        """What an idle supervisor waits on: told when work becomes due, on any host."""
        return notify.Listener(self._uri, notify.DUE)

    def listen_for_outcomes(self) -> notify.Listener:
        """What a waiting client waits on: told the ids of executions as they end, on any host."""
        return notify.Listener(self._uri, notify.ENDED)

    def _read_server_clock(self) -> int:
        return self._conn.execute(SERVER_CLOCK).fetchone()[0]

