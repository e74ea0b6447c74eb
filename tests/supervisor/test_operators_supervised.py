"""Cancel and resume against a real supervisor and its worker processes."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from faults import TESTS, admit, cli, read_log, wait_gone, wait_until

from supervisor import ExecutionLease, LeaseLost, open_backend


@pytest.mark.timeout(60)
def test_cancel_of_a_running_execution_stops_its_worker_and_refuses_its_writes(each_backend, tmp_path, supervisors):
    db = each_backend
    options = {"log": str(tmp_path / "effects.log"), "gate": str(tmp_path / "gate")}
    admit(db, "held", "sv.hold", options)
    # Renewals every 3 s: only the check made each heartbeat can stop the worker sooner.
    supervisor = supervisors.start(db, concurrency=1, lease_ms=9000, renew_ms=3000, heartbeat_ms=200)
    waiting = wait_until(lambda: next((e for e in read_log(options["log"]) if e.event == "waiting"), None),
                         message="the held step to start")
    with open_backend(db) as backend:
        lease = next(h for h in backend.executions.history("held") if h.ended_by is None)
        cancelled_at = time.monotonic()
        assert cli(db, "cancel", "held", "--reason", "operator test").returncode == 0
        wait_gone([waiting.pid], timeout=5)
        stopped_after = time.monotonic() - cancelled_at
        stale = ExecutionLease("held", lease.token, lease.expires_at)
        assert isinstance(backend.heap.write_step(stale, step_key="hold", step_attempt=1, done=True,
                                                  step_response_json="1"), LeaseLost)
        Path(options["gate"]).touch()  # the step would end now, had its worker lived
        wait_until(lambda: "its delivery ended in the ledger (cancelled" in supervisor.log(), message="the supervisor to say why it killed the worker")
        wait_until(lambda: backend.executions.stats().live_leases == [] and
                   backend.executions.stats().by_status["cancelled"] == 1)
        record = backend.executions.get("held")
        assert record.status == "cancelled" and json.loads(record.error_json)["message"] == "operator test"
        assert [s.step_key for s in backend.heap.steps("held")] == ["before"]
    assert not any(e.event == "end" and e.step_key == "hold" for e in read_log(options["log"]))
    # Within a few heartbeats (200 ms each), not a renewal round or a lease.
    assert stopped_after < 1.5, stopped_after
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(20) == 0


@pytest.mark.timeout(60)
def test_resume_after_the_bug_is_fixed_runs_only_the_steps_not_done(each_backend, tmp_path, supervisors):
    db = each_backend
    log = tmp_path / "steps.log"
    Path(f"{log}.bug").touch()
    admit(db, "order-42", "rs.order", {"log": str(log)})
    supervisor = supervisors.start(db, app=str(TESTS / "apps" / "resume_app.py"), concurrency=1)
    with open_backend(db) as backend:
        wait_until(lambda: backend.executions.get("order-42").status == "failed", message="the buggy run to fail")
        assert log.read_text().split() == ["reserve", "charge"]
        Path(f"{log}.bug").unlink()  # the fix
        assert cli(db, "resume", "order-42").returncode == 0
        wait_until(lambda: backend.executions.get("order-42").status == "completed", message="the resumed run")
        assert json.loads(backend.executions.get("order-42").result_json) == ["reserve", "charge", "ship"]
    assert log.read_text().split() == ["reserve", "charge", "charge", "ship"]
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(20) == 0


@pytest.mark.timeout(90)
def test_purge_while_a_supervisor_runs_deletes_only_finished_executions(each_backend, tmp_path, supervisors, monkeypatch):
    from supervisor.ledger.tables import operators as table_operators

    monkeypatch.setattr(table_operators, "PURGE_BATCH", 10)  # many short transactions beside the supervisor's
    db = each_backend
    with open_backend(db) as backend:
        for n in range(200):
            backend.executions.admit(f"old-{n}", "sv.noop3")
    supervisor = supervisors.start(db, concurrency=2)
    with open_backend(db) as backend:
        wait_until(lambda: backend.executions.stats().by_status["completed"] == 200, timeout=60)
        options = {"log": str(tmp_path / "effects.log"), "gate": str(tmp_path / "gate")}
        backend.executions.admit("held", "sv.hold", json.dumps(options))  # running during the purge
        wait_until(lambda: backend.executions.get("held").status == "running")
        for n in range(100):
            backend.executions.admit(f"new-{n}", "sv.noop3")
        purged = backend.executions.purge(before=backend.clock() + 1)
        assert 200 <= purged <= 300
        Path(options["gate"]).touch()
        wait_until(lambda: backend.executions.get("held") is not None
                   and backend.executions.get("held").status == "completed", timeout=30)
        left = backend.executions.list(id_prefix="old-")
        assert left == []
        # Every execution that was not finished when the purge ran is still there, and finishes.
        wait_until(lambda: all(r.status == "completed" for r in backend.executions.list(id_prefix="new-"))
                   and len(backend.executions.list(id_prefix="new-")) + purged - 200 == 100, timeout=30)
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(20) == 0
