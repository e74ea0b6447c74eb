"""The workflow timeout with real processes (SPEC section 12), on a SQLite file and on
PostgreSQL: a supervisor runs an execution whose step outlasts its workflow's `timeout=`; the
execution is failed as `WorkflowTimedOut` within a few seconds of its deadline, `result()` raises
that failure, and the stopped delivery records nothing after it. A start's own timeout, from the
client or from `yieldstar start --timeout`, overrides the workflow's. Every wait polls against a
deadline.
"""

from __future__ import annotations

import json

import pytest

from faults import TESTS, cli, wait_until
from supervisor import Suspended
from supervisor.ledger.errors import WorkflowFailed
from worker import Client

pytestmark = [pytest.mark.usefixtures("dump_on_hang"), pytest.mark.timeout(120)]

APP = str(TESTS / "apps" / "workflow_timeout_app.py")


def serving(each_backend, each_ledger, supervisors):
    """A supervisor of the app, once it recorded `wt.slow`'s default timeout."""
    process = supervisors.start(each_backend, app=APP, concurrency=2)
    wait_until(lambda: each_ledger.queues.timeout_of("wt.slow") == 1000, 30,
               message="the app's default timeout recorded")
    return process


def test_an_execution_outliving_its_workflows_timeout_fails_as_timed_out_and_its_delivery_writes_nothing_more(
        each_backend, each_ledger, supervisors):
    process = serving(each_backend, each_ledger, supervisors)
    with Client(each_backend) as client:
        handle = client.start("wt.slow", id="slow-1")
        record = each_ledger.executions.get("slow-1")
        assert record.deadline_at == record.created_at + 1000
        with pytest.raises(WorkflowFailed) as failed:
            handle.result(timeout=15)
    assert failed.value.error["type"] == "WorkflowTimedOut"
    assert "within 1 s of its admission" in failed.value.error["message"]
    record = each_ledger.executions.get("slow-1")
    assert record.status == "failed" and record.updated_at - record.deadline_at < 5000
    history = each_ledger.executions.history("slow-1")
    assert history and history[-1].ended_by == "timed_out"
    # Its worker was stopped, as on a cancel, before its step (SLOW_STEP_S long) could end: the
    # step's record, which it would have written after the deadline, never was.
    assert "killing worker pid" in process.wait_log("execution slow-1 token 1: ")
    assert each_ledger.heap.read_step("slow-1", "hold") is None
    assert each_ledger.executions.get("slow-1").status == "failed"


def test_a_clients_start_timeout_overrides_the_workflows(each_backend, each_ledger, supervisors):
    serving(each_backend, each_ledger, supervisors)
    with Client(each_backend) as client:
        handle = client.start("wt.slow", id="slow-long", timeout=60)
        record = each_ledger.executions.get("slow-long")
        assert record.deadline_at == record.created_at + 60_000
        assert handle.result(timeout=30) == "late"


def test_yieldstar_start_timeout_fails_a_workflow_that_has_none_of_its_own(each_backend, each_ledger, supervisors):
    serving(each_backend, each_ledger, supervisors)
    started = cli(each_backend, "start", "wt.nap", "--id", "nap-1", "--input", "60", "--timeout", "2s")
    assert started.returncode == 0, started.stderr
    got = json.loads(cli(each_backend, "get", "nap-1", "--json").stdout)
    assert got["deadline_at"] == got["created_at"] + 2000
    failed = wait_until(lambda: (r := each_ledger.executions.get("nap-1")).status == "failed" and r, 20,
                        message="nap-1 failed")
    assert json.loads(failed.error_json)["type"] == "WorkflowTimedOut"
    assert failed.updated_at - failed.deadline_at < 5000
    assert each_ledger.heap.read_step("nap-1", "nap") is None
    shown = cli(each_backend, "get", "nap-1")
    assert "WorkflowTimedOut" in shown.stdout and "deadline_at" in shown.stdout


def test_until_idle_fails_at_once_what_passed_its_deadline_while_no_supervisor_ran_and_waits_for_no_deadline(
        each_backend, each_ledger, supervisors):
    executions = each_ledger.executions
    executions.admit("waiting", "wt.nap", "0", timeout_ms=3_600_000)
    (lease,) = executions.claim_due(limit=1, duration=60_000)
    executions.acknowledge(lease, Suspended())  # waits for a wake that never comes
    executions.admit("missed", "wt.nap", "60", timeout_ms=1)  # its deadline passes before any supervisor runs
    # Due: run (and waited for) once the supervisor is up, well within its 5 s, then timed out
    # while its step naps for 30 s.
    executions.admit("running", "wt.nap", "30", timeout_ms=5000)
    process = supervisors.start(each_backend, app=APP, concurrency=2, until_idle=True, ready=False)
    assert process.wait(45) == 0
    assert "idle: nothing running and nothing due" in process.log()
    for execution_id in ("missed", "running"):
        assert json.loads(executions.get(execution_id).error_json)["type"] == "WorkflowTimedOut"
    assert executions.history("missed") == []  # failed before any claim could deliver it
    assert executions.history("running")[-1].ended_by == "timed_out"
    assert executions.get("waiting").status == "suspended"  # its deadline, an hour away, was not waited for


def test_a_client_start_made_before_any_supervisor_ran_takes_its_workflows_timeout_when_one_starts(
        each_backend, each_ledger, supervisors):
    """A web app that starts work before the first supervisor ever ran: the execution waits in
    the ledger without a deadline, takes the workflow's `timeout=` when the supervisor records
    it, counted from the admission, and is failed as `WorkflowTimedOut`."""
    with Client(each_backend) as client:
        handle = client.start("wt.slow", id="early-1")
        assert each_ledger.executions.get("early-1").deadline_at is None
        serving(each_backend, each_ledger, supervisors)
        record = each_ledger.executions.get("early-1")
        assert record.deadline_at == record.created_at + 1000
        with pytest.raises(WorkflowFailed) as failed:
            handle.result(timeout=15)
    assert failed.value.error["type"] == "WorkflowTimedOut"
