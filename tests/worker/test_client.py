"""The application client (SPEC section 9): start workflows and wait for their results.

The supervisor runs in its own process; the client is the test process, as an application
would be. Waits are woken by the commit that ends the execution: the tests that show it give the
client a slow poll far longer than their deadlines, so only the announcement can wake it."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time

import pytest

from faults import TESTS, cli, query, wait_until
from supervisor import ExecutionConflict, open_backend
from supervisor.ledger.errors import NoLedger, UnknownEffect, UnknownExecution
from supervisor.ledger.sqlite.nudge import outcomes_dir
from supervisor.ledger.values import SettleConflict
from worker import AsyncClient, Client, Registry, WorkflowCancelled, WorkflowFailed

pytestmark = pytest.mark.usefixtures("dump_on_hang")

APP = str(TESTS / "apps" / "client_app.py")
NEVER_POLL_S = 600.0  # longer than any test: a wait these tests see end was woken by an announcement


def rows(db) -> list[tuple]:
    return [tuple(row) for row in query(db, "SELECT execution_id, workflow, input_json, status"
                                                      " FROM executions ORDER BY execution_id")]


def waiters(client, execution_id: str) -> int:
    """How many of the client's result() calls are registered to be woken for `execution_id`."""
    watch = client._watch
    return 0 if watch is None else len(watch._waiters.get(execution_id, {}))


def tell_when_read(client: Client) -> threading.Event:
    """An event set once the client has read an execution's record (a waiter's first look)."""
    read, get = threading.Event(), client.backend.executions.get

    def get_and_tell(execution_id):
        record = get(execution_id)
        read.set()
        return record

    client.backend.executions.get = get_and_tell
    return read


# -- across processes, with a real supervisor -----------------------------------------------------

@pytest.mark.timeout(60)
def test_start_and_result_across_processes(each_backend, supervisors):
    supervisors.start(each_backend, app=APP)
    with Client(each_backend, poll_s=NEVER_POLL_S) as client:
        handle = client.start("cl.echo", {"order_id": 42, "items": ["tea", None]}, id="order-42")
        assert handle.execution_id == "order-42"
        assert handle.result(timeout=20) == {"order_id": 42, "items": ["tea", None]}
        assert handle.status() == "completed"
        generated = client.start("cl.echo", 7)
        assert generated.result(timeout=20) == 7
        assert generated.execution_id != "order-42" and len(generated.execution_id) == 32


@pytest.mark.timeout(60)
def test_the_result_of_a_failed_execution_is_its_recorded_error(each_backend, supervisors):
    supervisors.start(each_backend, app=APP)
    with Client(each_backend, poll_s=NEVER_POLL_S) as client:
        handle = client.start("cl.fail", {"order_id": 42})
        with pytest.raises(WorkflowFailed) as failed:
            handle.result(timeout=20)
    error = failed.value.error
    assert failed.value.execution_id == handle.execution_id
    assert error["type"] == "StepFailed"
    assert "order 42 cannot be charged" in error["message"]
    assert "ValueError: order 42 cannot be charged" in error["traceback"]
    assert "order 42 cannot be charged" in str(failed.value)


@pytest.mark.timeout(60)
def test_a_waiting_result_is_woken_by_a_cancellation_from_another_process(each_backend, supervisors, tmp_path):
    supervisors.start(each_backend, app=APP)
    with Client(each_backend, poll_s=NEVER_POLL_S) as client:
        handle = client.start("cl.gated", {"gate": str(tmp_path / "never"), "value": 1})
        wait_until(lambda: handle.status() == "running")
        outcome: list[BaseException] = []

        def wait() -> None:
            try:
                handle.result(timeout=30)
            except BaseException as exc:  # noqa: BLE001 - the outcome under test
                outcome.append(exc)

        waiter = threading.Thread(target=wait)
        waiter.start()
        done = cli(each_backend, "cancel", handle.execution_id, "--reason", "the customer changed their mind")
        assert done.returncode == 0, done.stderr
        waiter.join(20)
        assert not waiter.is_alive(), "the cancellation did not wake the waiting result()"
    assert isinstance(outcome[0], WorkflowCancelled)
    assert outcome[0].reason == "the customer changed their mind"


@pytest.mark.timeout(90)
def test_many_waiters_in_threads_and_tasks_are_woken_by_the_one_commit_that_ends_the_execution(
        each_backend, supervisors, tmp_path):
    gate = tmp_path / "gate"
    supervisors.start(each_backend, app=APP)
    results: list = []
    with Client(each_backend, poll_s=NEVER_POLL_S) as client:
        handle = client.start("cl.gated", {"gate": str(gate), "value": "shipped"})
        threads = [threading.Thread(target=lambda: results.append(handle.result(timeout=60))) for _ in range(40)]
        for thread in threads:
            thread.start()

        async def tasks() -> list:
            async with AsyncClient(each_backend, poll_s=NEVER_POLL_S) as aclient:
                ahandle = await aclient.handle(handle.execution_id)
                waiting = [asyncio.ensure_future(ahandle.result(timeout=60)) for _ in range(40)]
                deadline = time.monotonic() + 20
                while waiters(aclient, handle.execution_id) < 40:  # every task registered, before the gate
                    assert time.monotonic() < deadline, "the 40 tasks did not all register as waiters"
                    await asyncio.sleep(0.01)
                wait_until(lambda: waiters(client, handle.execution_id) == 40)  # every thread too
                assert not any(task.done() for task in waiting)
                gate.touch()
                return await asyncio.gather(*waiting)

        from_tasks = asyncio.run(tasks())
        for thread in threads:
            thread.join(20)
        assert not any(thread.is_alive() for thread in threads)
    assert from_tasks == ["shipped"] * 40
    assert results == ["shipped"] * 40


@pytest.mark.timeout(60)
def test_a_missed_announcement_is_made_up_for_by_the_slow_poll(sqlite_path, supervisors, tmp_path):
    gate, db = tmp_path / "gate", sqlite_path
    supervisors.start(db, app=APP)
    with Client(db, poll_s=0.2) as client:
        handle = client.start("cl.gated", {"gate": str(gate), "value": 3})
        waiting: list = []
        read = tell_when_read(client)
        waiter = threading.Thread(target=lambda: waiting.append(handle.result(timeout=30)))
        waiter.start()
        assert read.wait(10)  # it found the execution not yet ended, and waits
        folder = outcomes_dir(str(db))
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))  # nobody can tell this client any more
        gate.touch()
        waiter.join(20)
    assert waiting == [3]


@pytest.mark.timeout(30)
def test_an_execution_purged_while_its_result_is_awaited_is_unknown(sqlite_path):
    db = sqlite_path
    with Client(db, poll_s=0.2) as client:
        handle = client.start("cl.echo", 1)  # no supervisor runs it
        folder = outcomes_dir(str(db))
        client._watching()
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))  # it learns of the end only by polling, too late
        read = tell_when_read(client)
        raised: list = []

        def wait() -> None:
            try:
                handle.result(timeout=20)
            except UnknownExecution as exc:
                raised.append(exc)

        waiter = threading.Thread(target=wait)
        waiter.start()
        assert read.wait(10)  # it found the execution not yet ended, and waits
        with open_backend(db) as backend:
            backend.executions.cancel(handle.execution_id)
            assert backend.executions.purge(before=backend.clock() + 1) == 1
        waiter.join(15)
    assert "was purged while its result was awaited" in str(raised[0])


@pytest.mark.timeout(60)
def test_result_times_out_naming_the_status(each_backend, supervisors, tmp_path):
    supervisors.start(each_backend, app=APP)
    with Client(each_backend) as client:
        handle = client.start("cl.gated", {"gate": str(tmp_path / "never"), "value": 1})
        started = time.monotonic()
        with pytest.raises(TimeoutError, match=r"not finished within 0.5 s \(it is (admitted|running)\)"):
            handle.result(timeout=0.5)
        assert 0.5 <= time.monotonic() - started < 5
        handle.cancel()


# -- async ----------------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_the_async_client_starts_and_waits_without_blocking_its_event_loop(each_backend, supervisors, tmp_path):
    gate = tmp_path / "gate"
    supervisors.start(each_backend, app=APP)

    async def main() -> tuple:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        async with AsyncClient(each_backend, poll_s=NEVER_POLL_S) as client:
            tick = asyncio.ensure_future(ticker())
            handle = await client.start("cl.gated", {"gate": str(gate), "value": {"ok": True}}, id="async-1")
            assert await handle.status() in ("admitted", "running")
            waiting = asyncio.ensure_future(handle.result(timeout=30))
            await asyncio.sleep(0.3)  # result() waits a while, meanwhile the ticker should tick: held, not a wait
            before = ticks
            gate.touch()
            result = await waiting
            tick.cancel()
            echo = await (await client.start("cl.echo", [1, 2])).result(timeout=20)
            with pytest.raises(WorkflowFailed):
                await (await client.start("cl.fail", {"order_id": 1})).result(timeout=20)
            return result, before, echo

    result, ticks_before_the_gate, echo = asyncio.run(main())
    assert result == {"ok": True} and echo == [1, 2]
    assert ticks_before_the_gate >= 10, "the event loop was blocked while result() waited"


@pytest.mark.timeout(30)
def test_async_result_times_out(each_backend):
    async def main() -> None:
        async with AsyncClient(each_backend) as client:
            handle = await client.start("cl.echo", 1)  # no supervisor runs it
            with pytest.raises(TimeoutError, match="it is admitted"):
                await handle.result(timeout=0.3)

    asyncio.run(main())


# -- starting: idempotency and bad input ---------------------------------------------------------

@pytest.mark.timeout(30)
def test_start_is_idempotent_by_id_and_refuses_a_different_workflow_or_input(each_backend):
    with Client(each_backend) as client:
        first = client.start("cl.echo", {"a": 1}, id="order-1")
        again = client.start("cl.echo", {"a": 1}, id="order-1")
        assert again.execution_id == first.execution_id == "order-1"
        before = rows(each_backend)
        with pytest.raises(ExecutionConflict, match="order-1"):
            client.start("cl.echo", {"a": 2}, id="order-1")
        with pytest.raises(ExecutionConflict, match="order-1"):
            client.start("cl.fail", {"a": 1}, id="order-1")
        assert rows(each_backend) == before == [("order-1", "cl.echo", '{"a":1}', "admitted")]


@pytest.mark.timeout(30)
def test_start_takes_the_decorated_function_and_checks_names_against_a_registry(each_backend):
    registry = Registry()

    @registry.workflow("shop.order")
    def order(ctx, input):  # pragma: no cover - never run here
        return input

    with Client(each_backend, registry=registry) as client:
        assert client.start(order, {"order_id": 42}).workflow == "shop.order"
        before = rows(each_backend)
        with pytest.raises(ValueError, match=r"no workflow is registered as 'shop.ordr' \(registered: shop.order\)"):
            client.start("shop.ordr", {})
        assert rows(each_backend) == before


@pytest.mark.timeout(30)
@pytest.mark.parametrize("call, message", [
    (lambda c: c.start("cl.echo", {"when": object()}), "input is not JSON-serialisable"),
    (lambda c: c.start("cl.echo", float("nan")), "input is not JSON-serialisable"),
    (lambda c: c.start(lambda ctx, input: None), "decorated with @workflow"),
    (lambda c: c.start("", 1), "workflow must not be empty"),
    (lambda c: c.start("cl.echo", 1, id=""), "id must not be empty"),
    (lambda c: c.start("cl.echo", 1, id=42), "id must be a str"),
    (lambda c: c.handle("nobody"), "no execution 'nobody'"),
    (lambda c: c.handle("existing").result(timeout=-1), "timeout must be None or a number of seconds >= 0"),
    (lambda c: c.settle("nobody's effect", 1), "no execution has begun effect"),
    (lambda c: c.put("mailbox", {1, 2}), "item is not JSON-serialisable"),
], ids=["not JSON", "NaN", "undecorated function", "empty name", "empty id", "id not a str", "unknown id",
        "negative timeout", "unknown effect", "item not JSON"])
def test_bad_input_is_a_value_error_naming_it_and_changes_nothing(each_backend, call, message):
    with Client(each_backend) as client:
        client.start("cl.echo", 0, id="existing")
        before = rows(each_backend)
        with pytest.raises(ValueError, match=message):
            call(client)
        assert rows(each_backend) == before


@pytest.mark.timeout(30)
def test_handle_of_an_unknown_execution_is_unknown_execution(each_backend):
    with Client(each_backend) as client, pytest.raises(UnknownExecution):
        client.handle("missing")


@pytest.mark.timeout(30)
def test_settle_and_put_for_outside_systems(each_backend):
    with Client(each_backend) as client:
        state = client.settle("payment-1", {"paid": True}, create=True)
        assert json.loads(state.result_json) == {"paid": True}
        conflict = client.settle("payment-1", {"paid": False})
        assert isinstance(conflict, SettleConflict) and json.loads(conflict.kept_result_json) == {"paid": True}
        assert client.put("mailbox", {"n": 1}) == [{"n": 1}]
        assert client.put("mailbox", {"n": 2}) == [{"n": 1}, {"n": 2}]
    with open_backend(each_backend) as backend:
        assert json.loads(backend.stores.get("mailbox").state_json) == [{"n": 1}, {"n": 2}]


@pytest.mark.timeout(30)
def test_start_json_and_settle_json_record_the_text_as_given(each_backend):
    with Client(each_backend) as client:
        handle = client.start_json("cl.echo", '{"b":  1, "a": [2]}', id="as-given")
        assert client.start_json("cl.echo", '{"a": [2], "b": 1}', id="as-given").execution_id == "as-given"
        with pytest.raises(ExecutionConflict):
            client.start_json("cl.echo", '{"a": [3]}', id="as-given")
        with pytest.raises(UnknownEffect, match="pass create=True"):
            client.settle_json("payment-2", '{"paid":  true}')
        state = client.settle_json("payment-2", '{"paid":  true}', create=True)
        assert handle.record().input_json == '{"b":  1, "a": [2]}' and state.result_json == '{"paid":  true}'


@pytest.mark.timeout(30)
def test_a_client_asked_not_to_create_finds_no_ledger_and_creates_none(tmp_path):
    with pytest.raises(NoLedger):
        Client(tmp_path / "ledger.db", create=False)
    assert not (tmp_path / "ledger.db").exists()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("options, message", [({"listen": "no"}, "listen must be a bool"),
                                              ({"poll_s": 0}, "poll_s must be a number of seconds > 0")])
def test_bad_client_options_are_a_value_error_naming_them_and_create_no_ledger(tmp_path, options, message):
    with pytest.raises(ValueError, match=message):
        Client(tmp_path / "ledger.db", **options)
    assert not (tmp_path / "ledger.db").exists()


# -- fork -------------------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_fork_refusals_name_the_clients_arguments_and_write_nothing(each_backend, db_snapshot):
    from supervisor import Completed, InvalidArgument
    from worker import UnknownStep

    with Client(each_backend) as client:
        original = client.start("cl.echo", {"order_id": 1}, id="order-1")
        (lease,) = client.backend.executions.claim_due(limit=1, duration=30_000)
        client.backend.heap.write_step(lease, step_key="a", step_attempt=1, done=True, step_response_json="1")
        client.backend.executions.acknowledge(lease, Completed("1"))
        client.start("cl.echo", None, id="taken")
        before = db_snapshot(each_backend)
        refusals = [
            (lambda: original.fork(from_step="a", id="taken"), ExecutionConflict, "id 'taken' is taken"),
            (lambda: client.fork("order-1", from_step="b"), UnknownStep,
             "from_step 'b' is not a recorded step of execution 'order-1' (its recorded steps: 'a')"),
            (lambda: client.fork("nobody", from_step="a"), UnknownExecution, "'nobody'"),
            (lambda: client.fork("order-1", from_step="a", id=" "), InvalidArgument, "id ' ' is blank"),
            (lambda: client.fork("order-1", from_step=None), InvalidArgument, "from_step must be a str"),
        ]
        for call, error, message in refusals:
            with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
                call()
        assert db_snapshot(each_backend) == before

    async def refused():
        async with AsyncClient(each_backend) as aclient:
            with pytest.raises(ExecutionConflict, match="id 'taken' is taken"):
                await aclient.fork("order-1", from_step="a", id="taken")
            with pytest.raises(UnknownStep):
                await (await aclient.handle("order-1")).fork(from_step="b")

    asyncio.run(refused())
    assert db_snapshot(each_backend) == before
