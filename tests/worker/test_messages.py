"""Talking to a running workflow (SPEC section 14): `client.send` to a waiting `ctx.recv`, and
`ctx.set_event` read from outside with `client.get_event`.

A real supervisor runs the workflows of `tests/apps/messages_app.py` in its own process; the
client is the test process, as an application would be. The supervisors poll the ledger only
every SLOW_POLL_MS and the clients every NEVER_POLL_S, both longer than any deadline below: a
wait these tests see end was woken by the commit of the send or of the set."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time

import pytest

from faults import TESTS, wait_until
from supervisor import ExecutionConflict
from supervisor.ledger.errors import InvalidArgument, UnknownExecution
from worker import AsyncClient, Client

pytestmark = pytest.mark.usefixtures("dump_on_hang")

APP = str(TESTS / "apps" / "messages_app.py")
NEVER_POLL_S = 600.0
SLOW_POLL_MS = 20_000


def suspended(handle) -> bool:
    return handle.status() == "suspended"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("workflow", ["msg.approval", "msg.approval_async"])
def test_an_approval_workflow_waits_for_a_send_and_is_woken_by_it(each_backend, supervisors, workflow):
    supervisors.start(each_backend, app=APP, poll_ms=SLOW_POLL_MS)
    with Client(each_backend, poll_s=NEVER_POLL_S) as client:
        handle = client.start(workflow, None, id="order-7")
        # Read from outside while the workflow waits: woken by the commit of the set.
        assert handle.get_event("status", timeout=20) == "waiting for approval"
        wait_until(lambda: suspended(handle))
        assert client.backend.messages.pending("order-7") == {}
        assert handle.send({"verdict": "approved", "by": "ana"}, topic="approval", id="approve-7") == "approve-7"
        assert handle.result(timeout=10) == {"verdict": "approved", "by": "ana"}
        assert client.get_event("order-7", "status") == "approved"
        [message] = client.backend.messages.list("order-7")
        assert message.taken_step == "@2:recv:approval" and message.topic == "approval"


@pytest.mark.timeout(90)
def test_get_event_waits_for_a_key_not_yet_set_and_is_woken_by_the_set(each_backend, supervisors):
    supervisors.start(each_backend, app=APP, poll_ms=SLOW_POLL_MS)
    with Client(each_backend, poll_s=NEVER_POLL_S) as client:
        handle = client.start("msg.approval", None)
        seen: list = []
        # Waiting from several threads before the workflow runs: each woken by the one set.
        readers = [threading.Thread(target=lambda: seen.append(handle.get_event("status", timeout=30)))
                   for _ in range(3)]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(30)
        assert seen == ["waiting for approval"] * 3
        started = time.monotonic()
        assert handle.get_event("never-set", timeout=0.3) is None
        assert 0.3 <= time.monotonic() - started < 5
        assert handle.get_event("never-set") is None  # timeout 0: a look, no wait

        async def from_asyncio() -> list:
            async with AsyncClient(each_backend, poll_s=NEVER_POLL_S) as aclient:
                ahandle = await aclient.handle(handle.execution_id)
                now = await ahandle.get_event("status")
                await ahandle.send({"verdict": "rejected"}, topic="approval")
                later = await aclient.get_event(handle.execution_id, "decided", timeout=0.2)
                return [now, later, await ahandle.result(timeout=20)]

        assert asyncio.run(from_asyncio()) == ["waiting for approval", None, {"verdict": "rejected"}]
        wait_until(lambda: handle.get_event("status") == "rejected")


@pytest.mark.timeout(90)
def test_a_duplicate_send_is_taken_once_and_messages_are_taken_in_the_order_sent(each_backend, supervisors):
    supervisors.start(each_backend, app=APP, poll_ms=SLOW_POLL_MS)
    with Client(each_backend, poll_s=NEVER_POLL_S) as client:
        handle = client.start("msg.collect", None)
        for item, message_id in [("first", "m1"), ("first", "m1"), ("second", "m2"), ("first", "m1"),
                                 ("end", "m3")]:
            assert client.send(handle.execution_id, item, id=message_id) == message_id
        assert handle.result(timeout=20) == ["first", "second", "end"]
        messages = client.backend.messages.list(handle.execution_id)
        assert [(m.message_id, m.seq) for m in messages] == [("m1", 1), ("m2", 2), ("m3", 3)]
        assert len({m.taken_step for m in messages}) == 3
        # The execution is over: nothing would take another message.
        with pytest.raises(ExecutionConflict, match="completed"):
            handle.send("late")
        with pytest.raises(UnknownExecution):
            client.send("no-such-execution", "hello")
        with pytest.raises(InvalidArgument, match="message is not JSON-serialisable"):
            client.send(handle.execution_id, {1, 2})
        with pytest.raises(InvalidArgument, match="topic"):
            client.send(handle.execution_id, "x", topic="")
        with pytest.raises(InvalidArgument, match="id is 300 characters long"):
            client.send(handle.execution_id, "x", id="m" * 300)
        assert len(client.backend.messages.list(handle.execution_id)) == 3


@pytest.mark.timeout(90)
@pytest.mark.parametrize("workflow", ["msg.timeout", "msg.timeout_async"])
def test_a_recv_with_a_timeout_returns_none_once_the_time_has_passed(each_backend, supervisors, workflow):
    supervisors.start(each_backend, app=APP, poll_ms=SLOW_POLL_MS)
    with Client(each_backend, poll_s=NEVER_POLL_S) as client:
        started = time.monotonic()
        handle = client.start(workflow, 1.0)
        assert handle.result(timeout=20) == {"got": None}
        assert 1.0 <= time.monotonic() - started < 10
        keys = [step.step_key for step in client.backend.heap.steps(handle.execution_id)]
        assert keys == ["@1:recv-deadline:nobody-sends-here", "@2:recv:nobody-sends-here"]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


@pytest.mark.timeout(180)
def test_send_to_wake_latency_beside_result_latency(each_backend, supervisors):
    """30 sends, each to a workflow suspended in `recv`: from the send to the step that runs
    once the message is taken; and 30 results: from an execution's last step to `result()`
    returning. Printed as p50/p99 (run with -s to see them)."""
    rounds = 30
    supervisors.start(each_backend, app=APP, poll_ms=SLOW_POLL_MS)
    with Client(each_backend, poll_s=NEVER_POLL_S) as client:
        handle = client.start("msg.ping", rounds)
        sends = []
        for i in range(rounds):
            wait_until(lambda: suspended(handle))
            sent_at = time.time()
            handle.send(i)
            woke_at = handle.get_event(f"woke-{i}", timeout=10)
            assert woke_at is not None, f"message {i} did not wake the workflow within 10 s"
            sends.append(woke_at - sent_at)
        assert handle.result(timeout=20) == rounds
        results = []
        for _ in range(rounds):
            stamp = client.start("msg.stamp").result(timeout=20)
            results.append(time.time() - stamp)
    figures = {name: (percentile(values, 50) * 1000, percentile(values, 99) * 1000)
               for name, values in [("send-to-wake", sends), ("result", results)]}
    for name, (p50, p99) in figures.items():
        print(f"{each_backend!s:.10}: {name}: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
    # Far below the supervisors' poll (20 s): the send's commit woke the workflow.
    assert figures["send-to-wake"][1] < 2000
    assert statistics.median(sends) < 1.0


@pytest.mark.timeout(120)
def test_a_worker_killed_after_taking_a_message_replays_the_same_message_and_takes_the_next(
        each_backend, supervisors, tmp_path):
    marker = tmp_path / "killed"
    supervisors.start(each_backend, app=APP, poll_ms=SLOW_POLL_MS)
    with Client(each_backend, poll_s=NEVER_POLL_S) as client:
        handle = client.start("msg.crash_after_recv", str(marker))
        wait_until(lambda: suspended(handle))
        handle.send("first", id="m1")
        wait_until(marker.exists, timeout=30)
        handle.send("second", id="m2")
        assert handle.result(timeout=60) == ["first", "second"]
        messages = client.backend.messages.list(handle.execution_id)
        assert [(m.message_id, m.taken_step) for m in messages] == [("m1", "@1:recv:default"),
                                                                    ("m2", "@2:recv:default")]
        assert client.backend.executions.get(handle.execution_id).token >= 3  # a delivery was lost
