"""Messages and events in the ledger (SPEC section 14), on both backends: sends kept in order per
(execution, topic) and idempotent by id, each message taken by exactly one step, fenced by the
delivery's token; a waiting execution woken by the send's commit; events whose value is the last
one set; bad input that writes nothing; purge taking them with their execution."""

from __future__ import annotations

import threading

import pytest

from supervisor import Completed, ExecutionConflict, LeaseLost, Suspended, UnknownExecution, open_backend
from supervisor.ledger.errors import InvalidArgument, PayloadTooLarge
from supervisor.ledger.values import WaitReason

LEASE_MS = 30_000


def claim(backend, execution_id, *, now=None):
    (lease,) = backend.executions.claim_due(limit=1, duration=LEASE_MS, now=now)
    assert lease.execution_id == execution_id, lease
    return lease


@pytest.mark.timeout(60)
def test_messages_are_taken_in_the_order_sent_per_topic_and_a_repeated_id_adds_nothing(backend):
    backend.executions.admit("order-1", "order")
    sent = [("approval", "a1", '"yes"'), ("notes", "n1", '"first note"'), ("approval", "a2", '"no"'),
            ("notes", "n2", '{"n": 2}'), ("approval", "a1", '"a repeat: ignored"')]
    added = [backend.messages.send("order-1", text, topic=topic, message_id=mid)[1] for topic, mid, text in sent]
    assert added == [True, True, True, True, False]
    assert backend.messages.pending("order-1") == {"approval": 2, "notes": 2}
    lease = claim(backend, "order-1")
    taken = [backend.messages.take(lease, topic, step_key=key).message_json
             for topic, key in [("notes", "s1"), ("approval", "s2"), ("approval", "s3"), ("notes", "s4")]]
    assert taken == ['"first note"', '"yes"', '"no"', '{"n": 2}']
    assert backend.messages.take(lease, "approval", step_key="s5") is None
    assert backend.messages.pending("order-1") == {}
    # A step's receipt: asked again (a replay, a later holder), the step gets its message again.
    assert backend.messages.take(lease, "notes", step_key="s1").message_json == '"first note"'
    assert [(m.message_id, m.seq, m.taken_step) for m in backend.messages.list("order-1")] == [
        ("a1", 1, "s2"), ("n1", 2, "s1"), ("a2", 3, "s3"), ("n2", 4, "s4")]


@pytest.mark.timeout(60)
def test_a_repeated_send_after_the_execution_ended_answers_as_the_first_did(backend):
    """A sender that lost the first answer and retries after the workflow took the message and
    completed is told what the first send was told, not that the execution is terminal."""
    backend.executions.admit("order-1", "order")
    first, added = backend.messages.send("order-1", '"yes"', topic="approval", message_id="a1")
    assert added
    lease = claim(backend, "order-1")
    assert backend.messages.take(lease, "approval", step_key="s1").message_id == "a1"
    backend.executions.acknowledge(lease, Completed("1"))
    again, added = backend.messages.send("order-1", '"yes"', topic="approval", message_id="a1")
    assert not added
    assert (again.message_id, again.seq, again.message_json, again.taken_step) == ("a1", first.seq, '"yes"', "s1")
    with pytest.raises(ExecutionConflict, match="completed"):
        backend.messages.send("order-1", '"yes"', topic="approval", message_id="a2")  # a new one is refused
    assert [m.message_id for m in backend.messages.list("order-1")] == ["a1"]


@pytest.mark.timeout(60)
def test_a_take_is_fenced_by_the_token_and_a_later_holder_gets_the_same_message(backend, clock):
    backend.executions.admit("order-1", "order")
    backend.messages.send("order-1", '"one"', message_id="m1")
    backend.messages.send("order-1", '"two"', message_id="m2")
    stale = claim(backend, "order-1")
    assert backend.messages.take(stale, "default", step_key="recv-1").message_id == "m1"
    clock.advance(LEASE_MS * 3)  # the holder crashed after taking, before recording its step
    current = claim(backend, "order-1")
    assert isinstance(backend.messages.take(stale, "default", step_key="recv-2"), LeaseLost)
    assert isinstance(backend.events.set(stale, "status", '"stale"'), LeaseLost)
    assert backend.messages.take(current, "default", step_key="recv-1").message_id == "m1"
    assert backend.messages.take(current, "default", step_key="recv-2").message_id == "m2"
    assert backend.events.get("order-1", "status") is None


@pytest.mark.timeout(120)
def test_two_racing_takers_take_each_message_exactly_once(each_backend, clock):
    with open_backend(each_backend, clock=clock) as setup:
        setup.executions.admit("order-1", "order")
        for i in range(60):
            setup.messages.send("order-1", str(i), message_id=f"m{i}")
        lease = claim(setup, "order-1")
    got: dict[str, list[str]] = {"a": [], "b": []}
    start = threading.Barrier(2)

    def taker(name: str) -> None:
        with open_backend(each_backend, clock=clock) as mine:
            start.wait()
            n = 0
            while True:
                n += 1
                message = mine.messages.take(lease, "default", step_key=f"{name}-{n}")
                if message is None:
                    return
                got[name].append(message.message_id)

    threads = [threading.Thread(target=taker, args=(name,)) for name in got]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(100)
    everything = got["a"] + got["b"]
    assert sorted(everything) == sorted(f"m{i}" for i in range(60))
    assert len(set(everything)) == 60
    for name in got:  # each taker took its share in the order sent
        assert got[name] == sorted(got[name], key=lambda mid: int(mid[1:]))


@pytest.mark.timeout(60)
def test_a_send_wakes_the_execution_waiting_for_a_message(backend, clock):
    backend.executions.admit("order-1", "order")
    lease = claim(backend, "order-1")
    assert backend.messages.take(lease, "approval", step_key="recv") is None
    assert backend.messages.wait("order-1", "approval") is False
    backend.executions.acknowledge(lease, Suspended())
    assert backend.executions.get("order-1").due_at is None
    assert backend.executions.waiting_for("order-1") == [WaitReason("message", "order-1", None, "approval")]
    backend.messages.send("order-1", '"yes"', topic="approval", message_id="m1")
    assert backend.executions.get("order-1").due_at == clock.now
    lease = claim(backend, "order-1")
    assert backend.messages.take(lease, "approval", step_key="recv").message_json == '"yes"'
    # With a message pending, a wait registers nothing and says so.
    backend.messages.send("order-1", '"again"', topic="approval", message_id="m2")
    assert backend.messages.wait("order-1", "approval") is True


@pytest.mark.timeout(60)
def test_an_event_holds_the_last_value_set(backend, clock):
    backend.executions.admit("order-1", "order")
    lease = claim(backend, "order-1")
    assert backend.events.get("order-1", "status") is None
    backend.events.set(lease, "status", '"paid"')
    clock.advance(5)
    backend.events.set(lease, "status", '{"shipped": true}')
    backend.events.set(lease, "progress", "0.5")
    assert backend.events.get("order-1", "status").value_json == '{"shipped": true}'
    assert [(e.key, e.value_json) for e in backend.events.list("order-1")] == [("progress", "0.5"),
                                                                                ("status", '{"shipped": true}')]


@pytest.mark.timeout(60)
def test_a_send_to_an_unknown_or_terminal_execution_and_bad_input_write_nothing(backend, each_backend,
                                                                                  db_snapshot):
    backend.executions.admit("order-1", "order")
    backend.executions.admit("order-2", "order")
    backend.executions.acknowledge(claim(backend, "order-1"), Completed("1"))
    before = db_snapshot(each_backend)
    with pytest.raises(UnknownExecution, match="no-such"):
        backend.messages.send("no-such", '"x"', message_id="m1")
    with pytest.raises(ExecutionConflict, match="completed"):
        backend.messages.send("order-1", '"x"', message_id="m1")
    bad = [({"message_json": "{not json"}, InvalidArgument, "message is not valid JSON"),
           ({"message_json": "NaN"}, InvalidArgument, "message is not valid JSON"),
           ({"topic": ""}, InvalidArgument, "topic must not be empty"),
           ({"topic": "t" * 256}, InvalidArgument, "topic is 256 characters long"),
           ({"message_id": ""}, InvalidArgument, "message id must not be empty"),
           ({"message_id": "m" * 256}, InvalidArgument, "message id is 256 characters long"),
           ({"message_json": '"' + "x" * (backend.max_payload_bytes + 1) + '"'}, PayloadTooLarge, "message")]
    for change, error, match in bad:
        arguments = {"message_json": '"x"', "topic": "default", "message_id": "m1", **change}
        with pytest.raises(error, match=match):
            backend.messages.send("order-2", arguments.pop("message_json"), **arguments)
    lease = claim(backend, "order-2")
    with pytest.raises(InvalidArgument, match="event key must not be empty"):
        backend.events.set(lease, "", '"x"')
    with pytest.raises(InvalidArgument, match="not valid JSON"):
        backend.events.set(lease, "status", "{")
    after = db_snapshot(each_backend)
    changed = {table for table in set(before) | set(after) if before.get(table) != after.get(table)}
    assert changed <= {"executions", "lease_history"}  # the claim's, and nothing else
    assert backend.messages.list("order-2") == [] and backend.events.list("order-2") == []


@pytest.mark.timeout(60)
def test_purge_removes_an_executions_messages_and_events_with_it(backend, clock):
    for eid in ("old-done", "still-running"):
        backend.executions.admit(eid, "order")
        backend.messages.send(eid, '"m"', message_id="m1")
        backend.messages.send(eid, '"n"', message_id="m2")
    lease = claim(backend, "old-done")
    backend.messages.take(lease, "default", step_key="recv")
    backend.events.set(lease, "status", '"done"')
    backend.executions.acknowledge(lease, Completed("1"))
    other = claim(backend, "still-running")
    backend.events.set(other, "status", '"running"')
    clock.advance(60_000)
    assert backend.executions.purge(before=clock.now) == 1
    for table in ("messages", "events"):
        owners = {row[0] for row in backend.connection.execute(f"SELECT execution_id FROM {table}").fetchall()}
        assert owners == {"still-running"}, table
