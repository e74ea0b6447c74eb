"""`async def` workflows (SPEC section 9): the sync SDK's replay, retry, suspension, fencing and
unwinding rules, with sync and async step functions, in-process and under a real supervisor."""

from __future__ import annotations

import asyncio
import functools
import json
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from faults import TESTS, admit, freeze, freeze_group, read_log, step_tokens, thaw_group, wait_gone, wait_until
from supervisor import Completed, ExecutionLease, Failed, LeaseLost, Retry, Suspended, open_backend
from worker import Registry, RetryableError, StepFailed
from worker._runtime.driver import run_delivery
from worker.testing import FakeClock, run_workflow

pytestmark = pytest.mark.usefixtures("dump_on_hang")

LEASE_MS = 30_000
calls: Counter = Counter()
hooks: dict = {}
registry = Registry()


@pytest.fixture(autouse=True)
def fresh_calls():
    calls.clear()
    hooks.clear()
    flags.clear()
    yield


async def fetch(x):
    await asyncio.sleep(0)  # really suspends the coroutine once
    calls["fetch"] += 1
    return x * 2


def plain(x):
    calls["plain"] += 1
    hook = hooks.get("plain")
    if hook is not None:
        hook()
    return x + 1


async def flaky(n):
    calls["flaky"] += 1
    if calls["flaky"] <= n:
        raise RetryableError("not yet", max_attempts=5, interval=2.0)
    return calls["flaky"]


async def broken():
    raise KeyError("no such order")


@registry.workflow("a.mixed")
async def mixed(ctx, input):
    doubled = await ctx.run("fetch", fetch, input)
    await ctx.sleep("nap", 10)
    plus = await ctx.run("plain", plain, doubled)
    return [doubled, plus, await ctx.run(fetch, plus)]


@registry.workflow("a.retry")
async def retry(ctx, input):
    return await ctx.run("flaky", flaky, input)


@registry.workflow("a.catch")
async def catch(ctx, input):
    try:
        await ctx.run("broken", broken)
    except StepFailed as failed:
        return {"caught": failed.error_type}


@registry.workflow("a.swallow")
async def swallow(ctx, input):
    try:
        await ctx.sleep("t", 5)
    except Exception:  # noqa: BLE001 - what the test shows cannot catch a suspension
        return "swallowed"
    return "slept"


@registry.workflow("a.gather")
async def gather(ctx, input):
    return await asyncio.gather(ctx.run(fetch, 1), ctx.run(fetch, 2))


@registry.workflow("a.sync_calls_async")
def sync_calls_async(ctx, input):
    return ctx.run("x", fetch, 1)


@registry.workflow("a.child")
async def child(ctx, input):
    return await ctx.run("fetch", fetch, input)


@registry.workflow("a.parent")
async def parent(ctx, input):
    first = await ctx.start("child", "a.child", input)
    return {"child": first, "result": await ctx.wait_for(first)}


@registry.workflow("a.effect")
async def effect(ctx, input):
    async def charge(effect_id):
        calls["charge"] += 1
        await asyncio.sleep(0)
        return {"charged": effect_id}

    receipt = await ctx.effect("charge", charge)
    await ctx.sleep("after", 1)
    return receipt


@registry.workflow("a.store")
async def store(ctx, input):
    box = ctx.store("box")
    await box.get_or_create("create", [])
    await box.update("add", lambda items: items + [input])
    return await box.take("take", input)


flags: dict = {}


async def step_a():
    return "a"


async def step_b():
    return "b"


@registry.workflow("a.unnamed")
async def unnamed(ctx, input):
    first, second = (step_b, step_a) if flags.get("swapped") else (step_a, step_b)
    one = await ctx.run(first)
    await ctx.sleep("pause", 1)
    return one + await ctx.run(second)


async def _doubled(ctx, input):
    return await ctx.run("fetch", fetch, input)


class Doubler:
    async def __call__(self, ctx, input):
        return await _doubled(ctx, input)


def wrapper(ctx, input):
    """A plain function that returns a coroutine, as an undecorated wrapper would."""
    return _doubled(ctx, input)


registry.workflow("a.partial")(functools.partial(_doubled))
registry.workflow("a.object")(Doubler())
registry.workflow("a.wrapper")(wrapper)


@registry.workflow("a.leftover")
async def leftover(ctx, input):
    async def background():
        try:
            await asyncio.sleep(3600)
        finally:
            calls["background ended"] += 1

    asyncio.create_task(background())
    await asyncio.sleep(0)  # the task starts, then waits
    return await ctx.run("fetch", fetch, input)


def claim(backend):
    return backend.executions.claim_due(limit=1, duration=LEASE_MS)[0]


def record_of(backend, execution_id):
    record = backend.executions.get(execution_id)
    return record.status, json.loads(record.result_json or "null"), json.loads(record.error_json or "null")


# -- in-process ---------------------------------------------------------------------------------

@pytest.mark.timeout(30)
def test_sync_and_async_steps_record_once_and_replay_after_a_timer():
    record = run_workflow(registry, "a.mixed", 3)
    assert record.status == "completed" and json.loads(record.result_json) == [6, 7, 14]
    # fetch(3) ran before the timer and replayed after it; plain and the unnamed fetch once each.
    assert calls == {"fetch": 2, "plain": 1}


@pytest.mark.timeout(30)
def test_an_async_step_is_retried_at_its_interval_then_succeeds(tmp_path):
    clock = FakeClock()
    with open_backend(tmp_path / "l.db", clock=clock, redelivery_delay=lambda n: 1) as backend:
        started = clock.now
        record = run_workflow(registry, "a.retry", 2, backend=backend, clock=clock)
        assert record.status == "completed" and json.loads(record.result_json) == 3
        attempts = [(s.attempt, s.done) for s in backend.heap.steps("test-execution")]
        assert attempts == [(1, False), (2, False), (3, True)]
        assert clock.now - started >= 4000  # two backoffs of 2 s on the fake clock


@pytest.mark.timeout(30)
def test_an_async_step_failure_is_a_step_failed_the_workflow_can_catch():
    record = run_workflow(registry, "a.catch")
    assert json.loads(record.result_json) == {"caught": "KeyError"}


@pytest.mark.timeout(30)
def test_except_exception_in_an_async_workflow_cannot_swallow_a_suspension():
    assert json.loads(run_workflow(registry, "a.swallow").result_json) == "slept"


@pytest.mark.timeout(30)
def test_unnamed_steps_started_together_are_refused_and_fail_the_execution():
    record = run_workflow(registry, "a.gather")
    error = json.loads(record.error_json)
    assert record.status == "failed" and error["type"] == "InvalidArgument"
    assert "overlap must be named" in error["message"]


@pytest.mark.timeout(30)
def test_a_sync_workflow_running_a_coroutine_function_gets_a_clear_error():
    record = run_workflow(registry, "a.sync_calls_async")
    error = json.loads(record.error_json)
    assert record.status == "failed" and "fetch is a coroutine function" in error["message"]


@pytest.mark.timeout(30)
def test_an_async_parent_starts_and_waits_for_an_async_child():
    record = run_workflow(registry, "a.parent", 5)
    result = json.loads(record.result_json)
    assert record.status == "completed" and result["result"] == 10


@pytest.mark.timeout(30)
def test_an_async_effect_is_performed_once_across_a_suspension():
    record = run_workflow(registry, "a.effect")
    assert json.loads(record.result_json) == {"charged": "test-execution/charge"}
    assert calls["charge"] == 1


@pytest.mark.timeout(30)
def test_async_store_operations_apply_once():
    assert json.loads(run_workflow(registry, "a.store", {"n": 1}).result_json) == {"n": 1}


@pytest.mark.timeout(30)
def test_a_stale_async_holder_is_stopped_and_writes_nothing_more(sqlite_path, sqlite_backend, clock):
    sqlite_backend.executions.admit("e1", "a.mixed", "1")
    stale = claim(sqlite_backend)

    def take_over():  # inside the `plain` step of the first delivery after the timer
        clock.now = stale.expires_at + 1
        assert claim(sqlite_backend).token == stale.token + 1

    assert run_delivery(sqlite_backend, stale, registry) == Suspended()  # fetch, then the timer
    assert sqlite_backend.executions.acknowledge(stale, Suspended()) == Suspended()
    clock.now += 10_000
    stale = claim(sqlite_backend)
    hooks["plain"] = take_over
    before = step_tokens(sqlite_path, "e1")

    assert run_delivery(sqlite_backend, stale, registry) == LeaseLost()

    assert step_tokens(sqlite_path, "e1") == before  # plain's write refused
    assert calls == {"fetch": 1, "plain": 1}  # nothing ran after the refused write
    assert sqlite_backend.executions.acknowledge(stale, Completed("1")) == LeaseLost()


@pytest.mark.timeout(30)
def test_a_busy_database_in_an_async_workflow_asks_for_a_retry(tmp_path):
    path = tmp_path / "l.db"
    with open_backend(path, redelivery_delay=lambda n: 1) as backend:
        backend.executions.admit("e1", "a.mixed", "1")
        lease = backend.executions.claim_due(limit=1, duration=LEASE_MS)[0]
        backend.connection.raw.execute("PRAGMA busy_timeout = 50")
        locker = sqlite3.connect(path, isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")
        try:
            outcome = run_delivery(backend, lease, registry)
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        assert isinstance(outcome, Retry) and "locked" in outcome.reason
        assert backend.heap.steps("e1") == []
        assert calls["fetch"] == 1  # it ran; its write was the one the lock held up


@pytest.mark.timeout(30)
def test_unnamed_async_steps_taken_in_another_order_park_as_diverged(sqlite_backend, clock):
    sqlite_backend.executions.admit("e1", "a.unnamed", "null")
    lease = claim(sqlite_backend)
    assert run_delivery(sqlite_backend, lease, registry) == Suspended()
    sqlite_backend.executions.acknowledge(lease, Suspended())
    flags["swapped"] = True
    clock.advance(1_000)

    outcome = run_delivery(sqlite_backend, claim(sqlite_backend), registry)

    assert outcome == Suspended(diverged="recorded step '@1:step_a' was next, but the code reached '@1:step_b'")
    assert [s.step_key for s in sqlite_backend.heap.steps("e1")] == ["@1:step_a", "pause"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("workflow", ["a.partial", "a.object", "a.wrapper"])
def test_a_partial_a_callable_object_and_a_function_returning_a_coroutine_run_as_async(workflow):
    record = run_workflow(registry, workflow, 4)
    assert record.status == "completed" and json.loads(record.result_json) == 8
    assert calls["fetch"] == 1


@pytest.mark.timeout(30)
def test_tasks_an_async_workflow_leaves_running_are_cancelled_when_its_delivery_ends():
    record = run_workflow(registry, "a.leftover", 1)
    assert record.status == "completed" and json.loads(record.result_json) == 2
    assert calls["background ended"] == 1


@pytest.mark.timeout(30)
def test_run_workflow_runs_an_async_workflow_from_inside_a_running_event_loop():
    async def test_body():
        return run_workflow(registry, "a.mixed", 3)

    record = asyncio.run(test_body())
    assert record.status == "completed" and json.loads(record.result_json) == [6, 7, 14]


# -- under a real supervisor --------------------------------------------------------------------

APP = str(TESTS / "apps" / "supervised_app.py")


@pytest.mark.timeout(60)
def test_async_workflows_run_under_a_supervisor(sqlite_path, sqlite_ledger, supervisors, tmp_path):
    log = str(tmp_path / "effects.log")
    supervisors.start(sqlite_path, concurrency=2)
    for n in range(4):  # half of them suspend on a timer after their first step
        admit(sqlite_path, f"async-{n}", "sv.async3", {"log": log, "pause": 0.3 if n % 2 else 0})
    wait_until(lambda: all(sqlite_ledger.executions.get(f"async-{n}").status == "completed" for n in range(4)),
               timeout=30)
    for n in range(4):
        assert json.loads(sqlite_ledger.executions.get(f"async-{n}").result_json) == ["one", "two", "three"]
    begun = Counter((e.execution_id, e.step_key) for e in read_log(log) if e.event == "begin")
    assert set(begun.values()) == {1} and len(begun) == 12  # the replay after a timer ran no step again
    assert [h.outcome for h in sqlite_ledger.executions.history("async-1")] == ["suspended", "completed"]


@pytest.mark.timeout(90)
def test_a_frozen_async_worker_is_killed_and_replaced_and_its_execution_delivered_again(
        sqlite_path, sqlite_ledger, supervisors, tmp_path):
    log, gate = str(tmp_path / "effects.log"), str(tmp_path / "gate")
    admit(sqlite_path, "frozen", "sv.async_hold", {"log": log, "gate": gate, "hold_tokens": [1]})
    supervisor = supervisors.start(sqlite_path, concurrency=1)
    frozen = wait_until(lambda: next((e for e in read_log(log) if e.event == "waiting" and e.token == 1), None)).pid
    freeze(frozen)
    supervisor.wait_log(f"worker pid {frozen} silent for")
    wait_gone([frozen], timeout=10)  # killed while frozen: it never ran again
    wait_until(lambda: sqlite_ledger.executions.get("frozen").status == "completed", timeout=20)
    first, second = sqlite_ledger.executions.history("frozen")
    assert (first.token, first.ended_by) == (1, "superseded")
    assert (second.token, second.ended_by, second.outcome) == (2, "acknowledged", "completed")
    assert [(key, token) for key, _, token in step_tokens(sqlite_path, "frozen")] == [
        ("before", 1), ("hold", 2), ("after", 2)]
    assert json.loads(sqlite_ledger.executions.get("frozen").result_json)["pid"] != frozen
    stale = ExecutionLease("frozen", 1, first.expires_at)
    assert sqlite_ledger.executions.acknowledge(stale, Failed('{"type": "late"}')) == LeaseLost()
    assert sqlite_ledger.heap.write_step(stale, step_key="late", step_attempt=1, done=True,
                                  step_response_json='{"value": 1}') == LeaseLost()


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_a_frozen_async_worker_thawed_after_a_takeover_has_its_late_write_refused(
        sqlite_path, sqlite_ledger, supervisors, tmp_path):
    log, gate = str(tmp_path / "effects.log"), str(tmp_path / "gate")
    admit(sqlite_path, "paused", "sv.async_hold", {"log": log, "gate": gate, "hold_tokens": [1]})
    # Its workers wait 50 heartbeats for it, so a frozen worker survives the pause and resumes.
    first = supervisors.start(sqlite_path, concurrency=1, extra=("--heartbeat-misses", "50"))
    stale = wait_until(lambda: next((e for e in read_log(log) if e.event == "waiting" and e.token == 1), None)).pid
    freeze_group(first.pgid)  # the supervisor and its worker, mid-step, as a paused host would be

    second = supervisors.start(sqlite_path, concurrency=1)
    wait_until(lambda: sqlite_ledger.executions.get("paused").status == "completed", timeout=30, message="the takeover")
    history = [(h.token, h.ended_by, h.outcome) for h in sqlite_ledger.executions.history("paused")]
    assert history == [(1, "superseded", None), (2, "acknowledged", "completed")]
    steps = step_tokens(sqlite_path, "paused")
    assert steps == [("before", 1, 1), ("hold", 1, 2), ("after", 1, 2)]

    Path(gate).touch()  # the stale worker's step may now end, and its write be tried...
    thaw_group(first.pgid)
    # Either keeps it out: its write refused by the token, or its supervisor, thawed too, killing
    # it first (no renewal has confirmed its lease for a lease length, or its renewal came back lost).
    refused = "delivery execution=paused token=1 outcome=lost"
    killed = f"killing worker pid {stale}"
    wait_until(lambda: refused in first.log() or killed in first.log(), message="the stale delivery to end")
    if killed in first.log():
        wait_gone([stale], timeout=15)
    assert first.popen.poll() is None and second.popen.poll() is None
    # ...and nothing it did counted: the records and the outcome are the new holder's.
    assert step_tokens(sqlite_path, "paused") == steps
    assert [(h.token, h.ended_by, h.outcome) for h in sqlite_ledger.executions.history("paused")] == history
    assert ("after", 1) not in [(e.step_key, e.token) for e in read_log(log)]
