"""The worker SDK and its replay driver (SPEC section 4, first bullet; issue 3).

Every test runs workflows from `tests/workflows_sample.py` against a real SQLite ledger under
`tmp_path`, with an injected `FakeClock`. Most tests deliver by hand (claim, `run_delivery`,
acknowledge) so they can look at the ledger between deliveries.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from supervisor import Completed, Failed, LeaseLost, Released, Retry, Suspended, open_backend  # noqa: E402
from tests import workflows_sample as sample  # noqa: E402
from worker._runtime.driver import run_delivery  # noqa: E402
from worker.testing import FakeClock, WorkflowStuck, run_workflow  # noqa: E402

pytestmark = pytest.mark.timeout(30)

LEASE_MS = 30_000
EID = "e1"


@pytest.fixture(autouse=True)
def fresh_sample_state():
    sample.reset()
    yield
    sample.reset()


def admit(backend, workflow, input=None, execution_id=EID):
    return backend.executions.admit(execution_id, workflow, json.dumps(input))


def claim(backend, execution_id=EID):
    leases = backend.executions.claim_due(limit=1, duration=LEASE_MS)
    assert [lease.execution_id for lease in leases] == [execution_id]
    return leases[0]


def deliver(backend, execution_id=EID, **kwargs):
    """Claim, run one delivery, and acknowledge its outcome as a supervisor would."""
    lease = claim(backend, execution_id)
    outcome = run_delivery(backend, lease, sample.registry, **kwargs)
    if isinstance(outcome, (Suspended, Completed, Failed)):
        assert backend.executions.acknowledge(lease, outcome) == outcome
    return outcome


def rows(db_path, execution_id=EID):
    """The steps table as an independent reader sees it: (key, attempt, done, response, token)."""
    with sqlite3.connect(db_path) as conn:
        return [
            (key, attempt, bool(done), json.loads(response), token)
            for key, attempt, done, response, token in conn.execute(
                "SELECT step_key, attempt, done, step_response_json, token FROM steps"
                " WHERE execution_id = ? ORDER BY rowid", (execution_id,))
        ]


def error_of(outcome_or_record):
    text = getattr(outcome_or_record, "error_json")
    error = json.loads(text)
    assert set(error) >= {"type", "message", "traceback"}
    return error


# -- replay -----------------------------------------------------------------------------------

def test_replay_skips_recorded_steps_and_runs_the_rest(sqlite_backend, clock):
    admit(sqlite_backend, "timer_between_steps", {"x": 41})

    assert deliver(sqlite_backend) == Suspended()
    assert sample.calls == {"workflow:timer_between_steps": 1, "first": 1}

    clock.advance(10_000)
    outcome = deliver(sqlite_backend)

    assert outcome == Completed(json.dumps({"first": 41, "second": 42}))
    # The workflow function ran twice, the step before the timer only once in all.
    assert sample.calls == {"workflow:timer_between_steps": 2, "first": 1, "second": 1}
    record = sqlite_backend.executions.get(EID)
    assert record.status == "completed"
    assert json.loads(record.result_json) == {"first": 41, "second": 42}


def test_a_first_delivery_started_from_its_claim_reads_nothing_and_a_later_one_replays(
        sqlite_backend, clock, monkeypatch):
    """The supervisor hands a first delivery over with the workflow and input its claim read
    (`Claimed`): the worker starts it without reading the ledger. The next delivery gets no input,
    reads the steps the first recorded, and replays them."""
    admit(sqlite_backend, "timer_between_steps", {"x": 41})
    (claimed,) = sqlite_backend.executions.claim_deliveries(limit=1, duration=LEASE_MS)
    assert claimed.input_json is not None

    def no_read(execution_id):
        raise AssertionError(f"a first delivery read execution {execution_id} from the ledger")

    with monkeypatch.context() as patched:
        patched.setattr(sqlite_backend.executions, "get_with_steps", no_read)
        outcome = run_delivery(sqlite_backend, claimed.lease, sample.registry,
                               start=(claimed.workflow, claimed.input_json))
    assert outcome == Suspended()
    assert sqlite_backend.executions.acknowledge(claimed.lease, outcome) == outcome
    assert sample.calls == {"workflow:timer_between_steps": 1, "first": 1}

    clock.advance(60_000)  # past the timer
    (again,) = sqlite_backend.executions.claim_deliveries(limit=1, duration=LEASE_MS)
    assert (again.lease.token, again.input_json) == (2, None)
    outcome = run_delivery(sqlite_backend, again.lease, sample.registry)
    assert outcome == Completed(json.dumps({"first": 41, "second": 42}))
    assert sample.calls["first"] == 1  # replayed from the record, not run again


def test_a_step_whose_delivery_crashed_before_recording_runs_again(sqlite_backend, clock):
    class Crash(BaseException):
        """Stands in for the child process dying inside a step."""

    def crash_once(value):
        if sample.calls["b"] == 1:
            raise Crash()

    sample.hooks["b"] = crash_once
    admit(sqlite_backend, "abc")
    lease = claim(sqlite_backend)
    with pytest.raises(Crash):
        run_delivery(sqlite_backend, lease, sample.registry)
    assert [r.step_key for r in sqlite_backend.heap.steps(EID)] == ["a"]

    clock.advance(LEASE_MS + 1)  # the crashed delivery's lease runs out
    assert deliver(sqlite_backend) == Completed(json.dumps(["a", "ab", "abc"]))
    # "a" was recorded and is replayed; "b" was not, so it runs again; "c" runs once.
    assert sample.calls == {"workflow:abc": 2, "a": 1, "b": 2, "c": 1}
    assert [(r.step_key, r.step_response_json) for r in sqlite_backend.heap.steps(EID)] == [
        ("a", '{"value": "a"}'), ("b", '{"value": "ab"}'), ("c", '{"value": "abc"}')]


def test_data_flows_between_steps_as_recorded_json(sqlite_backend, clock):
    admit(sqlite_backend, "data_flow")
    as_json = [1, "two", {"three": [3, [4]]}]

    assert deliver(sqlite_backend) == Suspended()
    # Fresh: the workflow already sees the recorded value, so the tuple is a list.
    assert sample.seen == [as_json, as_json]
    assert type(sample.seen[0]) is list and type(sample.seen[0][2]["three"][1]) is list

    clock.advance(1_000)
    outcome = deliver(sqlite_backend)

    assert sample.seen[2:] == [as_json, as_json]  # replayed: the same values
    assert sample.calls == {"make_tuple": 1, "echo": 1}
    assert json.loads(outcome.result_json) == {"made": as_json, "echoed": as_json}


# -- retries ----------------------------------------------------------------------------------

def test_retryable_error_is_retried_at_its_interval_then_succeeds(sqlite_backend, clock):
    admit(sqlite_backend, "retrying", {"failures": 2, "max_attempts": 5, "interval": 2})
    start = clock.now

    assert deliver(sqlite_backend) == Suspended()
    assert sqlite_backend.executions.get(EID).due_at == start + 2_000
    clock.now = start + 1_999
    assert sqlite_backend.executions.claim_due(limit=1, duration=LEASE_MS) == []

    clock.now = start + 2_000
    assert deliver(sqlite_backend) == Suspended()
    assert sqlite_backend.executions.get(EID).due_at == start + 4_000  # backoff 1.0: the same interval

    clock.now = start + 4_000
    outcome = deliver(sqlite_backend)

    assert json.loads(outcome.result_json) == {"before": "ready", "value": "flaky ok after 3"}
    assert sample.calls == {"before": 1, "flaky": 3}
    assert [(r.step_key, r.attempt, r.done) for r in sqlite_backend.heap.steps(EID)] == [
        ("before", 1, True), ("flaky", 1, False), ("flaky", 2, False), ("flaky", 3, True)]


def test_a_spurious_wake_before_the_retry_time_does_not_run_the_step_early(sqlite_backend, clock):
    admit(sqlite_backend, "retrying", {"failures": 1, "max_attempts": 3, "interval": 5})
    start = clock.now
    assert deliver(sqlite_backend) == Suspended()

    sqlite_backend.executions.request_wake(EID, start + 1_000)
    clock.now = start + 1_000
    assert deliver(sqlite_backend) == Suspended()

    assert sample.calls["flaky"] == 1
    assert sqlite_backend.executions.get(EID).due_at == start + 5_000


def test_retry_policy_backs_off_then_raises_step_failed_into_the_workflow(sqlite_backend, clock):
    policy = {"max_attempts": 4, "interval": 1, "backoff": 3, "max_interval": 5}
    admit(sqlite_backend, "retry_policy", {"policy": policy, "catch": True})

    wakes = []
    for _ in range(3):
        before = clock.now
        assert deliver(sqlite_backend) == Suspended()
        due = sqlite_backend.executions.get(EID).due_at
        wakes.append(due - before)
        clock.now = due

    outcome = deliver(sqlite_backend)

    assert wakes == [1_000, 3_000, 5_000]  # 1 s, 1 s * 3, min(1 s * 9, 5 s)
    assert sample.calls["charge"] == 4
    assert json.loads(outcome.result_json) == {
        "error_type": "ValueError", "error_message": "card declined", "attempts": 4}


def test_a_delivery_suspended_to_retry_a_step_carries_the_failed_attempts_error_for_the_log(sqlite_backend, clock):
    admit(sqlite_backend, "retry_policy", {"policy": {"max_attempts": 3, "interval": 1}, "catch": True})
    first = deliver(sqlite_backend)
    assert json.loads(first.step_error_json) == {"type": "ValueError", "message": "card declined", "step": "charge",
                                                 "attempt": 1}
    clock.advance(1_000)
    assert json.loads(deliver(sqlite_backend).step_error_json)["attempt"] == 2

    # Suspended on a timer, with no step failed: no error to report.
    admit(sqlite_backend, "timer_between_steps", {"x": 1}, execution_id="e2")
    assert deliver(sqlite_backend, "e2").step_error_json is None


def test_exhausted_retryable_error_carries_the_original_type_and_message(sqlite_backend, clock):
    admit(sqlite_backend, "retrying", {"failures": 10, "max_attempts": 2, "interval": 1, "catch": True})
    assert deliver(sqlite_backend) == Suspended()
    clock.advance(1_000)

    outcome = deliver(sqlite_backend)

    assert json.loads(outcome.result_json) == {
        "before": "ready", "error_type": "RetryableError", "error_message": "flaky not yet (2)",
        "attempts": 2, "step_key": "flaky"}
    assert sample.calls["flaky"] == 2
    recorded = sqlite_backend.heap.read_step(EID, "flaky")
    assert recorded.attempt == 2 and recorded.done
    error = json.loads(recorded.step_response_json)["error"]
    assert error["type"] == "RetryableError" and "flaky not yet (2)" in error["traceback"]


def test_an_uncaught_step_failure_fails_the_execution_with_a_json_error(sqlite_backend, clock):
    admit(sqlite_backend, "retry_policy", {"policy": None})

    outcome = deliver(sqlite_backend)  # no policy: an ordinary error is not retried

    assert isinstance(outcome, Failed)
    error = error_of(sqlite_backend.executions.get(EID))
    assert sqlite_backend.executions.get(EID).status == "failed"
    assert error["type"] == "StepFailed"
    assert "ValueError: card declined" in error["message"] and "'charge'" in error["message"]
    assert "Traceback" in error["traceback"] and "StepFailed" in error["traceback"]
    assert sample.calls["charge"] == 1


# -- timers -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["sleep", "datetime", "epoch"])
def test_sleeps_resume_at_the_due_time(sqlite_backend, clock, kind):
    start = clock.now
    due = start + 90_000
    admit(sqlite_backend, "sleeper", {"kind": kind, "seconds": 90, "at_ms": due})

    assert deliver(sqlite_backend) == Suspended()
    assert sqlite_backend.executions.get(EID).due_at == due
    clock.now = due - 1
    assert sqlite_backend.executions.claim_due(limit=1, duration=LEASE_MS) == []
    assert sqlite_backend.executions.get(EID).status == "suspended"

    clock.now = due
    outcome = deliver(sqlite_backend)

    assert outcome == Completed(json.dumps(due))
    assert sample.calls == {"workflow:sleeper": 2, "woke": 1}


def test_a_timer_keeps_its_first_due_time_across_early_deliveries(sqlite_backend, clock):
    start = clock.now
    admit(sqlite_backend, "sleeper", {"kind": "sleep", "seconds": 10})
    assert deliver(sqlite_backend) == Suspended()

    sqlite_backend.executions.request_wake(EID, start + 4_000)  # someone wakes it early
    clock.now = start + 4_000
    assert deliver(sqlite_backend) == Suspended()

    assert sqlite_backend.executions.get(EID).due_at == start + 10_000  # not 4 s + 10 s
    assert sample.calls["woke"] == 0


def test_sleep_until_a_past_time_does_not_suspend(sqlite_backend, clock):
    admit(sqlite_backend, "sleeper", {"kind": "epoch", "at_ms": clock.now - 5_000})
    assert deliver(sqlite_backend) == Completed(json.dumps(clock.now))


# -- suspension cannot be swallowed -----------------------------------------------------------

def test_except_exception_cannot_swallow_a_suspension(sqlite_backend, sqlite_path):
    admit(sqlite_backend, "swallow_except_exception")

    assert deliver(sqlite_backend) == Suspended()

    assert sample.calls == {}  # neither the except block nor the step after the timer ran
    assert [row[0] for row in rows(sqlite_path)] == ["nap"]


def test_a_bare_except_that_swallows_a_suspension_cannot_run_more_steps(sqlite_backend, sqlite_path):
    admit(sqlite_backend, "swallow_bare", "continue")

    assert deliver(sqlite_backend) == Suspended()

    assert sample.calls == {"swallowed": 4}  # the timer's unwinding, then each later step's; no step ran
    assert [row[0] for row in rows(sqlite_path)] == ["nap"]


@pytest.mark.parametrize("then", ["return", "raise"])
def test_a_delivery_that_unwound_ends_suspended_however_the_workflow_ends(sqlite_backend, clock, then):
    admit(sqlite_backend, "swallow_bare", then)

    assert deliver(sqlite_backend) == Suspended()

    record = sqlite_backend.executions.get(EID)
    assert record.status == "suspended" and record.due_at == clock.now + 10_000


# -- lost leases ------------------------------------------------------------------------------

def test_a_stale_holder_is_stopped_mid_workflow_and_the_new_holders_records_stand(sqlite_backend, clock, sqlite_path):
    admit(sqlite_backend, "abc")
    stale = claim(sqlite_backend)
    assert stale.token == 1
    outcomes = {}

    def take_over_inside_b(value):
        if sample.calls["b"] > 1:
            return None  # the new holder's own run of b
        clock.now = stale.expires_at + 1  # the first delivery froze past its lease
        current = claim(sqlite_backend)
        assert current.token == 2
        outcomes["current"] = run_delivery(sqlite_backend, current, sample.registry)
        assert sqlite_backend.executions.acknowledge(current, outcomes["current"]) == outcomes["current"]
        return "stale b"

    sample.hooks["b"] = take_over_inside_b
    written_before = rows(sqlite_path)  # nothing yet

    outcome = run_delivery(sqlite_backend, stale, sample.registry)

    assert outcome == LeaseLost()
    assert outcomes["current"] == Completed(json.dumps(["a", "ab", "abc"]))
    # c ran only for the current holder; the stale delivery stopped at its refused write of b.
    assert sample.calls == {"workflow:abc": 2, "a": 1, "b": 2, "c": 1}
    assert written_before == []
    assert rows(sqlite_path) == [
        ("a", 1, True, {"value": "a"}, 1),  # written by the stale holder while it was current
        ("b", 1, True, {"value": "ab"}, 2),
        ("c", 1, True, {"value": "abc"}, 2),
    ]
    assert sqlite_backend.executions.acknowledge(stale, Failed('{"type": "late"}')) == LeaseLost()
    record = sqlite_backend.executions.get(EID)
    assert record.status == "completed" and record.token == 2
    assert json.loads(record.result_json) == ["a", "ab", "abc"]


def test_a_holder_whose_lease_is_taken_over_writes_nothing_more(sqlite_backend, clock, sqlite_path):
    admit(sqlite_backend, "abc")
    stale = claim(sqlite_backend)

    def take_over(value):
        clock.now = stale.expires_at + 1
        assert claim(sqlite_backend).token == 2

    sample.hooks["b"] = take_over
    outcome = run_delivery(sqlite_backend, stale, sample.registry)

    assert outcome == LeaseLost()
    assert sample.calls == {"workflow:abc": 1, "a": 1, "b": 1}  # c never ran
    assert rows(sqlite_path) == [("a", 1, True, {"value": "a"}, 1)]
    assert sqlite_backend.executions.get(EID).token == 2


def test_may_write_false_makes_no_writes_and_reports_the_lease_lost(sqlite_backend, sqlite_path, clock):
    admit(sqlite_backend, "timer_between_steps", {"x": 1})
    lease = claim(sqlite_backend)

    outcome = run_delivery(sqlite_backend, lease, sample.registry, may_write=lambda: False)

    assert outcome == LeaseLost()
    assert rows(sqlite_path) == []
    record = sqlite_backend.executions.get(EID)
    assert record.status == "running" and record.token == 1 and record.due_at == clock.now
    assert sample.calls["second"] == 0


# -- what the workflow code may not do --------------------------------------------------------

def test_unnamed_steps_replay_when_the_order_holds(sqlite_backend, clock, sqlite_path):
    admit(sqlite_backend, "unnamed")
    assert deliver(sqlite_backend) == Suspended()
    clock.advance(1_000)

    assert deliver(sqlite_backend) == Completed(json.dumps("ab"))

    assert [row[0] for row in rows(sqlite_path)] == ["@1:step_a", "pause", "@2:step_b"]
    assert sample.calls == {"step_a": 1, "step_b": 1}


def test_unnamed_steps_taken_in_another_order_park_as_diverged(sqlite_backend, clock, sqlite_path):
    admit(sqlite_backend, "unnamed")
    assert deliver(sqlite_backend) == Suspended()
    sample.flags["swapped"] = True
    clock.advance(1_000)

    outcome = deliver(sqlite_backend)

    assert outcome == Suspended(diverged="recorded step '@1:step_a' was next, but the code reached '@1:step_b'")
    assert sample.calls == {"step_a": 1}  # the diverging step did not run
    assert [row[0] for row in rows(sqlite_path)] == ["@1:step_a", "pause"]
    assert sqlite_backend.executions.get(EID).status == "suspended"  # parked, not failed


def test_a_named_step_key_may_not_start_with_at(sqlite_backend, sqlite_path):
    admit(sqlite_backend, "reserved_key")

    error = error_of(deliver(sqlite_backend))

    assert error["type"] == "InvalidArgument" and "'@mine'" in error["message"]
    assert sample.calls["reserved"] == 0
    assert rows(sqlite_path) == []


def test_the_same_step_key_twice_in_one_run_is_an_error(sqlite_backend, sqlite_path):
    admit(sqlite_backend, "key_twice")

    error = error_of(deliver(sqlite_backend))

    assert error["type"] == "InvalidArgument"
    assert "'same'" in error["message"] and "twice" in error["message"]
    assert sample.calls == {"once": 1}
    assert [row[0] for row in rows(sqlite_path)] == ["same"]


@pytest.mark.parametrize("input", ["object", "nan"])
def test_a_non_serialisable_step_result_fails_that_step(sqlite_backend, sqlite_path, input):
    admit(sqlite_backend, "non_serialisable_step", input)

    outcome = deliver(sqlite_backend)

    result = json.loads(outcome.result_json)
    assert result["step_key"] == "opaque" and result["error_type"] == "NonSerialisableResult"
    assert "'opaque'" in result["error_message"] and "JSON" in result["error_message"]
    [(key, attempt, done, response, _)] = rows(sqlite_path)
    assert (key, attempt, done, response["error"]["type"]) == ("opaque", 1, True, "NonSerialisableResult")


def test_a_non_serialisable_workflow_result_fails_the_execution(sqlite_backend):
    admit(sqlite_backend, "non_serialisable_result")

    error = error_of(deliver(sqlite_backend))

    assert error["type"] == "NonSerialisableResult" and "'non_serialisable_result'" in error["message"]
    assert sqlite_backend.executions.get(EID).status == "failed"


def test_an_unknown_workflow_is_released_not_failed(sqlite_backend):
    admit(sqlite_backend, "no_such_workflow")
    lease = claim(sqlite_backend, EID)

    outcome = run_delivery(sqlite_backend, lease, sample.registry)

    # Routing (SPEC section 11): a workflow this worker's app lacks is another supervisor's.
    assert isinstance(outcome, Retry) and outcome.storage_error is None
    assert outcome.reason.startswith("UnknownWorkflow") and "'no_such_workflow'" in outcome.reason
    assert sqlite_backend.executions.release(lease) == Released()
    record = sqlite_backend.executions.get(EID)
    assert record.status == "admitted" and record.error_json is None and record.unacknowledged_deliveries == 1


# -- a busy database --------------------------------------------------------------------------

@pytest.fixture
def locker(sqlite_path):
    """A second connection that can hold the database's write lock."""
    conn = sqlite3.connect(sqlite_path, isolation_level=None)
    yield conn
    if conn.in_transaction:
        conn.execute("ROLLBACK")
    conn.close()


def test_a_busy_database_asks_for_a_retry(sqlite_backend, clock, sqlite_path, locker):
    admit(sqlite_backend, "abc")
    lease = claim(sqlite_backend)
    sqlite_backend.connection.raw.execute("PRAGMA busy_timeout = 50")
    locker.execute("BEGIN IMMEDIATE")

    outcome = run_delivery(sqlite_backend, lease, sample.registry)

    assert isinstance(outcome, Retry) and "locked" in outcome.reason
    locker.execute("ROLLBACK")
    assert rows(sqlite_path) == []
    assert sqlite_backend.executions.release(lease).status == "released"
    clock.advance(1)
    assert deliver(sqlite_backend) == Completed(json.dumps(["a", "ab", "abc"]))


@pytest.mark.parametrize("workflow, first", [("charge_or_fallback", "charge"), ("start_or_fallback", None)])
def test_except_exception_cannot_turn_a_busy_database_into_a_workflow_error(sqlite_backend, clock, sqlite_path, locker,
                                                                            workflow, first):
    admit(sqlite_backend, workflow)
    lease = claim(sqlite_backend)
    sqlite_backend.connection.raw.execute("PRAGMA busy_timeout = 50")
    locker.execute("BEGIN IMMEDIATE")
    # Were the busy error an ordinary exception, the workflow would catch it, and the lock
    # would be free again by the time it recorded its compensating step.
    sample.hooks["fallback"] = lambda value: locker.execute("ROLLBACK") and None

    outcome = run_delivery(sqlite_backend, lease, sample.registry)

    assert isinstance(outcome, Retry)
    assert sample.calls == ({first: 1} if first else {})  # the fallback never ran
    if locker.in_transaction:
        locker.execute("ROLLBACK")
    assert rows(sqlite_path) == []
    sqlite_backend.executions.release(lease)
    clock.advance(1)
    outcome = deliver(sqlite_backend)
    assert isinstance(outcome, Completed) and "fell back" not in outcome.result_json
    assert sample.calls["fallback"] == 0


# -- the in-process test helper ---------------------------------------------------------------

def test_run_workflow_completes_with_timers_and_retries_on_a_fake_clock(tmp_path):
    clock = FakeClock()
    start = clock.now
    ship_at = start + 3_600_000
    with open_backend(tmp_path / "ledger.db", clock=clock, redelivery_delay=lambda n: 1) as backend:
        record = run_workflow(sample.registry, "order", {"sku": "x1", "qty": 2, "ship_at_ms": ship_at},
                              backend=backend, clock=clock)
        steps = [(r.step_key, r.attempt, r.done) for r in backend.heap.steps("test-execution")]

    assert record.status == "completed"
    assert json.loads(record.result_json) == {
        "reserved": {"sku": "x1", "qty": 2}, "paid": "pay ok after 3", "shipped_after_ms": ship_at - start}
    assert clock.now == ship_at
    assert sample.calls == {"reserve": 1, "pay": 3, "ship": 1}
    assert steps == [("started", 1, True), ("reserve", 1, True), ("cool_off", 1, True), ("pay", 1, False), ("pay", 2, False),
                     ("pay", 3, True), ("ship_window", 1, True), ("ship", 1, True)]


def test_run_workflow_on_its_own_temporary_ledger():
    record = run_workflow(sample.registry, "retry_policy", {"policy": {"max_attempts": 3}, "catch": True})

    assert record.status == "completed"
    assert json.loads(record.result_json)["attempts"] == 3


def test_run_workflow_reports_a_failed_workflow_as_a_failed_record():
    record = run_workflow(sample.registry, "retry_policy", {"policy": None})

    assert record.status == "failed"
    assert json.loads(record.error_json)["type"] == "StepFailed"


def test_run_workflow_returns_a_cancelled_record_as_terminal(tmp_path):
    clock = FakeClock()
    with open_backend(tmp_path / "ledger.db", clock=clock, redelivery_delay=lambda n: 1) as backend:
        backend.executions.admit("test-execution", "forever", "null")
        backend.executions.cancel("test-execution", reason="no longer wanted")
        record = run_workflow(sample.registry, "forever", backend=backend, clock=clock, max_deliveries=20)

    assert record.status == "cancelled"
    assert json.loads(record.error_json)["message"] == "no longer wanted"


def test_run_workflow_raises_workflow_stuck_for_a_workflow_that_never_ends():
    with pytest.raises(WorkflowStuck, match="not terminal after 20 deliveries"):
        run_workflow(sample.registry, "forever", max_deliveries=20)


def test_run_workflow_raises_workflow_stuck_for_a_workflow_that_waits_for_nothing():
    with pytest.raises(WorkflowStuck, match="waits for nothing"):
        run_workflow(sample.registry, "waits_for_nothing")
