"""A workflow's `ctx` used after its delivery ended (issue 34): every call raises `DeliveryEnded`,
naming the execution and the token, and nothing of the ledger changes.

The workflows keep their context (and a store handle) in a dict, as a module global would; the
delivery runs in-process (`worker.testing.run_workflow`) against a real SQLite ledger, and each
operation is then tried on the kept context, sync and async. The supervised cases (a later
delivery in the same worker, a thread, a task of the worker's event loop) are in
tests/supervisor/test_ended_context_supervised.py.
"""

from __future__ import annotations

import asyncio
import inspect

import pytest

from supervisor import open_backend
from worker import DeliveryEnded, Registry, YieldstarError
from worker.testing import run_workflow

registry = Registry()
kept: dict = {}
ran: list = []  # what the step functions given to a kept context did: nothing, ever


def late(*args):
    ran.append(args)
    return "late"


async def late_async(*args):
    ran.append(args)
    return "late"


@registry.workflow("keeps-ctx")
def keeps_ctx(ctx, input):
    kept["sync"], kept["sync stores"] = ctx, {"books": ctx.store("books"), "box": ctx.store("box")}
    ctx.run("first", lambda: 1)
    kept["sync stores"]["books"].get_or_create("books", {})
    kept["sync stores"]["box"].get_or_create("box", ["item"])
    return "done"


@registry.workflow("keeps-async-ctx")
async def keeps_async_ctx(ctx, input):
    kept["async"], kept["async stores"] = ctx, {"books": ctx.store("books"), "box": ctx.store("box")}
    await ctx.run("first", lambda: 1)
    await kept["async stores"]["books"].get_or_create("books", {})
    await kept["async stores"]["box"].get_or_create("box", ["item"])
    return "done"


# Every operation of the context (and of its store handles), each given what it needs to write if
# it were let: a step new to the execution, or, for `run` of "first", one recorded (a replay).
# Before `DeliveryEnded`, a start made its child, an effect began, a step function ran, and a
# refused write raised `StopDelivery` into whatever code made the call.
OPERATIONS = {
    "run": lambda ctx, stores, fn: ctx.run("late", fn),
    "run unnamed": lambda ctx, stores, fn: ctx.run(fn),
    "run of a recorded step": lambda ctx, stores, fn: ctx.run("first", fn),
    "sleep": lambda ctx, stores, fn: ctx.sleep("nap", 1),
    "sleep_until": lambda ctx, stores, fn: ctx.sleep_until("nap", 2_000_000_000),
    "start": lambda ctx, stores, fn: ctx.start("child", "keeps-ctx"),
    "wait_for": lambda ctx, stores, fn: ctx.wait_for("keeps-ctx"),
    "effect": lambda ctx, stores, fn: ctx.effect("charge", fn),
    "external effect": lambda ctx, stores, fn: ctx.effect("ask", late, external=True),
    "parallel": lambda ctx, stores, fn: ctx.parallel("fan", fn, [1, 2]),
    "patched": lambda ctx, stores, fn: ctx.patched("fix-1"),
    "now_ms": lambda ctx, stores, fn: ctx.now_ms(),
    "store": lambda ctx, stores, fn: ctx.store("books"),
    "store get_or_create": lambda ctx, stores, fn: stores["books"].get_or_create("reopen", {}),
    "store update": lambda ctx, stores, fn: stores["books"].update("add", lambda state: {**state, "n": 1}),
    "store update_from": lambda ctx, stores, fn: stores["books"].update_from("merge", {"n": 1}),
    "store delete_from": lambda ctx, stores, fn: stores["books"].delete_from("drop", ["n"]),
    "store take": lambda ctx, stores, fn: stores["box"].take("take", wait=False),
}


@pytest.fixture
def ended_ledger(sqlite_path, clock):
    """The ledger after one delivery of each workflow above, both completed: (backend, path)."""
    kept.clear()
    ran.clear()
    with open_backend(sqlite_path, clock=clock, redelivery_delay=lambda n: 1) as backend:
        for workflow in ("keeps-ctx", "keeps-async-ctx"):
            record = run_workflow(registry, workflow, execution_id=workflow, backend=backend, clock=clock)
            assert record.status == "completed", record
        yield backend


@pytest.mark.timeout(30)
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_every_operation_of_a_context_whose_delivery_ended_raises_delivery_ended_and_writes_nothing(
        ended_ledger, sqlite_path, db_snapshot, operation, asynchronous):
    which = "async" if asynchronous else "sync"
    ctx, stores = kept[which], kept[f"{which} stores"]
    before = db_snapshot(sqlite_path)

    with pytest.raises(DeliveryEnded) as raised:
        called = OPERATIONS[operation](ctx, stores, late_async if asynchronous else late)
        if inspect.isawaitable(called):
            asyncio.run(called)

    execution_id = "keeps-async-ctx" if asynchronous else "keeps-ctx"
    message = str(raised.value)
    assert f"delivery of execution {execution_id!r} under token 1 has ended" in message, message
    assert "don't keep a ctx beyond its workflow function" in message, message
    assert "threads or tasks that outlive the step" in message, message
    assert (raised.value.execution_id, raised.value.token) == (execution_id, 1)
    assert ran == []
    assert db_snapshot(sqlite_path) == before
    assert [step.step_key for step in ended_ledger.heap.steps(execution_id)] == ["first", "books", "box"]


@pytest.mark.timeout(10)
def test_delivery_ended_is_a_yieldstar_runtime_error_and_no_step_failure():
    error = DeliveryEnded("order-42", 7)
    assert isinstance(error, YieldstarError) and isinstance(error, RuntimeError)
    assert not isinstance(error, ValueError)  # no argument was wrong
    assert "execution 'order-42' under token 7" in str(error)
    assert (error.execution_id, error.token) == ("order-42", 7)


@pytest.mark.timeout(30)
def test_a_ctx_kept_from_an_in_process_run_whose_ledger_is_closed_says_its_delivery_ended():
    # `run_workflow` without a backend removes its temporary ledger: the kept context used to
    # fail with sqlite3's "Cannot operate on a closed database".
    kept.clear()
    ran.clear()
    assert run_workflow(registry, "keeps-ctx", execution_id="order-1").status == "completed"
    with pytest.raises(DeliveryEnded, match="execution 'order-1' under token 1 has ended"):
        kept["sync"].run("late", late)
    assert ran == []
