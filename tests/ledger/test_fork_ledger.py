"""Forking an execution in the ledger (SPEC section 14): the fork is a new execution of the same
workflow and input whose steps are copies of the original's recorded before the step named, in
recording order; the original is unchanged, and a refused fork writes nothing. On both backends;
times come from the fake clock."""

from __future__ import annotations

import json

import pytest

from supervisor import Completed, ExecutionConflict, InvalidArgument, UnknownExecution
from supervisor.ledger.errors import UnknownStep

LEASE_MS = 30_000


def claim(backend, execution_id):
    (lease,) = backend.executions.claim_due(limit=1, duration=LEASE_MS)
    assert lease.execution_id == execution_id, lease
    return lease


def step(backend, lease, key, response, *, attempt=1, done=True):
    written = backend.heap.write_step(lease, step_key=key, step_attempt=attempt, done=done,
                                      step_response_json=json.dumps(response))
    assert written.status == "written", written


def recorded(backend, execution_id):
    return [(s.step_key, s.attempt, s.done, json.loads(s.step_response_json))
            for s in backend.heap.steps(execution_id)]


def everything_of(backend, execution_id):
    """What the ledger holds of one execution: its record, steps, history, events, messages."""
    return (backend.executions.get(execution_id), backend.heap.steps(execution_id),
            backend.executions.history(execution_id), backend.events.list(execution_id),
            backend.messages.list(execution_id))


def completed_order(backend):
    """`order-1`: steps recorded z, a (failed once, then done), m, b, then completed. Keys are not
    in recording order alphabetically, so an order by key would show."""
    backend.executions.admit("order-1", "order", '{"sku": "kettle"}', queue="shop", key="customer-7", priority=3,
                             timeout_ms=600_000)
    lease = claim(backend, "order-1")
    step(backend, lease, "z", {"value": "reserved"})
    step(backend, lease, "a", {"error": {"type": "Timeout", "message": "slow"}, "retry_at": 0}, done=False)
    step(backend, lease, "a", {"value": "charged"}, attempt=2)
    step(backend, lease, "m", {"value": "mailed"})
    step(backend, lease, "b", {"value": "shipped"})
    assert backend.executions.acknowledge(lease, Completed('"done"')).status == "completed"


@pytest.mark.timeout(60)
def test_a_fork_copies_the_steps_recorded_before_the_step_in_recording_order(backend, clock):
    completed_order(backend)
    original = everything_of(backend, "order-1")
    clock.advance(5_000)

    fork = backend.executions.fork("order-1", "order-1-again", from_step="m")

    assert (fork.execution_id, fork.workflow, json.loads(fork.input_json)) == ("order-1-again", "order",
                                                                              {"sku": "kettle"})
    assert (fork.status, fork.due_at, fork.result_json, fork.error_json) == ("admitted", clock(), None, None)
    assert (fork.queue, fork.key, fork.priority) == ("shop", "customer-7", 3)
    assert fork.deadline_at == clock() + 600_000  # a fresh timeout, counted from the fork
    assert recorded(backend, "order-1-again") == [
        ("z", 1, True, {"value": "reserved"}),
        ("a", 1, False, {"error": {"type": "Timeout", "message": "slow"}, "retry_at": 0}),
        ("a", 2, True, {"value": "charged"}),
    ]
    assert everything_of(backend, "order-1") == original
    assert backend.executions.history("order-1-again") == []

    # The fork runs from there: claimed, it writes the step it was forked from, after the copies.
    # Its first claim is not token 1, which would tell its worker that nothing is recorded.
    (claimed,) = backend.executions.claim_deliveries(limit=1, duration=LEASE_MS)
    lease = claimed.lease
    assert (lease.execution_id, lease.token, claimed.input_json) == ("order-1-again", 2, None)
    step(backend, lease, "m", {"value": "mailed again"})
    assert [s[0] for s in recorded(backend, "order-1-again")] == ["z", "a", "a", "m"]
    assert backend.executions.acknowledge(lease, Completed('"again"')).status == "completed"
    assert everything_of(backend, "order-1") == original


@pytest.mark.timeout(60)
def test_a_fork_from_the_first_step_or_from_a_retried_one_copies_what_came_before_its_first_attempt(backend):
    completed_order(backend)
    backend.executions.fork("order-1", "from-z", from_step="z")
    backend.executions.fork("order-1", "from-a", from_step="a")
    assert recorded(backend, "from-z") == []
    (claimed,) = backend.executions.claim_deliveries(limit=1, duration=LEASE_MS)  # nothing recorded: token 1
    assert (claimed.lease.execution_id, claimed.lease.token, claimed.input_json) == ("from-z", 1, '{"sku": "kettle"}')
    assert recorded(backend, "from-a") == [("z", 1, True, {"value": "reserved"})]


@pytest.mark.timeout(60)
def test_a_fork_leaves_to_the_workflows_defaults_what_the_original_left_to_them(backend, clock):
    from supervisor.ledger.values import WORKFLOWS_TIMEOUT

    backend.executions.admit("early", "order", queue=None, priority=None, timeout_ms=WORKFLOWS_TIMEOUT)
    lease = claim(backend, "early")
    step(backend, lease, "a", {"value": 1})
    step(backend, lease, "b", {"value": 2})
    backend.executions.release(lease)
    fork = backend.executions.fork("early", "early-fork", from_step="b")
    assert (fork.queue, fork.priority, fork.deadline_at) == ("default", 0, None)
    backend.queues.record_defaults({"order": ("shop", 5, 60_000)})  # the first record of them
    again = backend.executions.get("early-fork")
    assert (again.queue, again.priority, again.deadline_at) == ("shop", 5, fork.created_at + 60_000)


@pytest.mark.timeout(60)
def test_a_running_execution_can_be_forked_and_goes_on_unchanged(backend):
    backend.executions.admit("order-2", "order")
    lease = claim(backend, "order-2")
    step(backend, lease, "a", {"value": 1})
    step(backend, lease, "b", {"value": 2})
    backend.executions.fork("order-2", "order-2-fork", from_step="b")
    step(backend, lease, "c", {"value": 3})  # the original's holder writes on
    assert [s[0] for s in recorded(backend, "order-2")] == ["a", "b", "c"]
    assert backend.executions.get("order-2").status == "running"
    assert recorded(backend, "order-2-fork") == [("a", 1, True, {"value": 1})]


@pytest.mark.timeout(60)
def test_a_fork_keeps_the_events_its_copied_steps_set_and_starts_with_an_empty_mailbox(backend):
    backend.executions.admit("chat", "chat")
    lease = claim(backend, "chat")
    backend.events.set(lease, "colour", '"red"')
    step(backend, lease, "@1:set_event:colour", None)
    backend.events.set(lease, "size", '"S"')
    step(backend, lease, "@2:set_event:size", None)
    step(backend, lease, "b", {"value": 2})
    backend.events.set(lease, "size", '"XL"')  # set again after the fork point: its value there is lost
    step(backend, lease, "@4:set_event:size", None)
    backend.messages.send("chat", '"hello"', message_id="m1")

    backend.executions.fork("chat", "chat-fork", from_step="b")

    assert {e.key: json.loads(e.value_json) for e in backend.events.list("chat-fork")} == {"colour": "red"}
    assert backend.messages.list("chat-fork") == [] and backend.messages.pending("chat-fork") == {}
    assert backend.messages.pending("chat") == {"default": 1}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("call, error, words", [
    (dict(execution_id="order-1", new_id="f", from_step="shipping"), UnknownStep,
     ["'shipping' is not a recorded step of execution 'order-1'", "'z', 'a', 'm', 'b'", "nothing was forked"]),
    (dict(execution_id="order-9", new_id="f", from_step="z"), UnknownExecution, ["'order-9'"]),
    (dict(execution_id="order-1", new_id="taken", from_step="m"), ExecutionConflict,
     ["new_id 'taken' is taken", "nothing was forked"]),
    (dict(execution_id="order-1", new_id="order-1", from_step="m"), ExecutionConflict, ["new_id 'order-1'"]),
    (dict(execution_id="order-1", new_id="   ", from_step="m"), InvalidArgument, ["new_id", "blank"]),
    (dict(execution_id="order-1", new_id="f", from_step=""), InvalidArgument, ["from_step", "empty"]),
])
def test_a_refused_fork_writes_nothing(backend, each_backend, db_snapshot, call, error, words):
    completed_order(backend)
    backend.executions.admit("taken", "other")
    before = db_snapshot(each_backend)
    with pytest.raises(error) as raised:
        backend.executions.fork(call["execution_id"], call["new_id"], from_step=call["from_step"])
    for word in words:
        assert word in str(raised.value)
    assert db_snapshot(each_backend) == before


@pytest.mark.timeout(60)
def test_a_fork_of_an_execution_with_no_steps_says_it_has_none(backend):
    backend.executions.admit("fresh", "order")
    with pytest.raises(UnknownStep, match="'a' is not a recorded step of execution 'fresh' \\(it has recorded no"
                                          " step\\)"):
        backend.executions.fork("fresh", "f", from_step="a")
    assert backend.executions.get("f") is None
