"""A parked execution (SPEC section 11) as the command line shows it and resumes it: `get` (text and
`--json`), `stats`, `metrics` and `resume`, as real commands on a real ledger of each backend."""

from __future__ import annotations

import json

import pytest
from faults import cli

from supervisor import Suspended, open_backend

pytestmark = pytest.mark.timeout(120)

DETAIL = 'replay diverged: recorded step "charge" next, the code reached "reserve"'


def parked_ledger(db) -> None:
    """`order-1` parked; `order-2` suspended the ordinary way, not due."""
    with open_backend(db) as backend:
        for eid in ("order-1", "order-2"):
            backend.executions.admit(eid, "order")
        first, second = backend.executions.claim_due(limit=2, duration=30_000)
        backend.executions.acknowledge(first, Suspended(diverged=DETAIL))
        backend.executions.acknowledge(second, Suspended())


def test_get_shows_what_a_parked_execution_waits_for(each_backend):
    db = each_backend
    parked_ledger(db)
    shown = cli(db, "get", "order-1", "--json")
    assert shown.returncode == 0, shown.stderr
    record = json.loads(shown.stdout)
    assert (record["status"], record["due_at"]) == ("suspended", None)
    assert record["waiting_for"] == [{"kind": "code", "target": "order", "at": None, "detail": DETAIL}]

    text = cli(db, "get", "order-1")
    assert text.returncode == 0, text.stderr
    (line,) = [line for line in text.stdout.splitlines() if line.startswith("waiting for")]
    assert 'new code for workflow "order": parked, its replay diverged' in line and DETAIL in line

    ordinary = json.loads(cli(db, "get", "order-2", "--json").stdout)
    assert ordinary["waiting_for"] == [{"kind": "wake", "target": None, "at": None, "detail": None}]


def test_stats_and_metrics_count_parked_executions_by_workflow(each_backend):
    db = each_backend
    parked_ledger(db)
    summary = json.loads(cli(db, "stats", "--json").stdout)
    assert summary["parked"] == {"order": 1}
    assert summary["by_status"]["suspended"] == 2
    text = cli(db, "stats").stdout
    assert any(line.startswith("parked") and "1 waiting for new code (order 1)" in line for line in text.splitlines())
    assert 'yieldstar_parked_executions{workflow="order"} 1' in cli(db, "metrics").stdout.splitlines()


def test_resume_of_a_parked_execution_makes_it_due_and_refuses_one_that_is_only_suspended(each_backend, db_snapshot):
    db = each_backend
    parked_ledger(db)
    resumed = cli(db, "resume", "order-1")
    assert (resumed.returncode, resumed.stdout) == (0, "order-1 resumed: suspended, due now\n"), resumed.stderr
    record = json.loads(cli(db, "get", "order-1", "--json").stdout)
    assert record["status"] == "suspended" and record["due_at"] is not None
    assert [reason["kind"] for reason in record["waiting_for"]] == ["due"]
    assert json.loads(cli(db, "stats", "--json").stdout)["parked"] == {}
    with open_backend(db) as backend:
        (lease,) = backend.executions.claim_due(limit=5, duration=30_000)
        assert (lease.execution_id, lease.token) == ("order-1", 2)

    before = db_snapshot(db)
    refused = cli(db, "resume", "order-2")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "is suspended: only a failed, cancelled or parked execution can be resumed" in refused.stderr
    assert db_snapshot(db) == before
