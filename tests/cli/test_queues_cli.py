"""`yieldstar queues [--json]`, and queue, key and priority in `start`, `get` and `ls` (SPEC
section 12), as real commands on a real ledger (a SQLite file, and PostgreSQL)."""

from __future__ import annotations

import json

import pytest

from faults import cli
from supervisor import open_backend

pytestmark = pytest.mark.timeout(60)


def test_queues_lists_limits_and_counts_and_start_names_queue_key_and_priority(each_backend):
    with open_backend(each_backend) as backend:
        backend.queues.declare("email", concurrency=5, per_key=1, rate=(10, 1.5))
    for args in (("--id", "a", "--queue", "email", "--key", "user-1", "--priority", "2"), ("--id", "b")):
        started = cli(each_backend, "start", "send", *args)
        assert started.returncode == 0, started.stderr
    with open_backend(each_backend) as backend:
        backend.executions.claim_due(limit=1, duration=60_000)  # a (priority 2) before b
        assert backend.executions.get("a").status == "running"

    listed = cli(each_backend, "queues", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == [
        {"name": "default", "concurrency": None, "per_key": None, "rate": None, "due": 1, "running": 0, "waiting": 0},
        {"name": "email", "concurrency": 5, "per_key": 1, "rate": [10, 1.5], "due": 0, "running": 1, "waiting": 0}]
    text = cli(each_backend, "queues").stdout.splitlines()
    assert text[0].split() == ["QUEUE", "CONCURRENCY", "PER", "KEY", "RATE", "DUE", "RUNNING", "WAITING"]
    assert text[2].split() == ["email", "5", "1", "10", "per", "1.5", "s", "0", "1", "0"]

    shown = json.loads(cli(each_backend, "get", "a", "--json").stdout)
    assert (shown["queue"], shown["key"], shown["priority"]) == ("email", "user-1", 2)
    assert "queue                       email" in cli(each_backend, "get", "a").stdout
    assert "key                         (none)" in cli(each_backend, "get", "b").stdout
    rows = [line.split() for line in cli(each_backend, "ls").stdout.splitlines()]
    assert rows[0][-3:] == ["QUEUE", "KEY", "PRIORITY"]
    assert sorted(row[-3:] for row in rows[1:]) == [["default", "-", "0"], ["email", "user-1", "2"]]
    assert {(r["execution_id"], r["queue"]) for r in json.loads(cli(each_backend, "ls", "--json").stdout)} == {
        ("a", "email"), ("b", "default")}


def test_start_with_a_bad_priority_or_queue_is_refused_and_admits_nothing(each_backend):
    for args, match in ((("--priority", "x"), "priority"), (("--queue", ""), "queue"),
                        (("--priority", str(2 ** 40)), "priority")):
        refused = cli(each_backend, "start", "send", "--id", "z", *args)
        assert refused.returncode == 2, refused
        assert match in refused.stderr
    with open_backend(each_backend) as backend:
        assert backend.executions.get("z") is None


def test_stats_metrics_and_top_show_each_queue_with_its_limits_and_counts(each_backend):
    with open_backend(each_backend) as backend:
        backend.queues.declare("email", concurrency=1, rate=(10, 1.5))
        for execution_id in ("e-1", "e-2"):
            backend.executions.admit(execution_id, "send", queue="email")
        backend.executions.admit("d-1", "send")
        backend.executions.claim_due(limit=3, duration=60_000)  # e-1 and d-1; e-2 is held back

    summary = json.loads(cli(each_backend, "stats", "--json").stdout)
    assert summary["queues"] == [
        {"name": "default", "concurrency": None, "per_key": None, "rate": None, "due": 0, "running": 1, "waiting": 0},
        {"name": "email", "concurrency": 1, "per_key": None, "rate": [10, 1.5], "due": 1, "running": 1, "waiting": 0}]
    text = cli(each_backend, "stats").stdout
    assert "  email" in text and "due 1, running 1, waiting 0 (limits: concurrency 1, rate 10 per 1.5 s)" in text

    samples = cli(each_backend, "metrics").stdout.splitlines()
    assert 'yieldstar_queue_executions{queue="email",state="due"} 1' in samples
    assert 'yieldstar_queue_executions{queue="default",state="running"} 1' in samples
    assert {line for line in samples if line.startswith("yieldstar_queue_limit")} == {
        'yieldstar_queue_limit{queue="email",limit="concurrency"} 1',
        'yieldstar_queue_limit{queue="email",limit="rate_count"} 10',
        'yieldstar_queue_limit{queue="email",limit="rate_seconds"} 1.5'}

    screen = [line.split() for line in cli(each_backend, "top").stdout.splitlines()]
    assert ["QUEUE", "CONCURRENCY", "PER", "KEY", "RATE", "DUE", "RUNNING", "WAITING"] in screen
    assert ["email", "1", "-", "10", "per", "1.5", "s", "1", "1", "0"] in screen
