"""A busy SQLite file is waited out by the ledger itself, until the busy timeout, then reported.

The ledger's connection sets SQLite's busy timeout to 0 and waits for the lock itself, looking
again from 20 µs apart up to 1 ms apart (`supervisor.ledger.sqlite.connection`). These tests hold
the write lock from another process, the way another writer or a foreign tool does, and check the
two places a busy file can be met: a transaction's BEGIN IMMEDIATE, and a single fenced statement.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from supervisor import open_backend
from supervisor.ledger.errors import StorageBusy
from supervisor.ledger.sqlite import connection
from supervisor.ledger.values import ExecutionLease, LeaseLost

pytestmark = pytest.mark.timeout(60)

# Takes a lock on the file with the statements of argv[2:], says so, and holds it until its
# standard input closes; then says when it let go.
HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
for statement in sys.argv[2:]:
    conn.execute(statement).fetchall()
print("held", flush=True)
sys.stdin.read()
conn.close()
print("released", time.monotonic(), flush=True)
"""

WRITE_LOCK = ("BEGIN IMMEDIATE",)


class Holder:
    def __init__(self, db, statements):
        self.process = subprocess.Popen([sys.executable, "-c", HOLDER, str(db), *statements],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout.readline() == "held\n"

    def release(self) -> None:
        if self.process.stdin.closed:
            return
        self.process.stdin.close()

    def release_after(self, seconds: float) -> None:
        threading.Timer(seconds, self.release).start()

    def released_at(self) -> float:
        """When the holder let go (monotonic s; one clock for every process of this machine)."""
        line = self.process.stdout.readline().split()
        self.process.wait(timeout=30)
        assert line[0] == "released", line
        return float(line[1])


def claimed(ledger, execution_id: str) -> ExecutionLease:
    ledger.executions.admit(execution_id, "wf", "null")
    [lease] = ledger.executions.claim_due(limit=1, duration=60_000)
    assert lease.execution_id == execution_id
    return lease


def test_writes_wait_for_a_write_lock_held_by_another_process_and_then_succeed(sqlite_ledger):
    lease = claimed(sqlite_ledger, "e1")
    for write in (lambda: sqlite_ledger.executions.admit("e2", "wf", "null"),  # a transaction: BEGIN IMMEDIATE
                  lambda: sqlite_ledger.heap.write_step(lease, step_key="s", step_attempt=0, done=True,  # one statement
                                                 step_response_json="1")):
        holder = Holder(sqlite_ledger.path, WRITE_LOCK)
        holder.release_after(0.3)
        write()
        returned = time.monotonic()
        assert holder.released_at() <= returned, "the write went through while the lock was held"
    assert sqlite_ledger.executions.get("e2").status == "admitted"
    assert [(s.step_key, s.step_response_json) for s in sqlite_ledger.heap.steps("e1")] == [("s", "1")]


def test_a_lock_held_past_the_busy_timeout_is_storage_busy_naming_the_file_and_changes_nothing(
        sqlite_ledger, monkeypatch):
    lease = claimed(sqlite_ledger, "e1")
    monkeypatch.setattr(connection, "BUSY_TIMEOUT_MS", 300)
    holder = Holder(sqlite_ledger.path, WRITE_LOCK)
    try:
        for write in (lambda: sqlite_ledger.executions.admit("e2", "wf", "null"),
                      lambda: sqlite_ledger.heap.write_step(lease, step_key="s", step_attempt=0, done=True,
                                                     step_response_json="1"),
                      lambda: sqlite_ledger.executions.renew(lease, duration=60_000)):
            started = time.monotonic()
            with pytest.raises(StorageBusy, match="locked") as raised:
                write()
            assert sqlite_ledger.path in str(raised.value)
            assert time.monotonic() - started >= 0.29, "gave up before the busy timeout (less its last pause)"
    finally:
        holder.release()
        holder.released_at()
    assert sqlite_ledger.executions.get("e2") is None
    assert sqlite_ledger.heap.steps("e1") == []
    assert sqlite_ledger.executions.history("e1")[-1].expires_at == lease.expires_at  # not renewed
    assert not isinstance(sqlite_ledger.executions.renew(lease, duration=60_000), LeaseLost)  # the connection works on


def test_every_writer_of_a_contended_file_gets_through(tmp_path):
    """Four processes each admit 300 executions, one transaction each, into one file at once."""
    path = str(tmp_path / "ledger.db")
    with open_backend(path):
        pass
    writer = ("import sys; from supervisor import open_backend\n"
              "with open_backend(sys.argv[1]) as b:\n"
              "    [b.executions.admit(f'{sys.argv[2]}-{i}', 'wf', 'null') for i in range(300)]\n")
    processes = [subprocess.Popen([sys.executable, "-c", writer, path, f"w{n}"]) for n in range(4)]
    assert [p.wait(timeout=50) for p in processes] == [0, 0, 0, 0]
    with open_backend(path) as backend:
        assert len(backend.executions.list()) == 1200


def test_a_claim_with_nothing_due_looks_without_waiting_for_the_write_lock(sqlite_ledger):
    """An idle supervisor's poll reads first and takes the write lock only for work it saw; right
    after a claim that found work it goes straight for the lock (more is likely), and once a
    claim comes back empty it looks first again."""
    claimed(sqlite_ledger, "e1")
    assert sqlite_ledger.executions.claim_due(limit=1, duration=60_000) == []  # straight for the lock: found none
    holder = Holder(sqlite_ledger.path, WRITE_LOCK)
    try:
        assert sqlite_ledger.executions.claim_due(limit=1, duration=60_000) == []  # a look, no wait
        assert holder.process.poll() is None and not holder.process.stdin.closed, "the lock was held throughout"
    finally:
        holder.release()
        holder.released_at()
