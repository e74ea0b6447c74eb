"""Step timeouts under a real supervisor (SPEC section 12), with real worker processes.

An async step past its timeout is cancelled and retried in its worker; a sync step that does not
return cannot be stopped, so its attempt is recorded as a `StepTimeout`, and its worker is
replaced, its other deliveries released at once and delivered again. The workflows are those of
`tests/apps/timeouts_app.py`; each step run leaves a line in the side-effect log.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from faults import TESTS, admit, read_log, step_tokens, wait_gone, wait_until

pytestmark = pytest.mark.usefixtures("dump_on_hang")

APP = str(TESTS / "apps" / "timeouts_app.py")


def begun(log: str, step_key: str) -> list:
    return [e for e in read_log(log) if e.step_key == step_key and e.event == "begin"]


def stopped_cleanly(supervisor) -> None:
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(20) == 0


def attempts(ledger, execution_id: str) -> list[tuple[str, int, bool, dict]]:
    return [(a.step_key, a.attempt, a.done, json.loads(a.step_response_json))
            for a in ledger.heap.steps(execution_id)]


@pytest.mark.timeout(90)
def test_an_async_step_past_its_timeout_is_cancelled_twice_and_its_workflow_gets_step_failed_of_step_timeout(
        each_backend, each_ledger, tmp_path, supervisors):
    db, log = each_backend, str(tmp_path / "effects.log")
    admit(db, "nap", "to.async_nap", {"log": log, "seconds": 600, "timeout": 0.3})
    started = time.monotonic()
    supervisor = supervisors.start(db, app=APP, concurrency=1)
    wait_until(lambda: each_ledger.executions.get("nap").status == "completed", timeout=60,
               message="the workflow completed")
    assert time.monotonic() - started < 60  # the step sleeps 600 s
    assert json.loads(each_ledger.executions.get("nap").result_json) == {
        "error_type": "StepTimeout", "attempts": 2,
        "message": "step 'nap' attempt 2 did not end within its timeout of 0.3 s"}
    recorded = attempts(each_ledger, "nap")
    assert [(key, attempt, done) for key, attempt, done, _ in recorded] == [("nap", 1, False), ("nap", 2, True)]
    assert [response["error"]["type"] for *_, response in recorded] == ["StepTimeout", "StepTimeout"]
    assert len(begun(log, "nap")) == 2
    assert "asked to be replaced" not in supervisor.log()  # a cancelled task leaves nothing behind
    stopped_cleanly(supervisor)


@pytest.mark.timeout(120)
def test_a_sync_step_that_hangs_past_its_timeout_is_recorded_retried_and_its_worker_replaced_with_its_sibling(
        each_backend, each_ledger, tmp_path, supervisors):
    db, log, gate = each_backend, str(tmp_path / "effects.log"), tmp_path / "gate"
    admit(db, "sibling", "sv.async_gate", {"log": log, "gate": str(gate)})
    admit(db, "hang", "to.sync_hang", {"log": log, "marker": str(tmp_path / "hung-once"), "timeout": 3.0})
    supervisor = supervisors.start(db, app=APP, concurrency=2, workers=1)
    (worker,) = supervisor.workers()
    wait_until(lambda: {e.execution_id for e in read_log(log) if e.event == "waiting"} == {"sibling"}
               and begun(log, "hang"), timeout=30, message="the hanging step and its sibling running at once")
    assert {e.pid for e in read_log(log)} == {worker}

    # Past the deadline the worker reports the hung step and asks to be replaced: it is killed,
    # and its sibling, still waiting at the gate, is released at once.
    supervisor.wait_log("asked to be replaced: step 'hang' attempt 1 did not end within its timeout of 3 s",
                        timeout=30)
    wait_gone([worker])
    supervisor.wait_log("execution sibling token 1: worker pid", timeout=10)
    gate.touch()
    wait_until(lambda: {each_ledger.executions.get(e).status for e in ("hang", "sibling")} == {"completed"},
               timeout=60, message="both completed")

    result = json.loads(each_ledger.executions.get("hang").result_json)
    assert result["pid"] != worker and result["token"] >= 2
    recorded = attempts(each_ledger, "hang")
    assert [(key, attempt, done) for key, attempt, done, _ in recorded] == [("hang", 1, False), ("hang", 2, True)]
    error = recorded[0][3]["error"]
    assert error["type"] == "StepTimeout"
    assert error["message"] == "step 'hang' attempt 1 did not end within its timeout of 3 s"
    assert "hangs_at_first" in error["traceback"]  # where the abandoned thread was
    assert recorded[1][3] == {"value": result["pid"]}
    # The first attempt was recorded by the worker that ran it, under its own token.
    assert [(key, attempt, token) for key, attempt, token in step_tokens(db, "hang")][0] == ("hang", 1, 1)
    sibling = json.loads(each_ledger.executions.get("sibling").result_json)
    assert sibling["token"] == 2 and sibling["pid"] != worker
    assert [e.event for e in read_log(log) if e.execution_id == "hang" and e.step_key == "hang"] == [
        "begin", "begin", "end"]
    stopped_cleanly(supervisor)


@pytest.mark.timeout(90)
def test_a_worker_of_one_delivery_whose_sync_step_hangs_past_its_timeout_is_replaced_and_the_retry_completes(
        sqlite_path, sqlite_ledger, tmp_path, supervisors):
    log = str(tmp_path / "effects.log")
    admit(sqlite_path, "hang", "to.sync_hang", {"log": log, "marker": str(tmp_path / "hung-once"), "timeout": 0.5})
    supervisor = supervisors.start(sqlite_path, app=APP, concurrency=1)
    (worker,) = supervisor.workers()
    wait_until(lambda: sqlite_ledger.executions.get("hang").status == "completed", timeout=60,
               message="the retry completed")
    wait_gone([worker])
    assert json.loads(sqlite_ledger.executions.get("hang").result_json)["pid"] != worker
    assert [(key, attempt, done, response.get("error", {}).get("type"))
            for key, attempt, done, response in attempts(sqlite_ledger, "hang")] == [
        ("hang", 1, False, "StepTimeout"), ("hang", 2, True, None)]
    supervisor.wait_log(f"worker pid {worker} asked to be replaced: step 'hang' attempt 1 did not end within its"
                        " timeout of 0.5 s", timeout=5)
    stopped_cleanly(supervisor)
