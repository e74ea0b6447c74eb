"""PostgreSQL settings a database's owner may choose, and sessions the server ends, cost nothing.

The owner of the ledger's database (or of its role) can set defaults that every session starts
with: `idle_session_timeout` (the server ends a session idle for longer), `statement_timeout`,
`default_transaction_read_only`. The ledger's sessions set what they need themselves, so none of
them changes what the runtime does; and every SQLSTATE that means the session or the server went
away or refuses is a storage error of the right kind. (A session the server ended while it was
idle is replaced before the next call: tests/ledger/test_postgres_connection.py.)
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from faults import read_log, wait_until
from supervisor import open_backend
from supervisor.ledger.errors import LedgerGone, NoLedger, StorageBusy, StorageUnavailable
from supervisor.ledger.postgres.connection import storage_error

pytestmark = pytest.mark.timeout(120)

IDLE_TIMEOUT_MS = 300


def hostile(admin_uri: str, uri: str) -> None:
    """What an owner might set for the database, after the ledger's schema is there."""
    database = conninfo_to_dict(uri)["dbname"]
    with psycopg.connect(admin_uri, autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {database} SET idle_session_timeout = {IDLE_TIMEOUT_MS}")
        admin.execute(f"ALTER DATABASE {database} SET statement_timeout = 1")
        admin.execute(f"ALTER DATABASE {database} SET default_transaction_read_only = on")


def ledger_sessions(admin_uri: str, uri: str) -> list[int]:
    database = conninfo_to_dict(uri)["dbname"]
    with psycopg.connect(admin_uri, autocommit=True) as admin:
        return [pid for (pid,) in admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name = 'yieldstar'",
            (database,)).fetchall()]


def idle_ms(admin_uri: str, pid: int) -> float:
    """How long the server has seen the session `pid` idle (0 if it is not, or gone)."""
    with psycopg.connect(admin_uri, autocommit=True) as admin:
        row = admin.execute("SELECT extract(epoch FROM clock_timestamp() - state_change) * 1000 FROM"
                            " pg_stat_activity WHERE pid = %s AND state = 'idle'", (pid,)).fetchone()
    return float(row[0]) if row else 0.0


def test_a_holder_idle_past_the_databases_idle_session_timeout_keeps_its_session_and_lease(pg_cluster, pg_uri):
    with open_backend(pg_uri):
        pass  # the schema, made before the owner's settings
    hostile(pg_cluster.uri(), pg_uri)
    with open_backend(pg_uri) as backend:
        backend.executions.admit("e1", "charge")
        (lease,) = backend.executions.claim_due(limit=1, duration=60_000)
        (session,) = ledger_sessions(pg_cluster.uri(), pg_uri)
        # A step that runs longer than the owner's timeout, as the server sees the session idle.
        wait_until(lambda: idle_ms(pg_cluster.uri(), session) >= 3 * IDLE_TIMEOUT_MS, 10, 0.05,
                   f"the ledger's session to stay idle for {3 * IDLE_TIMEOUT_MS} ms")
        written = backend.heap.write_step(lease, step_key="slow", step_attempt=1, done=True,
                                          step_response_json='"done"')
        assert written.step_response_json == '"done"'
        assert ledger_sessions(pg_cluster.uri(), pg_uri) == [session]  # the same session: never ended


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_supervisor_runs_steps_longer_than_the_databases_idle_session_timeout(pg_cluster, pg_uri, tmp_path,
                                                                              supervisors):

    with open_backend(pg_uri) as backend:
        log = str(tmp_path / "steps.log")
        for i in range(2):
            backend.executions.admit(f"slow-{i}", "sv.steps", f'{{"steps": 2, "sleep": 1.0, "log": "{log}"}}')
    hostile(pg_cluster.uri(), pg_uri)
    supervisor = supervisors.start(pg_uri, concurrency=2, lease_ms=3000, renew_ms=1000, heartbeat_ms=300,
                                   until_idle=True)
    assert supervisor.wait(120) == 0, supervisor.log()
    with open_backend(pg_uri) as backend:
        for i in range(2):
            assert backend.executions.get(f"slow-{i}").status == "completed"
    assert len([e for e in read_log(log) if e.event == "begin"]) == 4  # each step ran once


@pytest.mark.parametrize("sqlstate, kind, words", [
    ("57P05", StorageUnavailable, "failed the call"),  # idle_session_timeout
    ("57P01", StorageUnavailable, "failed the call"),  # admin_shutdown
    ("57P03", StorageUnavailable, "failed the call"),  # cannot_connect_now: starting up
    ("08006", StorageUnavailable, "cannot be reached"),  # connection_failure
    ("08P01", StorageUnavailable, "cannot be reached"),  # protocol_violation
    ("53300", StorageUnavailable, "failed the call"),  # too_many_connections
    ("58030", StorageUnavailable, "failed the call"),  # io_error
    ("25P03", StorageUnavailable, "failed the call"),  # idle_in_transaction_session_timeout
    ("57014", StorageBusy, "busy"),  # query_canceled
    ("25006", LedgerGone, "read-only standby"),  # read_only_sql_transaction
    ("57P04", LedgerGone, "was dropped"),  # database_dropped
    ("3D000", NoLedger, "no ledger database"),
])
def test_every_sqlstate_of_a_session_or_server_gone_or_refusing_is_a_storage_error(sqlstate, kind, words):
    error = psycopg.errors.lookup(sqlstate)("the server's message")
    mapped = storage_error(error, "postgresql://app:secret@db/ledger")
    assert type(mapped) is kind, (sqlstate, mapped)
    assert words in str(mapped) and "secret" not in str(mapped)
