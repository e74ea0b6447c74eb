"""`yieldstar backup` and `yieldstar restore` on SQLite: an online copy, and a restore after which
no fencing token issued before it is ever issued again (`supervisor.ledger.sqlite.backup`)."""

from __future__ import annotations

import os
import sqlite3
import stat

import pytest

from faults import cli, wait_until
from supervisor import Completed, LeaseLost, open_backend
from supervisor.ledger.tables.epochs import EPOCH_SPAN, token_epoch

pytestmark = pytest.mark.timeout(120)


def claim_one(backend, now=None):
    (lease,) = backend.executions.claim_due(limit=1, duration=60_000, now=now)
    return lease


def test_a_restore_never_issues_again_a_token_issued_before_it_whether_the_backup_saw_it_or_not(tmp_path):
    ledger, copy = tmp_path / "ledger.db", tmp_path / "backup.db"
    with open_backend(ledger) as backend:
        backend.executions.admit("x", "charge")
        backend.executions.admit("done", "charge")
        first = claim_one(backend)  # token 1, in the backup
        assert cli(ledger, "backup", str(copy)).returncode == 0
        # After the backup: more claims the backup never sees, their holders still alive.
        assert backend.executions.release(first).status == "released"
        later = claim_one(backend, now=backend.clock() + 60_000)
        assert later.token == 2
        finished = claim_one(backend, now=backend.clock() + 60_000)
        assert backend.executions.acknowledge(finished, Completed('"ok"')) == Completed('"ok"')
    done = cli(ledger, "restore", str(copy))
    assert done.returncode == 0, done.stderr
    assert "epoch 1" in done.stdout
    with open_backend(ledger) as backend:
        x = backend.executions.get("x")
        assert x.status == "admitted" and x.token == EPOCH_SPAN  # its open delivery is fenced off
        assert backend.executions.history("x")[-1].ended_by == "fenced"
        again = claim_one(backend, now=backend.clock() + 60_000)
        assert again.execution_id == "x" and again.token == EPOCH_SPAN + 1 and token_epoch(again.token) == 1
        # Holders from before the restore, recorded in the backup or not, are refused everything.
        for stale in (first, later):
            assert backend.executions.renew(stale, duration=60_000) == LeaseLost()
            assert backend.heap.write_step(stale, step_key="k", step_attempt=1, done=True,
                                           step_response_json="1") == LeaseLost()
            assert backend.executions.release(stale) == LeaseLost()
        assert backend.executions.get("x").token == again.token
        # New executions start in the new epoch too.
        assert backend.executions.admit("new", "charge").token == EPOCH_SPAN


def test_a_second_restore_of_an_older_backup_goes_above_the_epoch_of_the_first(tmp_path):
    ledger, old = tmp_path / "ledger.db", tmp_path / "old.db"
    with open_backend(ledger) as backend:
        backend.executions.admit("x", "charge")
    assert cli(ledger, "backup", str(old)).returncode == 0
    assert cli(ledger, "restore", str(old)).returncode == 0
    with open_backend(ledger) as backend:
        assert claim_one(backend).token == EPOCH_SPAN + 1  # issued in epoch 1, unknown to `old`
    done = cli(ledger, "restore", str(old))
    assert done.returncode == 0 and "epoch 2" in done.stdout, done.stderr
    with open_backend(ledger) as backend:
        assert claim_one(backend).token == 2 * EPOCH_SPAN + 1


def test_a_resumed_execution_moves_up_to_the_epoch_of_the_restore(tmp_path):
    ledger, copy = tmp_path / "ledger.db", tmp_path / "backup.db"
    with open_backend(ledger) as backend:
        backend.executions.admit("x", "charge")
        backend.executions.cancel("x")
    assert cli(ledger, "backup", str(copy)).returncode == 0
    assert cli(ledger, "restore", str(copy)).returncode == 0
    with open_backend(ledger) as backend:
        assert backend.executions.get("x").token == 0  # terminal: kept as it was
        assert backend.executions.resume("x").token == EPOCH_SPAN
        assert claim_one(backend).token == EPOCH_SPAN + 1


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_backup_is_taken_while_a_supervisor_works_and_a_restore_is_refused_until_it_stops(tmp_path, supervisors):
    ledger, copy = tmp_path / "ledger.db", tmp_path / "backup.db"
    with open_backend(ledger) as backend:
        for i in range(200):
            backend.executions.admit(f"e{i}", "sv.noop3")
    supervisor = supervisors.start(ledger, concurrency=2)
    wait_until(lambda: _completed(ledger) > 0, 30, message="the supervisor to complete some executions")
    done = cli(ledger, "backup", str(copy))
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(os.stat(copy).st_mode) == 0o600
    assert not os.path.exists(f"{copy}-wal")  # whole in one file
    conn = sqlite3.connect(f"file:{copy}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("SELECT count(*) FROM executions").fetchone() == (200,)
    finally:
        conn.close()

    inode = os.stat(ledger).st_ino
    refused = cli(ledger, "restore", str(copy))
    assert refused.returncode == 2
    assert f"in use by process {supervisor.pid}" in refused.stderr and "Traceback" not in refused.stderr
    assert os.stat(ledger).st_ino == inode and not list(tmp_path.glob("*restoring*"))
    supervisor.signal(15)
    assert supervisor.wait(60) == 0
    done = cli(ledger, "restore", str(copy))
    assert done.returncode == 0, done.stderr
    with open_backend(ledger) as backend:
        assert len(backend.executions.list()) == 200


def _completed(ledger) -> int:
    conn = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True, timeout=15)
    try:
        return conn.execute("SELECT count(*) FROM executions WHERE status = 'completed'").fetchone()[0]
    finally:
        conn.close()


def test_bad_input_to_backup_and_restore_is_one_line_and_changes_nothing(tmp_path, db_snapshot):
    ledger, copy, stranger = tmp_path / "ledger.db", tmp_path / "backup.db", tmp_path / "notes.db"
    with open_backend(ledger) as backend:
        backend.executions.admit("x", "charge")
    other = sqlite3.connect(stranger)
    other.execute("CREATE TABLE notes (text TEXT)")
    other.commit()
    other.close()
    os.chmod(stranger, 0o600)
    copy.write_text("already here")
    before = db_snapshot(ledger)

    cases = [
        (ledger, ("backup", str(copy)), "already exists"),
        (ledger, ("backup", str(tmp_path / "no" / "such" / "b.db")), "does not exist"),
        (tmp_path / "missing.db", ("backup", str(tmp_path / "b2.db")), "no ledger at"),
        (ledger, ("restore", str(stranger)), "not a Yieldstar ledger"),
        (ledger, ("restore", str(tmp_path / "missing.db")), "no ledger at"),
        (ledger, ("restore", str(ledger)), "is the ledger itself"),
        (stranger, ("restore", str(ledger)), "restore does not overwrite it"),
        ("postgresql://u@/db?host=/nowhere", ("restore", str(ledger)), "for SQLite ledgers"),
        ("postgresql://u@/db?host=/nowhere", ("backup", str(tmp_path / "b3.db")), "pg_basebackup"),
    ]
    for db, args, words in cases:
        done = cli(db, *args)
        assert done.returncode == 2, (args, done)
        assert words in done.stderr and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert db_snapshot(ledger) == before
    assert copy.read_text() == "already here"
    assert not (tmp_path / "b2.db").exists() and not (tmp_path / "b3.db").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if "restoring" in p.name) == []
