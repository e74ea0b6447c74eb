"""The workflow timeout in the ledger (SPEC section 12), on each backend, on the fake clock:
`admit(timeout_ms=)` records a deadline; one `time_out_due` fails every execution not terminal
past its deadline (due, running, sleeping, waiting) as `WorkflowTimedOut`, ending a live delivery
as a cancel does (its holder's fenced calls refused) and waking its waiters, and touches nothing
else; with nothing past its deadline it is one read; defaults reach child starts and schedule
ticks; bad input is refused with the ledger unchanged."""

from __future__ import annotations

import json

import pytest

from supervisor import Completed, ExecutionConflict, InvalidArgument, LeaseLost, Suspended
from supervisor.ledger.ticks import schedule_of, tick_id
from supervisor.ledger.values import WORKFLOWS_TIMEOUT

pytestmark = pytest.mark.timeout(60)

LEASE_MS = 60_000


def claim_all(backend) -> dict:
    return {lease.execution_id: lease for lease in backend.executions.claim_due(limit=10, duration=LEASE_MS)}


def error_of(backend, execution_id: str) -> dict:
    return json.loads(backend.executions.get(execution_id).error_json)


def test_admit_records_the_deadline_and_a_repeat_with_another_timeout_conflicts(backend, clock):
    record = backend.executions.admit("a", "wf", timeout_ms=5000)
    assert record.deadline_at == clock.now + 5000
    assert backend.executions.admit("a", "wf", timeout_ms=5000) == record
    for other in (None, 4000):
        with pytest.raises(ExecutionConflict, match="timeout_ms"):
            backend.executions.admit("a", "wf", timeout_ms=other)
    assert backend.executions.admit("b", "wf").deadline_at is None


def test_one_call_fails_every_unfinished_execution_past_its_deadline_and_nothing_else(backend, clock):
    executions = backend.executions
    for execution_id in ("running", "sleeping", "waiting", "done"):
        executions.admit(execution_id, "wf", timeout_ms=1000)
    executions.admit("later", "wf", timeout_ms=5000)
    executions.admit("untimed", "wf")
    executions.admit("parent", "wf")
    leases = claim_all(backend)
    executions.admit("due", "wf", timeout_ms=1000)
    # sleeping: on a timer far past the deadline; waiting: for a wake that never comes; parent:
    # for the outcome of the running one.
    executions.request_wake("sleeping", clock.now + 3_600_000)
    executions.await_outcome("running", "parent")
    for execution_id in ("sleeping", "waiting", "later", "untimed", "parent"):
        assert executions.acknowledge(leases[execution_id], Suspended()) == Suspended()
    assert executions.acknowledge(leases["done"], Completed('"ok"')).status == "completed"
    running = leases["running"]

    clock.advance(999)
    assert executions.time_out_due() == []  # a deadline is "not terminal by then": not yet
    clock.advance(1)
    assert executions.time_out_due() == ["due", "running", "sleeping", "waiting"]

    for execution_id in ("due", "running", "sleeping", "waiting"):
        record = executions.get(execution_id)
        assert (record.status, record.due_at, record.lease_expires_at) == ("failed", None, None)
        assert error_of(backend, execution_id) == {
            "type": "WorkflowTimedOut", "message": "the execution was not finished within 1 s of its admission"}
    assert executions.get("done").status == "completed"
    assert executions.get("later").status == "suspended" and executions.get("untimed").status == "suspended"
    # The live delivery ended as on a cancel: every later fenced call of its holder is refused.
    assert executions.history("running")[-1].ended_by == "timed_out"
    assert backend.heap.write_step(running, step_key="s", step_attempt=1, done=True,
                                   step_response_json='{"result": 1}') == LeaseLost()
    assert executions.renew(running, duration=LEASE_MS) == LeaseLost()
    assert executions.acknowledge(running, Completed('"late"')) == LeaseLost()
    assert backend.heap.read_step("running", "s") is None
    assert executions.ended([running]) == [running]
    # Its waiter was woken; none of the failed ones is claimable.
    assert list(claim_all(backend)) == ["parent"]
    assert executions.time_out_due() == []
    clock.advance(4000)
    assert executions.time_out_due() == ["later"]


def test_with_nothing_past_its_deadline_the_call_is_one_read(backend, clock, monkeypatch):
    backend.executions.admit("a", "wf", timeout_ms=10_000)
    conn = backend.executions._conn
    made = []
    for name in ("execute", "write"):
        real = getattr(conn, name)
        monkeypatch.setattr(conn, name, lambda *args, _real=real, _name=name, **kwargs:
                            made.append(_name) or _real(*args, **kwargs))
    assert backend.executions.time_out_due() == []
    assert made == ["execute"]


def test_the_sqlite_read_seeks_the_index_of_deadlines(sqlite_path, clock):
    from supervisor import open_backend
    from supervisor.ledger.tables.deadlines import PASSED

    with open_backend(sqlite_path, clock=clock) as backend:
        sql = backend.connection.dialect.statements[PASSED]
        plan = backend.connection.raw.execute("EXPLAIN QUERY PLAN " + sql, (clock.now,)).fetchall()
    assert any("executions_deadline" in row[-1] for row in plan), plan


def test_a_resumed_execution_runs_to_a_new_deadline(backend, clock):
    backend.executions.admit("a", "wf", timeout_ms=1000)
    clock.advance(1000)
    assert backend.executions.time_out_due() == ["a"]
    clock.advance(10_000)
    record = backend.executions.resume("a")
    assert (record.status, record.deadline_at) == ("admitted", clock.now + 1000)
    assert backend.executions.time_out_due() == []


def test_child_starts_and_schedule_ticks_take_their_workflows_default_timeout(backend, clock):
    backend.queues.record_defaults({"child": ("default", 0, 30_000), "tick": ("default", 0, 7000),
                                    "plain": ("default", 0)})
    assert (backend.queues.timeout_of("child"), backend.queues.timeout_of("plain"),
            backend.queues.timeout_of("unknown")) == (30_000, None, None)
    assert backend.queues.defaults_of("child") == ("default", 0)
    backend.starts.start("s-1", "child")
    backend.starts.start("s-2", "plain")
    assert backend.executions.get("s-1").deadline_at == clock.now + 30_000
    assert backend.executions.get("s-2").deadline_at is None
    every_2 = schedule_of("tick", every=2)
    start = clock.now - clock.now % 2000
    backend.schedules.admit_due([every_2], now=start + 500)
    (record,) = backend.schedules.admit_due([every_2], now=start + 2001)
    assert record.admitted
    assert backend.executions.get(tick_id("tick", start + 2000)).deadline_at == start + 2001 + 7000


def test_a_start_made_before_any_record_of_its_workflow_takes_the_first_records_timeout(backend, clock):
    """A start that leaves the timeout to its workflow, made before any supervisor recorded the
    workflow's defaults, takes the timeout the first record gives, its deadline counted from
    its admission; one that said "no timeout" (None) keeps none, and a live lease waits for
    the next record, as it does for the queue."""
    executions = backend.executions
    admitted = clock.now
    executions.admit("early", "wf", queue=None, priority=None, timeout_ms=WORKFLOWS_TIMEOUT)
    executions.admit("held", "wf", queue=None, priority=None, timeout_ms=WORKFLOWS_TIMEOUT)
    executions.admit("untimed", "wf", queue=None, priority=None)
    assert executions.get("early").deadline_at is None
    leases = claim_all(backend)
    assert set(leases) == {"early", "held", "untimed"}
    for execution_id in ("early", "untimed"):
        executions.release(leases[execution_id])
    clock.advance(1000)

    backend.queues.record_defaults({"wf": ("default", 0, 5000)})

    early = executions.get("early")
    assert (early.deadline_at, executions.get("untimed").deadline_at) == (admitted + 5000, None)
    assert executions.get("held").deadline_at is None  # its live lease: the next record
    assert executions.admit("early", "wf", queue=None, priority=None, timeout_ms=WORKFLOWS_TIMEOUT) == \
        executions.get("early")  # a repeat of the start accepts the timeout it took
    clock.advance(4000)
    assert executions.time_out_due() == ["early"]
    executions.release(leases["held"])
    backend.queues.record_defaults({"wf": ("default", 0, 5000)})
    assert executions.get("held").deadline_at == admitted + 5000
    assert executions.time_out_due() == ["held"]


BAD_TIMEOUTS = [0, -1, 1.5, float("nan"), float("inf"), "1000", True, 2 ** 60]


@pytest.mark.parametrize("bad", BAD_TIMEOUTS, ids=repr)
def test_a_bad_timeout_is_refused_naming_timeout_ms_and_nothing_is_written(backend, each_backend, db_snapshot, bad):
    backend.executions.admit("kept", "wf")
    before = db_snapshot(each_backend)
    with pytest.raises(ValueError, match="timeout_ms") as refused:
        backend.executions.admit("new", "wf", timeout_ms=bad)
    assert isinstance(refused.value, InvalidArgument)
    with pytest.raises(InvalidArgument, match="timeout_ms"):
        backend.queues.record_defaults({"wf": ("default", 0, bad)})
    assert db_snapshot(each_backend) == before
