"""A parent that waits for a child an operator cancels (issue 11): it is woken, and
`ctx.wait_for` raises a `StepFailed` it can catch, with the error type `Cancelled` and a
message naming the cancelled execution and the reason.

In-process, through `run_delivery` on a real ledger (SQLite, and PostgreSQL when a server is
available), one backend per holder on one `FakeClock` (see `holders.py`)."""

from __future__ import annotations

import json

import pytest

from holders import result_of
from supervisor import Completed, LeaseLost, Suspended
from worker import Registry, StepFailed
from worker._runtime.driver import run_delivery

registry = Registry()


@registry.workflow("parent")
def parent(ctx, input):
    kid = ctx.start("kid", input["workflow"])
    try:
        return {"result": ctx.wait_for(kid)}
    except StepFailed as exc:
        return {"caught": {"type": exc.error_type, "message": exc.error_message, "step": exc.step_key}}


@registry.workflow("nap")
def nap(ctx, input):
    ctx.sleep("nap", 60)
    return "rested"


@registry.workflow("quick")
def quick(ctx, input):
    return "done"


CAUGHT = {"caught": {"type": "Cancelled", "message": "execution 'P1/kid' was cancelled: not needed",
                     "step": "wait:P1/kid"}}


@pytest.mark.timeout(30)
def test_a_parent_waiting_on_a_suspended_child_that_is_cancelled_is_woken_and_catches_step_failed(world, holder):
    holder.executions.admit("P1", "parent", json.dumps({"workflow": "nap"}))
    assert world.claim_and_deliver(holder, "P1", registry) == Suspended()
    assert world.claim_and_deliver(holder, "P1/kid", registry) == Suspended()  # asleep for 60 s
    assert holder.executions.get("P1").due_at is None  # waits for the child, for nothing else

    assert holder.executions.cancel("P1/kid", reason="not needed").status == "cancelled"
    assert holder.executions.get("P1").due_at is not None  # woken by the cancellation
    assert world.claim_and_deliver(holder, "P1", registry).status == "completed"
    assert result_of(holder.executions.get("P1")) == CAUGHT


@pytest.mark.timeout(30)
def test_a_child_cancelled_while_it_runs_wakes_its_parent_and_its_own_outcome_is_refused(world, holder):
    holder.executions.admit("P1", "parent", json.dumps({"workflow": "quick"}))
    assert world.claim_and_deliver(holder, "P1", registry) == Suspended()
    kid = world.holder()
    lease = world.claim(kid, "P1/kid")  # the child is running when the operator cancels it

    holder.executions.cancel("P1/kid", reason="not needed")
    outcome = run_delivery(kid, lease, registry)
    assert outcome == Completed('"done"')  # it wrote nothing fenced before it finished...
    assert kid.executions.acknowledge(lease, outcome) == LeaseLost()  # ...and its outcome is refused
    assert holder.executions.get("P1/kid").status == "cancelled"
    assert world.claim_and_deliver(holder, "P1", registry).status == "completed"
    assert result_of(holder.executions.get("P1")) == CAUGHT


@pytest.mark.timeout(30)
def test_a_parent_that_reaches_a_child_already_cancelled_catches_step_failed_without_suspending(world, holder):
    holder.starts.start("P1/kid", "nap", "null")  # as if an earlier delivery of P1 had started it
    holder.executions.cancel("P1/kid", reason="not needed")
    holder.executions.admit("P1", "parent", json.dumps({"workflow": "nap"}))
    assert world.claim_and_deliver(holder, "P1", registry) == Completed(json.dumps(CAUGHT))
