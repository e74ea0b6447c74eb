"""Step timeouts in process (SPEC section 12): `ctx.run(..., timeout=seconds)` and
`ctx.parallel(..., timeout=)`, their bad input, an async step cancelled at its deadline, and the
replay of recorded outcomes. A sync step that hangs has its worker replaced: that takes real
processes (`tests/supervisor/test_step_timeouts_supervised.py`).
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time

import pytest

from faults import wait_until
from worker import InvalidArgument, Registry, RetryPolicy, StepFailed, StepTimeout
from worker._runtime.abandoned import replace_reason
from worker.testing import run_workflow

pytestmark = pytest.mark.usefixtures("dump_on_hang")

registry = Registry()
TWICE = RetryPolicy(max_attempts=2, interval=0.0)
BAD_TIMEOUTS = [0, -1, -0.5, math.nan, math.inf, -math.inf, "5", True, False, [1]]
called: list = []
LATE = threading.Event()  # lets an abandoned attempt go on, after its deadline
late: list = []


def record_call(*args, **kwargs):
    called.append((args, kwargs))
    return sorted(kwargs)


async def record_call_async(*args, **kwargs):
    return record_call(*args, **kwargs)


@pytest.fixture(autouse=True)
def fresh_calls():
    called.clear()
    late.clear()
    LATE.clear()
    yield
    LATE.set()  # the threads a test abandoned end, so that the next test sees none of them
    wait_until(lambda: replace_reason() is None, timeout=10, message="every abandoned thread ended")


def refused(call) -> str:
    try:
        call()
    except InvalidArgument as exc:
        return str(exc)
    return "accepted"


@registry.workflow("t.bad_sync")
def bad_sync(ctx, input):
    timeout = BAD_TIMEOUTS[input]  # by its index: NaN and infinity are no JSON
    return [refused(lambda: ctx.run("k", record_call, timeout=timeout)),
            refused(lambda: ctx.parallel("p", record_call, [1], timeout=timeout))]


@registry.workflow("t.bad_async")
async def bad_async(ctx, input):
    said, timeout = [], BAD_TIMEOUTS[input]
    for call in (lambda: ctx.run("k", record_call_async, timeout=timeout),
                 lambda: ctx.parallel("p", record_call_async, [1], timeout=timeout)):
        try:
            await call()
            said.append("accepted")
        except InvalidArgument as exc:
            said.append(str(exc))
    return said


@pytest.mark.timeout(30)
@pytest.mark.parametrize("workflow", ["t.bad_sync", "t.bad_async"])
@pytest.mark.parametrize("index", range(len(BAD_TIMEOUTS)), ids=[repr(t) for t in BAD_TIMEOUTS])
def test_a_timeout_that_is_not_a_finite_number_of_seconds_above_0_is_refused_before_anything_runs(
        sqlite_backend, clock, workflow, index):
    timeout = BAD_TIMEOUTS[index]
    record = run_workflow(registry, workflow, index, backend=sqlite_backend, clock=clock)
    said = json.loads(record.result_json)
    assert len(said) == 2
    for message in said:
        assert "timeout" in message and repr(timeout) in message, message
    assert called == []
    assert sqlite_backend.heap.steps("test-execution") == []


@registry.workflow("t.kwargs")
def passes_kwargs(ctx, input):
    return ctx.run("k", record_call, 1, x=2, retry=TWICE, timeout=5)


@registry.workflow("t.kwargs_async")
async def passes_kwargs_async(ctx, input):
    return [await ctx.run("k", record_call_async, 1, x=2, retry=TWICE, timeout=5),
            await ctx.run("plain", record_call, 1, y=3, timeout=5)]


@pytest.mark.timeout(30)
def test_retry_and_timeout_are_not_passed_on_to_the_step_function(sqlite_backend, clock):
    assert json.loads(run_workflow(registry, "t.kwargs", backend=sqlite_backend, clock=clock).result_json) == ["x"]
    record = run_workflow(registry, "t.kwargs_async", execution_id="a", backend=sqlite_backend, clock=clock)
    assert json.loads(record.result_json) == [["x"], ["y"]]
    assert called == [((1,), {"x": 2}), ((1,), {"x": 2}), ((1,), {"y": 3})]


async def naps(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "woke"


@registry.workflow("t.async_nap")
async def async_nap(ctx, input):
    try:
        await ctx.run("nap", naps, 600, retry=TWICE, timeout=0.3)
    except StepFailed as exc:
        return {"type": exc.error_type, "attempts": exc.attempts, "message": exc.error_message}
    return None


@pytest.mark.timeout(30)
def test_an_async_step_past_its_timeout_is_cancelled_retried_and_raised_as_step_failed_of_step_timeout(
        sqlite_backend, clock):
    started = time.monotonic()
    record = run_workflow(registry, "t.async_nap", backend=sqlite_backend, clock=clock)
    assert time.monotonic() - started < 10  # two attempts of 0.3 s, not 600 s
    assert json.loads(record.result_json) == {
        "type": "StepTimeout", "attempts": 2,
        "message": "step 'nap' attempt 2 did not end within its timeout of 0.3 s"}
    attempts = sqlite_backend.heap.steps("test-execution")
    assert [(a.step_key, a.attempt, a.done) for a in attempts] == [("nap", 1, False), ("nap", 2, True)]
    errors = [json.loads(a.step_response_json)["error"] for a in attempts]
    assert [e["type"] for e in errors] == ["StepTimeout", "StepTimeout"]
    assert errors[0]["message"] == "step 'nap' attempt 1 did not end within its timeout of 0.3 s"
    assert StepTimeout.__name__ == "StepTimeout"


async def raises_timeout_error() -> None:
    raise TimeoutError("the step's own")


@registry.workflow("t.own_timeout_error")
async def own_timeout_error(ctx, input):
    try:
        await ctx.run("own", raises_timeout_error, timeout=30)
    except StepFailed as exc:
        return exc.error_type
    return None


@pytest.mark.timeout(30)
def test_a_timeout_error_the_step_raises_itself_is_its_own_error_not_a_step_timeout(sqlite_backend, clock):
    record = run_workflow(registry, "t.own_timeout_error", backend=sqlite_backend, clock=clock)
    assert json.loads(record.result_json) == "TimeoutError"


HANG = threading.Event()  # never set: a step that waits on it hangs


def quick_then_hangs(n: int) -> int:
    called.append(n)
    if len(called) > 1:
        HANG.wait(600)
    return n * 10


@registry.workflow("t.replayed")
def replayed(ctx, input):
    value = ctx.run("quick", quick_then_hangs, 1, timeout=0.5)
    ctx.sleep("pause", 1)
    return value


@pytest.mark.timeout(30)
def test_a_completed_step_replays_its_recorded_value_without_running_or_timing_it_again(sqlite_backend, clock):
    record = run_workflow(registry, "t.replayed", backend=sqlite_backend, clock=clock)
    assert json.loads(record.result_json) == 10
    assert called == [1]  # the second delivery replayed it: the function that would hang never ran


def writes_late(ctx) -> int:
    """The first attempt hangs past its deadline, then tries to record a nested step."""
    called.append("slow")
    if len(called) == 1:
        LATE.wait(20)
        try:
            ctx.run("inner", record_call)
            late.append("written")
        except BaseException as exc:  # noqa: BLE001 - what the abandoned thread meets is the point
            late.append(type(exc).__name__)
    return 7


@registry.workflow("t.sync_late")
def sync_late(ctx, input):
    return ctx.run("slow", writes_late, ctx, retry=TWICE, timeout=0.3)


@pytest.mark.timeout(30)
def test_a_sync_step_past_its_timeout_is_recorded_as_step_timeout_and_its_abandoned_thread_writes_nothing(
        sqlite_backend, clock):
    record = run_workflow(registry, "t.sync_late", backend=sqlite_backend, clock=clock)
    assert json.loads(record.result_json) == 7
    assert replace_reason() == "step 'slow' attempt 1 did not end within its timeout of 0.3 s"
    LATE.set()  # the abandoned attempt goes on and tries to write
    wait_until(lambda: late, timeout=10, message="the abandoned thread tried its write")
    # The delivery ended before the thread's write: its context says so (it used to re-raise the
    # delivery's suspension into the thread), and nothing is written.
    assert late == ["DeliveryEnded"]
    recorded = sqlite_backend.heap.steps("test-execution")
    assert [(a.step_key, a.attempt, a.done) for a in recorded] == [("slow", 1, False), ("slow", 2, True)]
    error = json.loads(recorded[0].step_response_json)["error"]
    assert (error["type"], error["message"]) == ("StepTimeout", "step 'slow' attempt 1 did not end within its"
                                                 " timeout of 0.3 s")
    assert "writes_late" in error["traceback"]  # where the thread was


def item_hangs_once(i: int) -> int:
    called.append(i)
    if i == 1 and called.count(1) == 1:
        LATE.wait(20)
    return i * 10


@registry.workflow("t.parallel_sync")
def parallel_sync(ctx, input):
    return ctx.parallel("items", item_hangs_once, [0, 1, 2], retry=TWICE, timeout=0.3)


async def async_item_naps_once(i: int) -> int:
    called.append(i)
    if i == 1 and called.count(1) == 1:
        await asyncio.sleep(600)
    return i * 10


@registry.workflow("t.parallel_async")
async def parallel_async(ctx, input):
    return await ctx.parallel("items", async_item_naps_once, [0, 1, 2], retry=TWICE, timeout=0.3)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("workflow", ["t.parallel_sync", "t.parallel_async"])
def test_each_item_of_a_parallel_call_has_the_timeout_and_the_retry(sqlite_backend, clock, workflow):
    record = run_workflow(registry, workflow, backend=sqlite_backend, clock=clock)
    assert json.loads(record.result_json) == [0, 10, 20]
    recorded = [(a.step_key, a.attempt, json.loads(a.step_response_json).get("error", {}).get("type"))
                for a in sqlite_backend.heap.steps("test-execution")]
    assert ("items[1]", 1, "StepTimeout") in recorded and ("items[1]", 2, None) in recorded
    assert called.count(0) == 1 and called.count(2) == 1  # the others ran once, recorded in the first delivery


def hangs(n: int) -> int:
    called.append(n)
    LATE.wait(20)
    return n


@registry.workflow("t.sync_hang_once")
def sync_hang_once(ctx, input):
    try:
        ctx.run("hang", hangs, 1, timeout=0.3)
    except StepFailed as exc:
        return {"type": exc.error_type, "attempts": exc.attempts}
    return None


@pytest.mark.timeout(30)
def test_a_sync_step_past_its_only_attempt_replays_as_step_failed_of_step_timeout_in_the_next_delivery(
        sqlite_backend, clock):
    record = run_workflow(registry, "t.sync_hang_once", backend=sqlite_backend, clock=clock)
    assert json.loads(record.result_json) == {"type": "StepTimeout", "attempts": 1}
    assert called == [1]  # the next delivery replayed the recorded failure: the function ran once
    (attempt,) = sqlite_backend.heap.steps("test-execution")
    assert (attempt.attempt, attempt.done) == (1, True)
    assert json.loads(attempt.step_response_json)["error"]["type"] == "StepTimeout"
