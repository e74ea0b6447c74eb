"""The payload limit in supervised runs: a supervisor's `max_payload_bytes` is its workers' too;
a step whose result is too large fails (not retried) and is raised into the workflow as
`StepFailed`, and a workflow whose result is too large fails with `PayloadTooLarge`.

The workflows are those of `tests/apps/payloads_app.py`; the limit (1,000 bytes) is far below
the default, so a worker that did not inherit it would record every one of these results.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faults import HEARTBEAT_MS, POLL_MS, RENEW_MS, admit, cli, run_until_idle
from supervisor import InvalidArgument
from supervisor.dispatcher import SupervisorConfig

pytestmark = pytest.mark.usefixtures("dump_on_hang")

APP = str(Path(__file__).parent.parent / "apps" / "payloads_app.py")
LIMIT = 1000
SIZE = 1500  # a result of 1,502 bytes of JSON
# The step's record, `{"value": ...}`, is 11 bytes longer than its value.
STEP_TOO_LARGE = "step 'charge' result is 1,513 bytes of JSON, above the payload limit of 1,000 bytes (max_payload_bytes)"


def calls(path: Path) -> int:
    return len(path.read_text()) if path.exists() else 0


@pytest.mark.timeout(90)
@pytest.mark.parametrize("workers", [None, 1], ids=["a process per delivery", "one worker of several deliveries"])
def test_a_step_or_result_above_the_supervisors_limit_fails_and_is_not_recorded(
        each_backend, each_ledger, tmp_path, workers):
    for name in ("caught", "uncaught", "async"):
        admit(each_backend, name, f"pl.{'async_step' if name == 'async' else 'step_' + name}",
              {"calls": str(tmp_path / name), "size": SIZE})
    admit(each_backend, "result", "pl.result", {"size": SIZE})
    admit(each_backend, "small", "pl.result", {"size": LIMIT - 2})  # exactly at the limit
    admit(each_backend, "flaky", "pl.step_error", {"calls": str(tmp_path / "flaky")})
    admit(each_backend, "store", "pl.store", {"size": SIZE})

    run_until_idle(each_backend, APP, SupervisorConfig(
        concurrency=3, workers=workers, lease_ms=1500, renew_ms=RENEW_MS, heartbeat_ms=HEARTBEAT_MS,
        poll_ms=POLL_MS, max_payload_bytes=LIMIT))

    # Caught: the workflow sees StepFailed of type PayloadTooLarge after one attempt (its retry
    # policy would allow three: the same step would return as much again), and goes on.
    caught = each_ledger.executions.get("caught")
    assert caught.status == "completed", caught
    assert json.loads(caught.result_json) == {"step": "charge", "type": "PayloadTooLarge", "message": STEP_TOO_LARGE,
                                              "attempts": 1, "after": "went on"}
    assert calls(tmp_path / "caught") == 1
    [charge, after] = each_ledger.heap.steps("caught")
    assert (charge.step_key, charge.attempt, charge.done) == ("charge", 1, True)
    assert json.loads(charge.step_response_json) == {
        "error": {"type": "PayloadTooLarge", "message": STEP_TOO_LARGE, "traceback": None}, "retry_at": None}
    assert after.step_key == "after"

    # Not caught: the workflow fails with the StepFailed that names it.
    uncaught = each_ledger.executions.get("uncaught")
    assert uncaught.status == "failed", uncaught
    error = json.loads(uncaught.error_json)
    assert error["type"] == "StepFailed"
    assert error["message"] == f"step 'charge' failed after 1 attempt(s): PayloadTooLarge: {STEP_TOO_LARGE}"
    # The error with its traceback is above the limit too: its traceback is cut to what fits.
    assert error["traceback"].startswith("... (the start of this traceback is cut")
    assert error["traceback"].endswith("\n")
    assert len(uncaught.error_json) <= LIMIT
    assert len(each_ledger.heap.steps("uncaught")[0].step_response_json) < LIMIT

    is_async = each_ledger.executions.get("async")
    assert json.loads(is_async.result_json) == {"step": "charge", "type": "PayloadTooLarge",
                                                "message": STEP_TOO_LARGE}

    # A result too large: failed with PayloadTooLarge, the result not recorded.
    result = each_ledger.executions.get("result")
    assert (result.status, result.result_json) == ("failed", None)
    assert json.loads(result.error_json) == {
        "type": "PayloadTooLarge", "traceback": None,
        "message": "result is 1,502 bytes of JSON, above the payload limit of 1,000 bytes (max_payload_bytes)"}

    small = each_ledger.executions.get("small")
    assert small.status == "completed" and len(small.result_json) == LIMIT

    # A store's new value too large: refused, the store unchanged, and the workflow told why.
    assert json.loads(each_ledger.executions.get("store").result_json) == {
        "type": "PayloadTooLarge",
        "message": "store 'box' value is 1,504 bytes of JSON, above the payload limit of 1,000 bytes (max_payload_bytes)"}
    assert (each_ledger.stores.get("box").state_json, each_ledger.stores.get("box").version) == ("[]", 1)

    # A failed attempt whose error is too large keeps its type and message, and its retry: its
    # traceback is cut to the innermost frames that fit.
    flaky = each_ledger.executions.get("flaky")
    assert (flaky.status, flaky.result_json, calls(tmp_path / "flaky")) == ("completed", '"ok"', 2)
    first = json.loads(each_ledger.heap.steps("flaky")[0].step_response_json)
    assert first["retry_at"] is not None
    assert (first["error"]["type"], first["error"]["message"]) == ("ValueError", "boom")
    assert first["error"]["traceback"].startswith("... (the start of this traceback is cut")
    assert first["error"]["traceback"].endswith("ValueError: boom\n")


@pytest.mark.timeout(90)
def test_supervise_max_payload_sets_the_limit_of_its_workers(sqlite_path, tmp_path):
    admit(sqlite_path, "caught", "pl.step_caught", {"calls": str(tmp_path / "calls"), "size": SIZE})
    admit(sqlite_path, "small", "pl.step_caught", {"calls": str(tmp_path / "calls"), "size": SIZE - 600})

    done = cli(sqlite_path, "supervise", APP, "--until-idle", "--max-payload", "1KB", "--lease-ms", "1500",
               "--poll-ms", str(POLL_MS), timeout=60)

    assert done.returncode == 0, done.stderr
    out = json.loads(cli(sqlite_path, "get", "caught", "--json").stdout)
    assert out["result"]["type"] == "PayloadTooLarge"
    assert out["result"]["message"] == STEP_TOO_LARGE
    assert json.loads(cli(sqlite_path, "get", "small", "--json").stdout)["result"] == "recorded"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("size, message", [
    ("0", "'0' is less than one byte"),
    ("4 parsecs", "'4 parsecs' is not a size: write a number of bytes, or a number and a unit, like 8MB or 512KiB"),
    ("-1MB", "'-1MB' is not a size"),
])
def test_supervise_refuses_a_bad_max_payload_naming_it(sqlite_path, size, message):
    done = cli(sqlite_path, "supervise", APP, "--until-idle", "--max-payload", size, timeout=20)

    assert done.returncode == 2
    assert done.stderr.startswith(f"yieldstar: --max-payload: {message}")
    assert "Traceback" not in done.stderr
    assert not sqlite_path.exists()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("bad", [0, -1, "8MB", 1.5, True])
def test_supervisor_config_refuses_a_bad_max_payload_bytes_naming_it(bad):
    with pytest.raises(InvalidArgument, match="^max_payload_bytes must be"):
        SupervisorConfig(max_payload_bytes=bad)
