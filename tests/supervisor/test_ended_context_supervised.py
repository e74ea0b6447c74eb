"""A workflow's `ctx` used after its delivery ended, under a real supervisor (issue 34): kept in a
module global and used by a later delivery in the same worker process, used from a thread that a
step started, or from a task left on the worker's event loop (`supervise --workers`, SPEC section
10). Each use raises `DeliveryEnded` naming the execution and its token, and the ledger records no
step of it. The workflows are those of `tests/apps/ended_ctx_app.py`; every operation of a kept
context, sync and async, is tried in-process in tests/worker/test_ended_context.py.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from faults import TESTS, admit, wait_until

pytestmark = pytest.mark.usefixtures("dump_on_hang")

APP = str(TESTS / "apps" / "ended_ctx_app.py")

# One delivery per worker process; several (two slots of one process: concurrency > workers).
WORKERS = [pytest.param({"concurrency": 1}, id="one-delivery-per-worker"),
           pytest.param({"concurrency": 2, "workers": 1}, id="several-deliveries-per-worker")]


def completed(ledger, execution_id: str) -> dict:
    wait_until(lambda: ledger.executions.get(execution_id).status == "completed", timeout=30,
               message=f"{execution_id} completed")
    return json.loads(ledger.executions.get(execution_id).result_json)


def step_keys(ledger, execution_id: str) -> list[str]:
    return [step.step_key for step in ledger.heap.steps(execution_id)]


def says_delivery_ended(outcome: dict, execution_id: str) -> None:
    assert outcome["raised"] == "DeliveryEnded", outcome
    assert outcome["message"] == (
        f"the delivery of execution {execution_id!r} under token 1 has ended, so its ctx can no longer be used"
        " (nothing was written): don't keep a ctx beyond its workflow function, or use it from threads or tasks"
        " that outlive the step"), outcome


def stopped_cleanly(supervisor) -> None:
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(20) == 0


@pytest.mark.timeout(90)
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("workers", WORKERS)
def test_a_ctx_kept_in_a_global_and_used_by_a_later_delivery_raises_delivery_ended_and_records_nothing(
        sqlite_path, sqlite_ledger, supervisors, workers, asynchronous):
    suffix = "_async" if asynchronous else ""
    admit(sqlite_path, "keeper", f"ec.keep{suffix}")
    supervisor = supervisors.start(sqlite_path, app=APP, **workers)
    kept_in = completed(sqlite_ledger, "keeper")["pid"]
    admit(sqlite_path, "later", f"ec.reuse{suffix}")
    outcome = completed(sqlite_ledger, "later")

    assert outcome["pid"] == kept_in  # the same worker process, which kept the context
    says_delivery_ended(outcome, "keeper")
    assert step_keys(sqlite_ledger, "keeper") == ["first"]
    assert step_keys(sqlite_ledger, "later") == []
    stopped_cleanly(supervisor)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("workers", WORKERS)
def test_a_thread_started_in_a_step_that_uses_the_ctx_after_the_delivery_was_acknowledged_gets_delivery_ended(
        sqlite_path, sqlite_ledger, supervisors, tmp_path, workers):
    gate, out = tmp_path / "gate", tmp_path / "out.json"
    admit(sqlite_path, "spawner", "ec.thread", {"gate": str(gate), "out": str(out)})
    supervisor = supervisors.start(sqlite_path, app=APP, **workers)
    ran_in = completed(sqlite_ledger, "spawner")["pid"]
    gate.touch()  # acknowledged: the thread may go on
    wait_until(lambda: out.exists(), timeout=30, message="the thread said what the ctx raised")
    outcome = json.loads(out.read_text())

    assert outcome["pid"] == ran_in
    says_delivery_ended(outcome, "spawner")
    assert step_keys(sqlite_ledger, "spawner") == ["spawn"]
    assert sqlite_ledger.executions.get("spawner").status == "completed"
    stopped_cleanly(supervisor)


@pytest.mark.timeout(90)
def test_a_task_an_async_workflow_left_on_the_workers_event_loop_gets_delivery_ended_from_its_ctx(
        sqlite_path, sqlite_ledger, supervisors, tmp_path):
    gate, out = tmp_path / "gate", tmp_path / "out.json"
    admit(sqlite_path, "tasker", "ec.task", {"gate": str(gate), "out": str(out)})
    supervisor = supervisors.start(sqlite_path, app=APP, concurrency=2, workers=1)
    ran_in = completed(sqlite_ledger, "tasker")["pid"]
    gate.touch()
    wait_until(lambda: out.exists(), timeout=30, message="the task said what the ctx raised")
    outcome = json.loads(out.read_text())

    assert outcome["pid"] == ran_in
    says_delivery_ended(outcome, "tasker")
    assert step_keys(sqlite_ledger, "tasker") == ["first"]
    # The worker goes on serving: a later delivery in it completes.
    admit(sqlite_path, "after", "ec.keep")
    assert completed(sqlite_ledger, "after")["pid"] == ran_in
    stopped_cleanly(supervisor)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("workers", WORKERS)
def test_a_later_workflow_that_lets_delivery_ended_go_fails_with_it_and_keeps_its_own_steps(
        sqlite_path, sqlite_ledger, supervisors, workers):
    admit(sqlite_path, "keeper", "ec.keep")
    supervisor = supervisors.start(sqlite_path, app=APP, **workers)
    completed(sqlite_ledger, "keeper")
    admit(sqlite_path, "later", "ec.reuse_uncaught")
    wait_until(lambda: sqlite_ledger.executions.get("later").status == "failed", timeout=30,
               message="the later execution failed")

    error = json.loads(sqlite_ledger.executions.get("later").error_json)
    assert error["type"] == "DeliveryEnded", error
    assert "execution 'keeper' under token 1 has ended" in error["message"], error
    assert step_keys(sqlite_ledger, "keeper") == ["first"]
    assert step_keys(sqlite_ledger, "later") == ["own"]
    stopped_cleanly(supervisor)
