"""The PostgreSQL backend's connection and schema (SPEC section 7), against a real server: the
schema is created once however many processes open a new database at once, a database that is
not a ledger is refused untouched, and every way a session can fail becomes a storage error
that the next call recovers from."""

from __future__ import annotations

import subprocess
import sys
import threading
import urllib.parse

import psycopg
import pytest

from faults import wait_until
from supervisor import open_backend
from supervisor.ledger.errors import LedgerGone, NoLedger, NotALedger, SchemaTooNew, StorageBusy, StorageUnavailable
from supervisor.ledger.postgres.connection import Connection, redacted
from supervisor.ledger.postgres.schema import SCHEMA_VERSION, TABLES, migrate

pytestmark = pytest.mark.timeout(60)


def tables(uri: str) -> set[str]:
    with psycopg.connect(uri) as conn:
        return {name for (name,) in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'").fetchall()}


def open_ledger(uri: str, **kwargs) -> Connection:
    conn = Connection(uri, **kwargs)
    with conn.write() as db:
        migrate(db, uri)
    return conn


OPEN_AND_MIGRATE = """
import sys
from supervisor.ledger.postgres.connection import Connection
from supervisor.ledger.postgres.schema import migrate
conn = Connection(sys.argv[1])
with conn.write() as db:
    print(migrate(db, sys.argv[1]))
"""


def test_many_processes_opening_one_new_database_create_the_schema_once(pg_uri):
    openers = [subprocess.Popen([sys.executable, "-c", OPEN_AND_MIGRATE, pg_uri], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(8)]
    found = []
    for opener in openers:
        out, err = opener.communicate(timeout=50)
        assert opener.returncode == 0, err
        found.append(int(out))
    assert sorted(found) == [0] + [SCHEMA_VERSION] * 7  # one created it; the others found it made
    assert tables(pg_uri) == {*TABLES, "yieldstar_schema"}
    with psycopg.connect(pg_uri) as conn:
        assert conn.execute("SELECT version FROM yieldstar_schema").fetchall() == [(SCHEMA_VERSION,)]


def test_a_database_holding_other_tables_is_refused_untouched(pg_uri):
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER)")
    with pytest.raises(NotALedger, match="invoices"):
        open_ledger(pg_uri)
    assert tables(pg_uri) == {"invoices"}


def test_a_ledger_of_a_newer_version_is_refused(pg_uri):
    open_ledger(pg_uri).close()
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute("UPDATE yieldstar_schema SET version = version + 1")
    with pytest.raises(SchemaTooNew, match=f"understands up to version {SCHEMA_VERSION}"):
        open_ledger(pg_uri)


def test_a_missing_database_is_no_ledger_naming_it(pg_cluster):
    with pytest.raises(NoLedger, match="no ledger database at .*/nowhere"):
        Connection(pg_cluster.uri("nowhere"))


def test_an_empty_database_opened_without_create_is_no_ledger_and_stays_empty(pg_uri):
    with pytest.raises(NoLedger, match="no ledger in the database"):
        open_backend(pg_uri, create=False)
    assert tables(pg_uri) == set()


def test_a_role_that_may_not_connect_is_ledger_gone(pg_cluster, pg_uri):
    with psycopg.connect(pg_cluster.uri(), autocommit=True) as admin:
        admin.execute("CREATE ROLE stranger LOGIN")
        admin.execute(f'REVOKE CONNECT ON DATABASE "{urllib.parse.urlsplit(pg_uri).path[1:]}" FROM PUBLIC')
    stranger = pg_uri.replace("postgres@", "stranger@", 1)
    try:
        with pytest.raises(LedgerGone, match="refuses this user"):
            Connection(stranger)
    finally:
        with psycopg.connect(pg_cluster.uri(), autocommit=True) as admin:
            admin.execute("DROP OWNED BY stranger")
            admin.execute("DROP ROLE stranger")


def test_sessions_run_with_the_ledger_settings_and_claims_flush_whatever_the_durability(pg_uri):
    for durability, committed in (("normal", "off"), ("full", "on")):
        conn = Connection(pg_uri, durability=durability)
        with conn.read() as db:
            assert db.execute("SHOW synchronous_commit").fetchone() == (committed,)
            assert db.execute("SHOW lock_timeout").fetchone() == ("15s",)
            assert db.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("30s",)
            assert db.execute("SHOW application_name").fetchone() == ("yieldstar",)
            for setting, value in (("idle_session_timeout", "0"), ("statement_timeout", "0"),
                                   ("default_transaction_read_only", "off")):
                assert db.execute(f"SHOW {setting}").fetchone() == (value,)
        with conn.write(flush=True) as db:
            assert db.execute("SHOW synchronous_commit").fetchone() == ("on",)
        conn.close()


def test_a_session_killed_while_idle_is_replaced_before_the_next_call_which_succeeds(pg_cluster, pg_uri):
    conn = open_ledger(pg_uri)
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    with psycopg.connect(pg_cluster.uri(), autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
        wait_until(lambda: not admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone(),
                   10, message="the terminated session to end")
    # Its socket reads ready with nothing asked: it is found ended, and a new session answers.
    assert conn.execute("SELECT count(*) FROM executions").fetchone() == (0,)
    assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] != pid


def test_a_row_locked_past_the_lock_timeout_is_busy_and_the_transaction_is_rolled_back(pg_uri):
    conn = open_ledger(pg_uri, lock_timeout_ms=200)
    conn.execute("INSERT INTO stores VALUES ('s', '1', 1, 0, 0)")
    with psycopg.connect(pg_uri) as holder:
        holder.execute("SELECT * FROM stores WHERE name = 's' FOR UPDATE")
        with pytest.raises(StorageBusy, match="busy"):
            with conn.write() as db:
                db.execute("UPDATE stores SET version = 2 WHERE name = 's'")
                db.execute("UPDATE stores SET version = 3 WHERE name = 's'")
        holder.rollback()
    assert conn.execute("SELECT version FROM stores").fetchone() == (1,)
    with conn.write() as db:  # the connection is usable again: nothing was left open
        db.execute("UPDATE stores SET version = 4 WHERE name = 's'")
    assert conn.execute("SELECT version FROM stores").fetchone() == (4,)


def test_a_session_left_inside_a_transaction_is_ended_by_the_server(pg_uri):
    conn = open_ledger(pg_uri, idle_in_transaction_ms=300)
    conn.execute("INSERT INTO stores VALUES ('s', '1', 1, 0, 0)")
    released = threading.Event()
    # A client that froze mid-transaction (here: a block that waits) holds its row lock only until
    # the server ends its session.
    with pytest.raises(StorageUnavailable):
        with conn.write() as db:
            db.execute("SELECT * FROM stores WHERE name = 's' FOR UPDATE")
            released.wait(1.5)
            db.execute("SELECT 1")
    with psycopg.connect(pg_uri) as other:
        other.execute("SET lock_timeout = '1s'")
        assert other.execute("SELECT version FROM stores WHERE name = 's' FOR UPDATE").fetchone() == (1,)
    assert conn.execute("SELECT 1").fetchone() == (1,)


def test_messages_never_show_the_password():
    assert redacted("postgresql://app:s3cret@db.internal/ledger") == "postgresql://app:***@db.internal/ledger"
    assert redacted("postgresql://app@/ledger?host=/run") == "postgresql://app@/ledger?host=/run"


def test_a_version_1_ledger_is_migrated_into_epoch_0_and_records_the_server_it_runs_on(pg_uri):
    from supervisor.ledger.postgres.schema import MIGRATIONS

    with psycopg.connect(pg_uri, autocommit=True) as conn:
        for statement in MIGRATIONS[0]:
            conn.execute(statement)
        conn.execute("INSERT INTO yieldstar_schema (version) VALUES (1)")
        conn.execute("INSERT INTO executions (execution_id, workflow, input_json, status, token, due_at,"
                     " unacknowledged_deliveries, ever_suspended, ready_at, created_at, updated_at)"
                     " VALUES ('old', 'w', 'null', 'admitted', 3, 5, 0, 0, 5, 5, 5)")
    with open_backend(pg_uri) as backend:
        (lease,) = backend.executions.claim_due(limit=1, duration=60_000)
        assert lease.token == 4  # epoch 0: tokens go on as before
    with psycopg.connect(pg_uri) as conn:
        assert conn.execute("SELECT version FROM yieldstar_schema").fetchall() == [(SCHEMA_VERSION,)]
        ((epoch, reason, incarnation),) = conn.execute("SELECT epoch, reason, incarnation FROM epochs").fetchall()
        system = conn.execute("SELECT system_identifier FROM pg_control_system()").fetchone()[0]
    assert (epoch, reason) == (0, "created") and incarnation.startswith(f"{system}:")


def test_a_version_2_ledger_is_migrated_to_routing_and_live_supervisors_and_keeps_its_rows(pg_uri):
    from supervisor.ledger.postgres.schema import MIGRATIONS

    with psycopg.connect(pg_uri, autocommit=True) as conn:
        for statements in MIGRATIONS[:2]:
            for statement in statements:
                conn.execute(statement)
        conn.execute("INSERT INTO yieldstar_schema (version) VALUES (2)")
        for execution_id, workflow in (("old-order", "order"), ("old-refund", "refund")):
            conn.execute("INSERT INTO executions (execution_id, workflow, input_json, status, token, due_at,"
                         " unacknowledged_deliveries, ever_suspended, ready_at, created_at, updated_at)"
                         " VALUES (%s, %s, 'null', 'admitted', 0, 5, 0, 0, 5, 5, 5)", (execution_id, workflow))
    with open_backend(pg_uri) as backend:
        (lease,) = backend.executions.claim_due(limit=10, duration=60_000, workflows={"refund"})
        assert lease.execution_id == "old-refund"
        assert backend.executions.next_ready_at(workflows={"order"}) == 5
        backend.supervisors.register("s", host="h", pid=1, workflows=["refund"], concurrency=1, workers=1,
                                     renew_ms=1_000)
        assert [s.id for s in backend.supervisors.live()] == ["s"]
    with psycopg.connect(pg_uri) as conn:
        assert conn.execute("SELECT version FROM yieldstar_schema").fetchall() == [(SCHEMA_VERSION,)] == [(10,)]
        indexes = {name for (name,) in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'executions'")}
    assert {"executions_claimable_by_workflow", "executions_ready_by_workflow"} <= indexes


def test_a_version_3_ledger_is_migrated_to_queues_and_its_executions_join_the_default_queue(pg_uri):
    from supervisor.ledger.postgres.schema import MIGRATIONS

    with psycopg.connect(pg_uri, autocommit=True) as conn:
        for statements in MIGRATIONS[:3]:
            for statement in statements:
                conn.execute(statement)
        conn.execute("INSERT INTO yieldstar_schema (version) VALUES (3)")
        for execution_id, due in (("old-late", 7), ("old-early", 5)):
            conn.execute("INSERT INTO executions (execution_id, workflow, input_json, status, token, due_at,"
                         " unacknowledged_deliveries, ever_suspended, ready_at, created_at, updated_at)"
                         " VALUES (%s, 'order', 'null', 'admitted', 0, %s, 0, 0, %s, 5, 5)", (execution_id, due, due))
    with open_backend(pg_uri) as backend:
        old = backend.executions.get("old-early")
        assert (old.queue, old.key, old.priority) == ("default", None, 0)
        backend.executions.admit("new-urgent", "order", priority=1, now=10)
        leases = backend.executions.claim_due(limit=10, duration=60_000, now=10, workflows={"order"})
        assert [lease.execution_id for lease in leases] == ["new-urgent", "old-early", "old-late"]
    with psycopg.connect(pg_uri) as conn:
        assert conn.execute("SELECT version FROM yieldstar_schema").fetchall() == [(SCHEMA_VERSION,)] == [(10,)]
        indexes = {name for (name,) in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'executions'")}
    assert {"executions_claimable_by_workflow", "executions_running_by_queue"} <= indexes
    assert "executions_claimable" not in indexes  # one claimable index: (workflow, queue, priority, due_at)


def test_the_uris_own_options_reach_the_server_beside_the_ledgers_settings(pg_cluster, pg_uri):
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA ledger")
    uri = pg_uri + "&options=" + urllib.parse.quote("-csearch_path=ledger")
    with open_backend(uri) as backend:
        backend.executions.admit("e1", "w")
        assert backend.connection.execute("SHOW idle_session_timeout").fetchone() == ("0",)
    with psycopg.connect(pg_uri) as conn:
        assert conn.execute("SELECT count(*) FROM ledger.executions").fetchone() == (1,)


STARTS_A_CLUSTER = """
import sys
from supervisor.chaos.cluster import Cluster
cluster = Cluster().start()
print(cluster.folder, flush=True)
sys.stdin.read()  # killed here, never stopping it
"""


@pytest.mark.timeout(120)
def test_a_cluster_whose_owner_is_killed_is_stopped_and_removed_by_its_guard(pg_cluster):
    """`pg_ctl` starts the server as a daemon: a test run killed before its teardown would leave
    it running. The cluster's guard stops it and removes its folder once its owner is gone."""
    import os
    import signal

    import psutil

    owner = subprocess.Popen([sys.executable, "-c", STARTS_A_CLUSTER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        folder = owner.stdout.readline().strip()
        assert folder and os.path.isdir(folder)
        with open(os.path.join(folder, "data", "postmaster.pid")) as f:
            server = int(f.readline())
        assert psutil.pid_exists(server)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
    wait_until(lambda: not psutil.pid_exists(server) or psutil.Process(server).status() == psutil.STATUS_ZOMBIE,
               timeout=60, message=f"the server pid {server} of the killed owner stopped")
    wait_until(lambda: not os.path.exists(folder), timeout=30, message=f"{folder} removed")
