"""Reading a ledger from outside the runtime, on either backend: what the harness's progress
line and drain, the checker, and the `connection_kill` injector read.

`open_reader(target)` gives a read-only connection to a SQLite file (`mode=ro`) or to a
PostgreSQL database (`postgresql://...`). Both take the same SQL: a template, as the ledger's table
modules write theirs (`supervisor.ledger.dialect`), which each reader renders with its backend's
`dialect`: `$p` is a parameter and `$row_order` the column that numbers rows as written (SQLite's
rowid, PostgreSQL's `seq`), so a statement means the same on both. This is the only module of the
harness that knows which backend it reads.

The harness's own PostgreSQL sessions are named `chaos-harness` (`application_name`), never
`yieldstar...`: `connection_kill` only terminates sessions whose name starts with `yieldstar`.
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from ..ledger.backends import is_uri, shown
from ..ledger.dialect import Dialect
from ..ledger.postgres.dialect import DIALECT as POSTGRES_DIALECT
from ..ledger.sqlite.dialect import DIALECT as SQLITE_DIALECT
from ..ledger.errors import InvalidArgument, YieldstarError

HARNESS_APPLICATION = "chaos-harness"
BUSY_TIMEOUT_S = 60
CONNECT_TIMEOUT_S = 10
SQLITE, POSTGRES = "sqlite", "postgres"


class ReadFailed(YieldstarError):
    """A read of the ledger failed (the file is locked for too long, the server went away...)."""


def backend_kind(target) -> str:
    """`postgres` for a `postgresql://` URI, `sqlite` for anything else (a file path)."""
    return POSTGRES if is_uri(target) else SQLITE


class LedgerReader:
    """A read-only connection to one ledger. `rows(template, params)` runs one statement, rendered
    with the reader's `dialect`; within `snapshot()`, every statement reads the same committed
    state."""

    kind: str
    dialect: Dialect

    def __init__(self, target) -> None:
        self.target = target
        self.shown = shown(target)

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        try:
            return self._rows(self.dialect.statements[sql], params)
        except self._errors as exc:
            raise ReadFailed(f"reading the ledger {self.shown} failed: {_first_line(exc)}") from exc

    def _rows(self, sql: str, params: Sequence[Any]) -> list[tuple]:
        raise NotImplementedError

    @contextmanager
    def snapshot(self) -> Iterator["LedgerReader"]:
        try:
            self._begin()
        except self._errors as exc:
            raise ReadFailed(f"reading the ledger {self.shown} failed: {_first_line(exc)}") from exc
        try:
            yield self
        finally:
            self._end()

    def close(self) -> None:
        self._conn.close()


class SqliteReader(LedgerReader):
    kind = SQLITE
    dialect = SQLITE_DIALECT
    _errors = (sqlite3.Error,)

    def __init__(self, path) -> None:
        super().__init__(os.path.abspath(os.fspath(path)))
        if not os.path.exists(self.target):
            raise InvalidArgument(f"no ledger at {self.target}")
        self._conn = sqlite3.connect(f"file:{self.target}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S,
                                     isolation_level=None)
        self._conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_S * 1000}")

    def _rows(self, sql, params):
        return self._conn.execute(sql, params).fetchall()

    def _begin(self) -> None:
        self._conn.execute("BEGIN")

    def _end(self) -> None:
        self._conn.execute("ROLLBACK")


class PostgresReader(LedgerReader):
    kind = POSTGRES
    dialect = POSTGRES_DIALECT

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        try:
            import psycopg
        except ImportError:
            raise InvalidArgument("a PostgreSQL ledger needs psycopg 3: pip install 'yieldstar[postgres]'") from None
        self._errors = (psycopg.Error,)
        self._conn = None
        self._connect()

    def _connect(self):
        import psycopg

        if self._conn is None or self._conn.closed:
            try:
                self._conn = psycopg.connect(self.target, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                                             application_name=HARNESS_APPLICATION)
            except psycopg.Error as exc:
                raise ReadFailed(f"cannot connect to the ledger database {self.shown}: {_first_line(exc)}") from None
        return self._conn

    def _rows(self, sql, params):
        # No parameters, no placeholders: a `%` in the statement (a LIKE pattern) is itself.
        return self._connect().execute(sql, params or None).fetchall()

    def _begin(self) -> None:
        self._connect().execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

    def _end(self) -> None:
        try:
            if not self._conn.closed:
                self._conn.execute("ROLLBACK")
        except self._errors:
            self._conn.close()  # the next read connects again


def open_reader(target) -> LedgerReader:
    """A read-only connection to the ledger at `target` (a SQLite path or a postgresql:// URI)."""
    return PostgresReader(target) if is_uri(target) else SqliteReader(target)


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
