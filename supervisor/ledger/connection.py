"""What the tables need of a backend's connection (`Connection`, `Transaction`), and `Rows`.

Both backends' connections (`sqlite.connection.Connection`, `postgres.connection.Connection`)
have this shape; the table modules are written against it alone.
"""

from __future__ import annotations

from typing import Any, ContextManager, Iterator, Optional, Protocol, Sequence

from .dialect import Dialect


class Cursor(Protocol):
    rowcount: int

    def fetchone(self) -> Optional[tuple]: ...

    def fetchall(self) -> list: ...


class Transaction(Protocol):
    """The statements of one open transaction."""

    def execute(self, sql: str, params: Sequence[Any] = ...) -> Cursor: ...


class Connection(Protocol):
    # The backend's SQL where it differs (`supervisor.ledger.dialect`): the tables run
    # `dialect.statements[TEMPLATE]`, each template rendered for this backend once.
    dialect: Dialect
    # True where a write transaction holds the whole database's write lock (SQLite): then a
    # read-only look before a write saves other writers' time; with row locks it costs a trip.
    whole_database_write_lock: bool

    def write(self, *, flush: bool = False, lock_wait_ms: Optional[int] = None) -> ContextManager[Transaction]:
        """A write transaction; `flush` makes its commit durable whatever the durability;
        `lock_wait_ms` bounds how long its statements wait for a row lock (where the database
        locks rows) before failing as `StorageBusy`, instead of the session's usual bound."""

    def read(self) -> ContextManager[Transaction]:
        """A read-only transaction: one snapshot for every statement in it."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        """One statement in a transaction of its own (in the backend's own SQL: a rendered
        template, or a statement only this backend runs)."""

    def close(self) -> None: ...


class Rows:
    """The rows of one statement, fetched while the connection's lock was held: a failure while
    stepping through them is a contract error too, and no other thread's statement interleaves."""

    __slots__ = ("_rows", "_next", "rowcount")

    def __init__(self, rows: list, rowcount: int):
        self._rows, self._next, self.rowcount = rows, 0, rowcount

    def fetchone(self) -> Optional[tuple]:
        if self._next >= len(self._rows):
            return None
        self._next += 1
        return self._rows[self._next - 1]

    def fetchall(self) -> list:
        rest, self._next = self._rows[self._next:], len(self._rows)
        return rest

    def __iter__(self) -> Iterator[tuple]:
        return iter(self.fetchall())
