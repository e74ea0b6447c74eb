"""One PostgreSQL connection, the settings every session of the ledger runs with, the single way
to run a transaction, and the one place where PostgreSQL's errors become Yieldstar's.

Statements. The connection runs what it is given, in PostgreSQL's own SQL with psycopg's `%s`
parameters: the shared tables' statements come rendered by its `dialect` (`supervisor.ledger.
postgres.dialect`, which writes their row locks, `seq` and the session's functions), and the
backend's own (the schema, notifications, the batch function) are written for PostgreSQL alone.

Isolation. Transactions run at READ COMMITTED; a read-modify-write locks the rows it decides on
(`SELECT ... FOR UPDATE`, or `FOR SHARE` inside a fenced statement), so that a claim that moves a
token and a stale holder's write can never both commit (SPEC section 7). No transaction is ever
retried on a serialization failure: there are none at this level, and a deadlock between two
writers is reported as `StorageBusy`, which the caller retries like a busy SQLite file.

Settings (`Connection._settings`), made per session so that what a database's owner set for the
database or the role cannot change how the ledger behaves. `lock_timeout` bounds how long a
statement waits for a row lock; `idle_in_transaction_session_timeout` makes the server end a
session that sits inside a transaction (a client frozen or cut off mid-transaction), so that it
cannot keep an execution row locked for long. An idle session is never ended
(`idle_session_timeout = 0`; a worker's connection idles through every long step), no statement
is cut short by a `statement_timeout` (and, on servers that have it, `transaction_timeout`), and
transactions may write (`default_transaction_read_only = off`). TCP keepalives and
`tcp_user_timeout` let the client notice a dead link (both only mean something on TCP; a Unix
socket ignores them). `application_name` names the session in `pg_stat_activity`.

A session the server ended while it was idle (an administrator's `pg_terminate_backend`, a
restart) is found dead before its next statement is sent, and another is opened in its place,
so the call does not fail for it. After each connection is made, the backend checks which server
it reached (`Connection.on_session`; see `supervisor.ledger.postgres.incarnation`).

Errors, by SQLSTATE class (https://www.postgresql.org/docs/current/errcodes-appendix.html):

    a broken connection (08xxx, no code), 53xxx (resources),
    57P01-3 and 57P05 (shutdown, starting, idle session),
    58xxx (system I/O), 25P03 (idle in transaction too long)    StorageUnavailable  transient
    55P03 (lock timeout), 40001, 40P01 (deadlock), 57014         StorageBusy         transient
    3D000 (no such database)                                     NoLedger            lasting
    28xxx (authentication), 42501 (no privilege),
    25006 (a read-only standby), 57P04 (database dropped)        LedgerGone          lasting
    XX001, XX002 (data corrupted)                                StorageCorrupt      lasting

Any other error (a syntax or constraint error, a call on a closed backend) is a mistake in the
calling code and propagates unchanged. A connection that broke is closed, and the next call
opens a new one: a server restart costs the calls made while it was down, nothing else.
"""

from __future__ import annotations

import select
import threading
import urllib.parse
from contextlib import contextmanager
from typing import Any, Callable, ContextManager, Iterator, NoReturn, Optional, Sequence

from ..connection import Rows
from ..errors import (
    InvalidArgument,
    LedgerGone,
    NoLedger,
    StorageBusy,
    StorageCorrupt,
    StorageError,
    StorageUnavailable,
)
from .dialect import DIALECT

LOCK_TIMEOUT_MS = 15_000  # as SQLite's busy timeout
IDLE_IN_TRANSACTION_MS = 30_000
CONNECT_TIMEOUT_S = 10
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
              "tcp_user_timeout": 10_000}
# `durability`: "normal" lets a commit return before its WAL record is flushed (a server crash may
# lose the last moments of commits, never corrupt anything); "full" waits for the flush. Claims
# flush whatever this says (see `Connection.write(flush=True)`): a claim lost in a crash could
# hand out the same token twice.
SYNCHRONOUS_COMMIT = {"normal": "off", "full": "on"}


# What every session of the ledger runs with, whatever the database's or the role's defaults say
# (see the module docstring); and those only newer servers know, by the version that brought them.
SESSION_SETTINGS = {"idle_session_timeout": "0", "statement_timeout": "0", "default_transaction_read_only": "off"}
NEWER_SETTINGS = ((170000, "transaction_timeout", "0"),)


def _uri_options(uri: str) -> str:
    """The `options` the URI gives the server, if any (`?options=-csearch_path=ledger`)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        return str(conninfo_to_dict(uri).get("options") or "")
    except Exception:  # noqa: BLE001 - a URI libpq cannot parse fails at connect, with libpq's message
        return ""


def _ended_while_idle(conn) -> bool:
    """Whether the server ended this idle session. It says why, then closes the socket, so the
    socket reads ready while no statement is out; nothing else comes unasked to a session that
    listens for nothing. So a ready socket is taken for an ended session: at worst a session that
    was sent a notice is replaced by a new one."""
    import psycopg

    try:
        ready, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    except (psycopg.Error, OSError, ValueError):
        return True
    return bool(ready)


# What the shared statements call that SQLite has built in or as a Python function (the dialect's
# `$yieldstar_delay`, `$yieldstar_max`): made for each session, in its own temporary schema (so
# nothing is left behind, and no other session sees them).
SESSION_FUNCTIONS = """
CREATE FUNCTION pg_temp.yieldstar_delay(n bigint) RETURNS bigint LANGUAGE sql IMMUTABLE
    AS $$ SELECT (ARRAY[{delays}]::bigint[])[LEAST(GREATEST(n, 1), {count})] $$;
CREATE FUNCTION pg_temp.yieldstar_max(a bigint, b bigint) RETURNS bigint LANGUAGE sql IMMUTABLE
    AS $$ SELECT CASE WHEN a IS NULL OR b IS NULL THEN NULL ELSE GREATEST(a, b) END $$;
"""


def redacted(uri: str) -> str:
    """The URI without its password, for messages and logs."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def storage_error(exc: Exception, target: str) -> Optional[StorageError]:
    """The contract error for a psycopg error met on the database `target`; None for a mistake."""
    import psycopg

    code = getattr(exc, "sqlstate", None) or _refused_connection_code(str(exc))
    where = redacted(target)
    if code.startswith("08") or (isinstance(exc, psycopg.OperationalError) and not code):
        return StorageUnavailable(f"the ledger database {where} cannot be reached: {_first_line(exc)}")
    if code in ("55P03", "40001", "40P01", "57014"):
        return StorageBusy(f"the ledger database {where} is busy: {_first_line(exc)} (lock timeout"
                           f" {LOCK_TIMEOUT_MS} ms)")
    if code == "25006":
        return LedgerGone(standby(where))
    if code == "57P04":
        return LedgerGone(f"the ledger database {where} was dropped: {_first_line(exc)}; restore it, or start on a"
                          f" new one")
    if code.startswith(("53", "57P", "58")) or code == "25P03":
        return StorageUnavailable(f"the ledger database {where} failed the call: {_first_line(exc)}")
    if code == "3D000":
        return NoLedger(f"no ledger database at {where}: {_first_line(exc)}; create it (createdb) or check the URI")
    if code.startswith("28") or code == "42501":
        return LedgerGone(f"the ledger database {where} refuses this user: {_first_line(exc)}; check the role and"
                          f" its privileges")
    if code in ("XX001", "XX002"):
        return StorageCorrupt(f"the ledger database {where} reports corrupt data: {_first_line(exc)}; see the"
                              f" server's log and restore from a backup")
    return None


# A connection the server refuses carries no SQLSTATE in psycopg, only the server's message.
_REFUSALS = (("does not exist", "database \"", "3D000"), ("password authentication failed", "", "28P01"),
             ("no pg_hba.conf entry", "", "28000"), ("permission denied for database", "", "42501"))


def _refused_connection_code(message: str) -> str:
    if "FATAL" not in message:
        return ""
    if 'role "' in message and "does not exist" in message:
        return "28000"
    return next((code for text, also, code in _REFUSALS if text in message and also in message), "")


def standby(where: str) -> str:
    """What to say when the ledger's server is a read-only standby."""
    return (f"the ledger database {where} is a read-only standby (a replica in recovery): point the URI at the"
            f" primary; with several hosts in one URI, add target_session_attrs=read-write")


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def check_uri(uri: Any) -> str:
    if not isinstance(uri, str) or not uri.startswith(("postgresql://", "postgres://")):
        raise InvalidArgument(f"a PostgreSQL ledger is named by a postgresql:// URI, not {uri!r}")
    return uri


class Session:
    """What a connection's statements run on, in a transaction's block or alone: one cursor for
    every statement of the connection (a new cursor per statement costs more than the statement's
    own client work), each statement's rows fetched at once."""

    def __init__(self, cursor) -> None:
        self.cursor = cursor

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        cursor = self.cursor.execute(sql, params)
        # `rownumber` says whether the statement returned rows without building `description`'s
        # column objects, which cost more than fetching a row.
        rows = cursor.fetchall() if cursor.rownumber is not None else []
        return Rows(rows, cursor.rowcount)


class Connection:
    """A thread-safe wrapper around one psycopg connection, opened again after it breaks."""

    #: Writers lock rows, not the database: a write transaction that finds nothing to do blocks
    #: no one, so there is no need to look before writing.
    whole_database_write_lock = False
    dialect = DIALECT

    def __init__(self, uri: str, *, durability: str = "normal", lock_timeout_ms: int = LOCK_TIMEOUT_MS,
                 idle_in_transaction_ms: int = IDLE_IN_TRANSACTION_MS, delays: Sequence[int] = (1000,),
                 functions: str = "", on_session: Optional[Callable[[Any], None]] = None):
        """`delays`: the redelivery delay after 1, 2, ... unacknowledged deliveries (the last one
        stands for every later count), made the session's `pg_temp.yieldstar_delay(n)`.
        `functions`: more of the session's own functions (`CREATE FUNCTION pg_temp....`).
        `on_session(psycopg_connection)`: run once each new session is open, before its first
        statement (the backend checks which server it reached); what it raises closes the session,
        and the next call tries again."""
        self.target = check_uri(uri)
        self._functions = SESSION_FUNCTIONS.format(delays=", ".join(str(int(d)) for d in delays),
                                                   count=len(delays)) + functions
        if durability not in SYNCHRONOUS_COMMIT:
            raise InvalidArgument(f"durability must be one of {sorted(SYNCHRONOUS_COMMIT)}, got {durability!r}")
        self.durability = durability
        self._settings = {"lock_timeout": str(lock_timeout_ms),
                          "idle_in_transaction_session_timeout": str(idle_in_transaction_ms),
                          "synchronous_commit": SYNCHRONOUS_COMMIT[durability],
                          **SESSION_SETTINGS}
        self.on_session = on_session
        self._uri_options = _uri_options(self.target)
        self._lock = threading.RLock()
        self._conn = None
        self._session: Optional[Session] = None  # on `_conn`
        self._closed = False
        with self._lock:
            self._connected()

    def _connected(self) -> Session:
        """The open connection's session, opening one if there is none (the last one broke, or
        the server ended it while it was idle)."""
        if self._closed:
            raise InvalidArgument("the backend is closed")
        if self._conn is not None and not self._conn.closed:
            if not _ended_while_idle(self._conn):
                return self._session
            self._conn.close()
        import psycopg

        # The URI's own options (a search_path, say) come first; the ledger's settings win.
        ours = " ".join(f"-c {name}={value}" for name, value in self._settings.items())
        options = f"{self._uri_options} {ours}".strip()
        try:
            self._conn = psycopg.connect(self.target, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                                         options=options, application_name="yieldstar", **KEEPALIVES)
            newer = "".join(f";\nSET {name} = {value}" for version, name, value in NEWER_SETTINGS
                            if self._conn.info.server_version >= version)
            self._conn.execute(self._functions + newer)
        except psycopg.Error as exc:
            self._raise_mapped(exc)
        self._session = Session(self._conn.cursor())
        if self.on_session is not None:
            try:
                self.on_session(self._conn)
            except psycopg.Error as exc:
                self._conn.close()
                self._raise_mapped(exc)
            except BaseException:
                self._conn.close()
                raise
        return self._session

    def write(self, *, flush: bool = False, lock_wait_ms: Optional[int] = None) -> ContextManager[Session]:
        """Run the block in one READ COMMITTED transaction: commit on success, else roll back.
        `flush`: the commit waits for its WAL record to reach the disk, whatever the durability.
        `lock_wait_ms`: its statements wait at most this long for a row lock (`lock_timeout`)."""
        begin = "BEGIN ISOLATION LEVEL READ COMMITTED"
        if lock_wait_ms is not None:
            begin += f"; SET LOCAL lock_timeout = {int(lock_wait_ms)}"  # ms; sent with the BEGIN
        return self._transaction(begin, flush)

    def read(self) -> ContextManager[Session]:
        """Run the block in one read-only transaction that sees one snapshot."""
        return self._transaction("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", False)

    @contextmanager
    def _transaction(self, begin: str, flush: bool) -> Iterator[Session]:
        import psycopg

        with self._lock:
            session = self._connected()
            if flush and self.durability != "full":
                begin += "; SET LOCAL synchronous_commit = on"  # one round trip: a query without parameters
            try:
                session.cursor.execute(begin)
            except psycopg.Error as exc:
                self._failed(exc)
            try:
                yield session
            except psycopg.Error as exc:
                self._failed(exc)
            except BaseException:
                self._roll_back()
                raise
            try:
                session.cursor.execute("COMMIT")
            except psycopg.Error as exc:
                self._failed(exc)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        """One statement, atomic on its own; its rows are fetched at once."""
        import psycopg

        with self._lock:
            session = self._connected()
            try:
                return session.execute(sql, params)
            except psycopg.Error as exc:
                self._failed(exc)

    def _failed(self, exc: Exception) -> NoReturn:
        self._roll_back()
        self._raise_mapped(exc)

    def _roll_back(self) -> None:
        """End the open transaction, if any; a connection that cannot is dropped (a new one is
        opened by the next call), so that no transaction is ever left open."""
        conn = self._conn
        if conn is None or conn.closed:
            return
        try:
            if conn.info.transaction_status != 0:  # not IDLE
                conn.execute("ROLLBACK")
        except Exception:  # noqa: BLE001 - whatever broke, the connection goes
            conn.close()

    def _raise_mapped(self, exc: Exception) -> NoReturn:
        error = storage_error(exc, self.target)
        if error is None:
            raise exc
        if self._conn is not None and (self._conn.broken or isinstance(error, StorageUnavailable)):
            self._conn.close()  # the next call connects again
        raise error from exc

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
