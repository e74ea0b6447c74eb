"""What the SQLite ledger alone has, beside the contract both backends pass
(`test_ledger_contract.py`): the file's mode, purge's transactions as SQLite's trace shows them,
the schema's migrations, and a claim's work counted in SQLite's instructions."""

from __future__ import annotations

import os
import sqlite3
import stat

import pytest

from supervisor import open_backend
from supervisor.ledger.sqlite.schema import MIGRATIONS, SCHEMA_VERSION
from supervisor.ledger.tables import operators as table_operators
from supervisor.ledger.values import WaitReason


def test_the_database_file_is_readable_and_writable_by_its_owner_only(sqlite_path, clock):
    with open_backend(sqlite_path, clock=clock) as backend:
        backend.executions.admit("order-42", "charge")
        files = [p for p in (sqlite_path, sqlite_path.with_name(sqlite_path.name + "-wal"),
                             sqlite_path.with_name(sqlite_path.name + "-shm")) if p.exists()]
        assert sqlite_path in files
        for path in files:
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path


def test_purge_works_in_batches_each_its_own_transaction(sqlite_path, clock, monkeypatch):
    backend = open_backend(sqlite_path, clock=clock)  # SQLite's trace shows the transactions
    monkeypatch.setattr(table_operators, "PURGE_BATCH", 7)
    for n in range(50):
        backend.executions.admit(f"e{n}", "order")
        backend.executions.cancel(f"e{n}")
    begins = []
    backend.connection.raw.set_trace_callback(lambda sql: begins.append(sql) if sql.startswith("BEGIN") else None)
    try:
        clock.advance(1)
        assert backend.executions.purge(before=clock.now) == 50
    finally:
        backend.connection.raw.set_trace_callback(None)
    assert len(begins) >= 50 // 7 + 1, begins
    assert backend.executions.list() == []
    backend.close()


def test_a_version_1_ledger_is_migrated_and_keeps_its_rows(tmp_path):
    path = tmp_path / "v1.db"
    db = sqlite3.connect(path, isolation_level=None)
    for statement in MIGRATIONS[0]:
        db.execute(statement)
    db.execute("PRAGMA user_version = 1")
    db.execute("INSERT INTO executions (execution_id, workflow, input_json, status, token, due_at,"
               " unacknowledged_deliveries, ever_suspended, ready_at, created_at, updated_at)"
               " VALUES ('old', 'w', 'null', 'admitted', 0, 5, 0, 0, 5, 5, 5)")
    db.execute("INSERT INTO waiters VALUES ('effect', 'e', 'old', 5)")
    db.close()
    path.chmod(0o600)
    with open_backend(path) as backend:
        assert backend.executions.get("old").status == "admitted"
        assert backend.executions.waiting_for("old", now=10) == [WaitReason("effect", "e"), WaitReason("due", None, 5)]
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 11
    assert "detail" in [row[1] for row in db.execute("PRAGMA table_info(waiters)")]
    # Version 3: a ledger from before epochs ran in epoch 0, and goes on in it.
    assert db.execute("SELECT epoch, reason FROM epochs").fetchall() == [(0, "created")]


def test_a_version_3_ledger_is_migrated_to_routing_and_live_supervisors_and_keeps_its_rows(tmp_path):
    path = tmp_path / "v3.db"
    db = sqlite3.connect(path, isolation_level=None)
    for statements in MIGRATIONS[:3]:
        for statement in statements:
            db.execute(statement)
    db.execute("PRAGMA user_version = 3")
    for execution_id, workflow in (("old-order", "order"), ("old-refund", "refund")):
        db.execute("INSERT INTO executions (execution_id, workflow, input_json, status, token, due_at,"
                   " unacknowledged_deliveries, ever_suspended, ready_at, created_at, updated_at)"
                   " VALUES (?, ?, 'null', 'admitted', 0, 5, 0, 0, 5, 5, 5)", (execution_id, workflow))
    db.close()
    path.chmod(0o600)
    with open_backend(path) as backend:
        (lease,) = backend.executions.claim_due(limit=10, duration=60_000, workflows={"refund"})
        assert lease.execution_id == "old-refund"
        assert backend.executions.next_ready_at(workflows={"order"}) == 5
        backend.supervisors.register("s", host="h", pid=1, workflows=["refund"], concurrency=1, workers=1,
                                     renew_ms=1_000)
        assert [s.id for s in backend.supervisors.live()] == ["s"]
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 11
    indexes = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"executions_claimable_by_workflow", "executions_ready_by_workflow"} <= indexes


def test_a_version_4_ledger_is_migrated_to_queues_and_its_executions_join_the_default_queue(tmp_path):
    path = tmp_path / "v4.db"
    db = sqlite3.connect(path, isolation_level=None)
    for statements in MIGRATIONS[:4]:
        for statement in statements:
            db.execute(statement)
    db.execute("PRAGMA user_version = 4")
    for execution_id, due in (("old-late", 7), ("old-early", 5)):
        db.execute("INSERT INTO executions (execution_id, workflow, input_json, status, token, due_at,"
                   " unacknowledged_deliveries, ever_suspended, ready_at, created_at, updated_at)"
                   " VALUES (?, 'order', 'null', 'admitted', 0, ?, 0, 0, ?, 5, 5)", (execution_id, due, due))
    db.close()
    path.chmod(0o600)
    with open_backend(path) as backend:
        old = backend.executions.get("old-early")
        assert (old.queue, old.key, old.priority) == ("default", None, 0)
        backend.executions.admit("new-urgent", "order", priority=1, now=10)
        leases = backend.executions.claim_due(limit=10, duration=60_000, now=10, workflows={"order"})
        assert [lease.execution_id for lease in leases] == ["new-urgent", "old-early", "old-late"]
        backend.queues.declare("default", concurrency=1)
        assert [q.name for q in backend.queues.list()] == ["default"]
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 11
    indexes = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"executions_claimable_by_workflow", "executions_running_by_queue"} <= indexes
    assert "executions_claimable" not in indexes  # one claimable index: (workflow, queue, priority, due_at)


def claim_steps(backend, **claim) -> int:
    """The SQLite virtual machine's instructions one claim runs: a count that the rows it reads
    move, and the machine's load does not."""
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    backend.connection.raw.set_progress_handler(count, 1)
    try:
        backend.executions.claim_due(duration=60_000, **claim)
    finally:
        backend.connection.raw.set_progress_handler(None, 1)
    return steps


@pytest.mark.timeout(120)
@pytest.mark.parametrize("limit", [{"concurrency": 1}, {"per_key": 1}], ids=["saturated queue", "hot key"])
def test_a_claims_work_does_not_grow_with_the_backlog_behind_a_saturated_queue_or_key(tmp_path, clock, limit):
    steps = {}
    for backlog in (50, 500):
        with open_backend(tmp_path / f"ledger-{backlog}.db", clock=clock) as backend:
            backend.queues.declare("limited", **limit)
            key = "hot" if "per_key" in limit else None
            backend.executions.admit("holder", "wf", queue="limited", key=key, priority=9)
            assert [lease.execution_id for lease in backend.executions.claim_due(limit=1, duration=60_000)] \
                == ["holder"]
            for i in range(backlog):
                backend.executions.admit(f"blocked-{i}", "wf", queue="limited", key=key, priority=9)
            backend.executions.admit("free", "wf")
            backend.executions.admit("other-key", "wf", queue="limited", key="cold")
            first = claim_steps(backend, limit=1)
            second = claim_steps(backend, limit=2, workflows={"wf"})
            poll = claim_steps(backend, limit=1)
            steps[backlog] = (first, second, poll)
            ids = {record.execution_id for record in backend.executions.list() if record.status == "running"}
            expected = {"holder", "free"} | ({"other-key"} if key else set())
            assert ids == expected
    assert steps[500] == steps[50], steps
