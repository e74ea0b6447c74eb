"""`yieldstar cancel`, `resume` and `purge`, as real commands on a real ledger file."""

from __future__ import annotations

import json

import pytest
from faults import cli

from supervisor import Failed, open_backend
from supervisor.humane import parse_duration


def test_cancel_resume_and_purge_from_the_command_line(each_backend, tmp_path, db_snapshot):
    db = each_backend
    with open_backend(db) as backend:
        backend.executions.admit("order-1", "order")
        backend.executions.admit("order-2", "order")
        (lease,) = backend.executions.claim_due(limit=1, duration=30_000)
        backend.executions.acknowledge(lease, Failed('{"type": "KeyError"}'))

    done = cli(db, "cancel", "order-2", "--reason", "duplicate order")
    assert (done.returncode, done.stdout) == (0, "order-2 cancelled (it was admitted)\n"), done.stderr
    again = cli(db, "cancel", "order-2")
    assert (again.returncode, again.stdout) == (0, "order-2 was already cancelled; nothing changed\n")
    with open_backend(db) as backend:
        assert json.loads(backend.executions.get("order-2").error_json) == {"type": "Cancelled",
                                                                            "message": "duplicate order"}

    resumed = cli(db, "resume", "order-1")
    assert (resumed.returncode, resumed.stdout) == (0, "order-1 resumed: admitted, due now\n"), resumed.stderr
    before = db_snapshot(db)
    refused = cli(db, "resume", "order-1")
    assert refused.returncode == 2 and refused.stderr.startswith("yieldstar: ") and "is admitted" in refused.stderr
    unknown = cli(db, "cancel", "nobody")
    assert unknown.returncode == 1 and "nobody" in unknown.stderr and "Traceback" not in unknown.stderr
    bad = cli(db, "purge", "--older-than", "a while")
    assert bad.returncode == 2 and "'a while' is not a duration" in bad.stderr
    assert db_snapshot(db) == before

    assert cli(db, "purge", "--older-than", "0s", "--dry-run").stdout == "1 execution would be deleted\n"
    assert cli(db, "purge", "--older-than", "1d").stdout == "0 executions deleted\n"
    assert cli(db, "purge", "--older-than", "0s", "--status", "failed").stdout == "0 executions deleted\n"
    assert cli(db, "purge", "--older-than", "0s").stdout == "1 execution deleted\n"
    with open_backend(db) as backend:
        assert [r.execution_id for r in backend.executions.list()] == ["order-1"]


@pytest.mark.parametrize("text, ms", [("500ms", 500), ("30s", 30_000), ("15m", 900_000), ("2h", 7_200_000),
                                      ("7d", 604_800_000), ("1h30m", 5_400_000), ("1.5s", 1500)])
def test_durations(text, ms):
    assert parse_duration(text) == ms


@pytest.mark.parametrize("text", ["", "7", "d", "7 days", "-1s", "1s2"])
def test_bad_durations_are_refused_by_name(text):
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)
