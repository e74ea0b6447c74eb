"""Workflow starts (SPEC section 4, RFC 003): `WorkflowStartClient.start`, `ctx.start` and
`ctx.wait_for`, the rows of RFC 002's fencing table that concern them (and wakes, the unfenced
write they rely on), and a child awaited by its parent across supervisor restarts.

The in-process tests run workflows through `run_delivery` against a real SQLite ledger under
`tmp_path`, one backend per holder, all on one `FakeClock` (see `holders.py`). The restart
tests run `yieldstar supervise tests/apps/neighbours_app.py` as real subprocesses.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from faults import wait_gone, wait_until
from holders import (LEASE_MS, NEIGHBOURS_APP, Interposed, deliveries, result_of, step_rows,
                     table)
from supervisor import Completed, ExecutionConflict, InvalidArgument, LeaseLost, Suspended, open_backend
from worker import Registry, StepFailed
from worker._runtime.driver import run_delivery

registry = Registry()


class CardDeclined(Exception):
    pass


@registry.workflow("starter")
def starter(ctx, input):
    """Start one child and return its id."""
    return ctx.start("child", "double", input)


@registry.workflow("parent")
def parent(ctx, input):
    child_id = ctx.start("child", input["workflow"], input["input"])
    try:
        return {"child": child_id, "result": ctx.wait_for(child_id)}
    except StepFailed as exc:
        return {"child": child_id, "failed": {"type": exc.error_type, "message": exc.error_message}}


@registry.workflow("double")
def double(ctx, input):
    return input * 2


@registry.workflow("decline")
def decline(ctx, input):
    raise CardDeclined(f"card {input} declined")


@registry.workflow("nap")
def nap(ctx, input):
    ctx.sleep("nap", 60)
    return "rested"


def execution_ids(backend) -> list[str]:
    return sorted(record.execution_id for record in backend.executions.list())


# -- WorkflowStartClient.start ----------------------------------------------------------------------

@pytest.mark.timeout(30)
def test_workflow_start_is_idempotent_by_receipt_a_repeat_starts_nothing_and_returns_the_first_target(
        world, holder, db_snapshot):
    assert holder.starts.start("req-1", "double", "21") == "req-1"
    record = holder.executions.get("req-1")
    assert (record.workflow, record.input_json, record.status) == ("double", "21", "admitted")

    before = db_snapshot(world.path)
    assert world.holder().starts.start("req-1", "double", "21") == "req-1"
    assert holder.starts.start("req-1", "decline", '"4242"') == "req-1"  # the first target, whatever is asked
    assert db_snapshot(world.path) == before

    holder.executions.admit("admitted-by-hand", "double", "1")
    with pytest.raises(ExecutionConflict, match="admitted-by-hand"):
        holder.starts.start("admitted-by-hand", "double", "1")
    with pytest.raises(InvalidArgument, match="input_json"):
        holder.starts.start("req-2", "double", "{not json")
    assert execution_ids(holder) == ["admitted-by-hand", "req-1"]
    assert table(world.path, "SELECT start_request_id, execution_id FROM starts") == [("req-1", "req-1")]


# -- RFC 002 fencing table: WorkflowStartClient.start -----------------------------------------------

@pytest.mark.timeout(30)
@pytest.mark.parametrize("first", ["stale starts first", "current starts first"])
def test_a_stale_holder_calls_workflow_start_the_current_holder_receives_the_same_target_and_exactly_one_target_exists(
        world, holder, first):
    holder.executions.admit("e1", "starter", "21")
    stale_lease = world.claim(world.holder(), "e1")  # token 1
    current = Interposed(holder, "starts.start")

    def meanwhile():
        # Token 1 is frozen just before its start: its lease runs out, and token 2 claims.
        lease = world.take_over(holder, stale_lease)
        if first == "current starts first":
            assert world.deliver(current, lease, registry) == Completed('"e1/child"')
        meanwhile.lease = lease

    stale = Interposed(world.holder(), "starts.start", before=meanwhile)
    assert world.deliver(stale, stale_lease, registry) == LeaseLost()  # its start went in; its step write did not
    if first == "stale starts first":
        assert world.deliver(current, meanwhile.lease, registry) == Completed('"e1/child"')

    assert stale.replies == current.replies == ["e1/child"]
    assert execution_ids(holder) == ["e1", "e1/child"]
    assert table(world.path, "SELECT start_request_id, execution_id FROM starts") == [("e1/child", "e1/child")]
    child = holder.executions.get("e1/child")
    assert (child.workflow, child.input_json, child.status) == ("double", "21", "admitted")
    assert step_rows(world.path, "e1") == [("child", 1, {"value": "e1/child"}, 2)]
    assert holder.executions.acknowledge(stale_lease, Completed('"stale"')) == LeaseLost()
    assert result_of(holder.executions.get("e1")) == "e1/child"


# -- ctx.start and ctx.wait_for, in-process ---------------------------------------------------------

@pytest.mark.timeout(30)
def test_a_parent_suspends_until_its_child_completes_and_returns_the_childs_result(world, holder):
    holder.executions.admit("p1", "parent", json.dumps({"workflow": "double", "input": 21}))
    assert world.claim_and_deliver(holder, "p1", registry) == Suspended()
    assert holder.executions.get("p1").due_at is None  # nothing to do until the child is done
    assert holder.executions.get("p1/child").status == "admitted"

    assert world.claim_and_deliver(holder, "p1/child", registry) == Completed("42")
    assert holder.executions.get("p1").due_at == world.clock.now  # woken by the child's outcome
    assert world.claim_and_deliver(holder, "p1", registry) == Completed(
        json.dumps({"child": "p1/child", "result": 42}))
    assert [key for key, *_ in step_rows(world.path, "p1")] == ["child", "wait:p1/child"]
    assert deliveries(holder, "p1") == 2


@pytest.mark.timeout(30)
def test_a_failing_child_raises_step_failed_into_its_parent_with_the_childs_error_type_and_message(world, holder):
    holder.executions.admit("p1", "parent", json.dumps({"workflow": "decline", "input": 4242}))
    assert world.claim_and_deliver(holder, "p1", registry) == Suspended()
    assert world.claim_and_deliver(holder, "p1/child", registry).status == "failed"
    assert world.claim_and_deliver(holder, "p1", registry).status == "completed"
    assert result_of(holder.executions.get("p1")) == {
        "child": "p1/child", "failed": {"type": "CardDeclined", "message": "card 4242 declined"}}


@pytest.mark.timeout(30)
def test_a_parent_that_reaches_an_already_finished_child_does_not_suspend(world, holder):
    holder.starts.start("p1/child", "double", "5")  # as if an earlier delivery started it
    assert world.claim_and_deliver(holder, "p1/child", registry) == Completed("10")
    holder.executions.admit("p1", "parent", json.dumps({"workflow": "double", "input": 5}))
    assert world.claim_and_deliver(holder, "p1", registry) == Completed(json.dumps({"child": "p1/child", "result": 10}))
    assert table(world.path, "SELECT * FROM waiters") == []


# -- RFC 002 fencing table: wait_for's waiter registration, unfenced ---------------------------------

@pytest.mark.timeout(30)
def test_a_stale_wait_for_registration_causes_at_most_one_extra_delivery_and_the_outcome_is_unchanged(world, holder):
    holder.executions.admit("p1", "parent", json.dumps({"workflow": "double", "input": 21}))
    stale_lease = world.claim(world.holder(), "p1")

    def meanwhile():
        # Token 1 started the child and is frozen before registering as its waiter; token 2
        # replays the start, registers, and suspends.
        assert world.deliver(holder, world.take_over(holder, stale_lease), registry) == Suspended()

    stale = Interposed(world.holder(), "executions.await_outcome", before=meanwhile)
    assert run_delivery(stale, stale_lease, registry) == Suspended()  # unfenced: its registration went in
    assert holder.executions.acknowledge(stale_lease, Suspended()) == LeaseLost()
    assert table(world.path, "SELECT kind, target, waiter FROM waiters") == [("execution", "p1/child", "p1")]
    claims = deliveries(holder, "p1")

    assert world.claim_and_deliver(holder, "p1/child", registry) == Completed("42")
    assert world.claim_and_deliver(holder, "p1", registry) == Completed(json.dumps({"child": "p1/child", "result": 42}))
    # A stale registration after the child finished registers nothing: there is nothing to wait for.
    assert world.holder().executions.await_outcome("p1/child", "p1").status == "completed"
    assert table(world.path, "SELECT * FROM waiters") == []
    assert holder.executions.claim_due(limit=5, duration=LEASE_MS) == []
    assert deliveries(holder, "p1") == claims + 1
    assert execution_ids(holder) == ["p1", "p1/child"]


# -- RFC 002 fencing table: requestWake, unfenced -----------------------------------------------------

@pytest.mark.timeout(30)
@pytest.mark.parametrize("when", ["while the current holder runs", "after the current holder suspended"])
def test_a_stale_holder_requests_a_wake_at_most_one_extra_delivery_occurs_and_the_outcome_is_unchanged(
        world, holder, when):
    holder.executions.admit("e1", "nap")
    stale_backend = world.holder()
    stale_lease = world.claim(stale_backend, "e1")
    until = world.clock.now + 60_000

    def meanwhile():
        # Token 1 recorded its timer and is frozen before asking for the wake at its end.
        meanwhile.lease = world.take_over(holder, stale_lease)
        if when == "after the current holder suspended":
            assert world.deliver(holder, meanwhile.lease, registry) == Suspended()

    stale = Interposed(stale_backend, "executions.request_wake", before=meanwhile)
    assert run_delivery(stale, stale_lease, registry) == Suspended()  # its wake went in
    # And it asks for one more wake, now: say it thought a retry was due.
    stale_backend.executions.request_wake("e1", world.clock.now)
    assert holder.executions.acknowledge(stale_lease, Suspended()) == LeaseLost()
    if when == "while the current holder runs":
        assert holder.executions.claim_due(limit=1, duration=LEASE_MS) == []  # not while token 2's lease is live
        assert world.deliver(holder, meanwhile.lease, registry) == Suspended()

    # The one extra delivery: the replay finds the timer running and suspends again.
    assert world.claim_and_deliver(holder, "e1", registry) == Suspended()
    assert holder.executions.get("e1").due_at == until
    assert holder.executions.claim_due(limit=1, duration=LEASE_MS) == []
    world.clock.now = until
    assert world.claim_and_deliver(holder, "e1", registry) == Completed('"rested"')
    assert deliveries(holder, "e1") == 3 + 1  # the stale one, the takeover, the end; plus one
    assert step_rows(world.path, "e1") == [("nap", 1, {"until": until}, 1)]


# -- a child awaited by its parent across supervisor restarts -----------------------------------------

def start_supervisor(supervisors, db):
    return supervisors.start(db, app=str(NEIGHBOURS_APP), concurrency=2, lease_ms=1500, renew_ms=300,
                             heartbeat_ms=200, poll_ms=100, grace_ms=300, ready=False)


def read_log(log: str) -> list[tuple[str, str, int]]:
    """`(event, execution_id, token)` of every complete line of a neighbours_app log."""
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [(event, execution_id, int(token))
                for event, execution_id, token, _ in (line.split() for line in f if line.endswith("\n"))]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("stop, decline", [
    ("SIGTERM", None),
    ("SIGKILL", None),
    ("SIGTERM", "card 4242 declined"),
], ids=["stopped-child-completes", "killed-child-completes", "stopped-child-fails"])
def test_a_child_awaited_by_its_parent_across_supervisor_restarts(tmp_path, supervisors, stop, decline):
    db, log, marker = tmp_path / "ledger.db", str(tmp_path / "events.log"), tmp_path / "marker"
    child_input = {"order": 42, "log": log, "marker": str(marker), "decline": decline}
    with open_backend(db) as holder:
        holder.executions.admit("p1", "nb.parent", json.dumps({"child": child_input}))

        first = start_supervisor(supervisors, db)
        # The parent started its child and waits for it; the child blocks in a step.
        wait_until(lambda: ("waiting", "p1/child", 1) in read_log(log), 30,
                   message="the child to block on its marker")
        wait_until(lambda: holder.executions.get("p1").status == "suspended", 10, message="the parent to suspend")

        pids = [first.pid, *(p.pid for p in first.tree())]
        if stop == "SIGTERM":
            first.signal(signal.SIGTERM)
            assert first.wait(20) == 0
        else:
            first.signal_group(signal.SIGKILL)
            first.wait(10)
        wait_gone(pids)
        assert holder.executions.get("p1").status == "suspended"
        assert holder.executions.get("p1/child").status in ("admitted", "running")

        second = start_supervisor(supervisors, db)
        # The new supervisor delivers the child again (a higher token), and it blocks again.
        wait_until(lambda: ("waiting", "p1/child", 2) in read_log(log), 30,
                   message="the child to be delivered again")
        marker.touch()
        record = wait_until(lambda: (r := holder.executions.get("p1")).status == "completed" and r, 30,
                            message="the parent to complete")

        expected = ({"failed": {"type": "CardDeclined", "message": decline}} if decline
                    else {"result": {"packed": 42}})
        assert json.loads(record.result_json) == {"child": "p1/child", **expected}
        assert holder.executions.get("p1/child").status == ("failed" if decline else "completed")
        assert [r.workflow for r in holder.executions.list()] == ["nb.child", "nb.parent"]
        assert table(db, "SELECT start_request_id, execution_id FROM starts") == [("p1/child", "p1/child")]
        # The parent ran its start once: every later delivery replayed the recorded target.
        assert [key for key, *_ in step_rows(db, "p1")] == ["child", "wait:p1/child"]

        second.signal(signal.SIGTERM)
        assert second.wait(20) == 0
