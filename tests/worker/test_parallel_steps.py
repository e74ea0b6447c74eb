"""Parallel steps (SPEC section 10): `asyncio.gather` of named `ctx.run` calls and
`ctx.parallel(key, fn, items)`, each call recorded as its own step and replayed as recorded, on
each backend; the unnamed-overlap rule; and a worker SIGKILLed in the middle of a `ctx.parallel`
under a real supervisor.

Overlap is proven by barriers that only open when the steps run at once (a step that ran alone
would time out at its barrier and fail), never by timing.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter

import pytest

from faults import TESTS, admit, read_log, sigkill, step_tokens, wait_gone, wait_until
from supervisor import Completed, Failed, LeaseLost, Retry, Suspended, open_backend
from supervisor.ledger.errors import StorageBusy
from worker import InvalidArgument, Registry, RetryableError, StepFailed
from worker._runtime.driver import run_delivery
from worker.testing import run_workflow

pytestmark = pytest.mark.usefixtures("dump_on_hang")

LEASE_MS = 30_000
WAIT_S = 10.0  # how long a step waits for its partners before failing the test
registry = Registry()
calls: Counter = Counter()
state: dict = {}
_lock = threading.Lock()


def called(name: str) -> int:
    with _lock:
        calls[name] += 1
        return calls[name]


class Gauge:
    """Counts the calls running at once, and the most there ever were."""

    def __init__(self) -> None:
        self.running = self.most = 0

    def __enter__(self) -> None:
        with _lock:
            self.running += 1
            self.most = max(self.most, self.running)

    def __exit__(self, *exc) -> None:
        with _lock:
            self.running -= 1


@pytest.fixture(autouse=True)
def fresh_state():
    calls.clear()
    state.clear()
    state["gauge"] = Gauge()
    yield


@pytest.fixture
def ledger(each_backend, clock):
    """A ledger on each backend in turn, on the fake clock; a lease that ends may be claimed
    again 1 ms later."""
    with open_backend(each_backend, clock=clock, redelivery_delay=lambda n: 1) as opened:
        yield opened


def event(name: str) -> threading.Event:
    with _lock:
        return state.setdefault(name, threading.Event())


def async_event(name: str) -> asyncio.Event:
    return state.setdefault(name, asyncio.Event())


def wait(name: str) -> None:
    if not event(name).wait(WAIT_S):
        raise TimeoutError(f"{name} did not happen")


def parallel_workflow(name: str, key: str, fn, items, **kwargs) -> None:
    """Register `name`: a plain workflow that returns `ctx.parallel(key, fn, items, **kwargs)`."""
    registry.workflow(name)(lambda ctx, input: ctx.parallel(key, fn, items, **kwargs))


def claim(backend):
    return backend.executions.claim_due(limit=1, duration=LEASE_MS)[0]


def steps(backend, execution_id: str) -> list[tuple[str, int, bool]]:
    """`(step_key, attempt, done)` of each recorded step, in the order written."""
    return [(r.step_key, r.attempt, r.done) for r in backend.executions.get_with_steps(execution_id)[1]]


def deliver(backend, execution_id: str, workflow: str, input=None, **kwargs):
    """Admit and run one delivery; acknowledge it if it ended with an outcome, as its holder would."""
    backend.executions.admit(execution_id, workflow, json.dumps(input))
    lease = claim(backend)
    outcome = run_delivery(backend, lease, registry, claimed_at=lease.expires_at - LEASE_MS, **kwargs)
    if isinstance(outcome, (Suspended, Completed, Failed)):
        backend.executions.acknowledge(lease, outcome)
    return outcome


# -- asyncio.gather of named steps --------------------------------------------------------------

async def first():
    """Meets `second` (both must be running), then ends only after `second` has ended."""
    called("first")
    await asyncio.wait_for(state.setdefault("met", asyncio.Barrier(2)).wait(), WAIT_S)
    await asyncio.wait_for(async_event("second ended").wait(), WAIT_S)
    return "a"


async def second():
    called("second")
    await asyncio.wait_for(state.setdefault("met", asyncio.Barrier(2)).wait(), WAIT_S)
    async_event("second ended").set()
    return "b"


async def gathered_then_nap(ctx, *steps):
    """The steps at once, then a timer: the delivery after it replays them."""
    results = await asyncio.gather(*steps)
    await ctx.sleep("nap", 5)
    return results


@registry.workflow("p.gather")
async def gather_then_sleep(ctx, input):
    return await gathered_then_nap(ctx, ctx.run("a", first), ctx.run("b", second))


async def steady():
    """In flight when `flaky_once` asks to be retried later: it ends only after that."""
    called("steady")
    await asyncio.wait_for(async_event("flaky raised").wait(), WAIT_S)
    return "steady"


async def flaky_once():
    if called("flaky") == 1:
        async_event("flaky raised").set()
        raise RetryableError("not yet", interval=2.0)
    return "flaky"


@registry.workflow("p.gather_retry")
async def gather_retry(ctx, input):
    return await asyncio.gather(ctx.run("steady", steady), ctx.run("flaky", flaky_once))


async def outer_step(ctx):
    """A step whose own function runs a step that asks to be retried later."""
    called("outer")
    return await ctx.run("inner", flaky_once)


@registry.workflow("p.nested_retry")
async def nested_retry(ctx, input):
    return await ctx.run("outer", outer_step, ctx)


async def nap_then(ctx):
    await ctx.sleep("nap", 5)
    return "slept"


async def until_napping():
    """In flight when the timer beside it suspends the workflow: ends only after that."""
    called("until napping")
    await asyncio.wait_for(async_event("napping").wait(), WAIT_S)
    return "landed"


@registry.workflow("p.gather_sleep")
async def gather_sleep(ctx, input):
    async def nap():
        await asyncio.sleep(0)  # the step beside it starts first
        async_event("napping").set()
        return await nap_then(ctx)

    return await asyncio.gather(ctx.run("landing", until_napping), nap())


async def charge(effect_id):
    """An effect that meets its partner: both must be performed at once."""
    called(f"charge {effect_id.rsplit('/', 1)[-1]}")
    await asyncio.wait_for(state.setdefault("charged", asyncio.Barrier(2)).wait(), WAIT_S)
    return {"charged": effect_id.rsplit("/", 1)[-1]}


@registry.workflow("p.effects")
async def two_effects(ctx, input):
    return await gathered_then_nap(ctx, ctx.effect("card", charge), ctx.effect("wallet", charge))


async def busy_step():
    async_event("busy").set()
    raise StorageBusy("database is locked")


async def after_busy():
    await asyncio.wait_for(async_event("busy").wait(), WAIT_S)
    return "late"


@registry.workflow("p.gather_busy")
async def gather_busy(ctx, input):
    return await asyncio.gather(ctx.run("late", after_busy), ctx.run("busy", busy_step))


async def slow_to_land():
    """In flight until a step has started after the workflow began to suspend, and a few turns
    of the loop more."""
    called("slow")
    await asyncio.wait_for(async_event("late started").wait(), WAIT_S)
    for _ in range(5):
        await asyncio.sleep(0)
    return "landed"


@registry.workflow("p.late_start")
async def late_start(ctx, input):
    async def late():
        await asyncio.wait_for(async_event("flaky raised").wait(), WAIT_S)
        async_event("late started").set()
        return await ctx.run("late", pause, "late")  # refused: the workflow is suspending

    return await asyncio.gather(ctx.run("slow", slow_to_land), ctx.run("flaky", flaky_once), late())


async def pause(x):
    await asyncio.sleep(0)
    return x


@registry.workflow("p.unnamed_first")
async def unnamed_first(ctx, input):
    return await asyncio.gather(ctx.run(pause, 1), ctx.run("named", pause, 2))


@registry.workflow("p.named_first")
async def named_first(ctx, input):
    return await asyncio.gather(ctx.run("named", pause, 1), ctx.run(pause, 2))


@pytest.mark.timeout(60)
def test_gathered_named_steps_run_at_once_and_replay_in_their_order_whichever_ended_first(ledger, clock):
    record = run_workflow(registry, "p.gather", backend=ledger, clock=clock)
    assert record.status == "completed" and json.loads(record.result_json) == ["a", "b"]
    # b ended (and was recorded) before a; the delivery after the timer replayed both, calling neither.
    assert steps(ledger, "test-execution") == [("b", 1, True), ("a", 1, True), ("nap", 1, True)]
    assert [h.outcome for h in ledger.executions.history("test-execution")] == ["suspended", "completed"]
    assert calls == {"first": 1, "second": 1}


@pytest.mark.timeout(60)
def test_a_gathered_step_retried_later_lets_the_other_land_then_suspends(ledger, clock):
    assert deliver(ledger, "test-execution", "p.gather_retry") == Suspended()
    # steady was still running when flaky asked for its retry; it ended and was recorded first.
    assert steps(ledger, "test-execution") == [("flaky", 1, False), ("steady", 1, True)]
    assert ledger.executions.get("test-execution").due_at == clock.now + 2000
    record = run_workflow(registry, "p.gather_retry", backend=ledger, clock=clock)
    assert record.status == "completed" and json.loads(record.result_json) == ["steady", "flaky"]
    assert calls == {"steady": 1, "flaky": 2}


@pytest.mark.timeout(30)
def test_a_step_started_while_the_workflow_suspends_waits_for_the_steps_in_flight_too(sqlite_backend, clock):
    assert deliver(sqlite_backend, "test-execution", "p.late_start") == Suspended()
    assert steps(sqlite_backend, "test-execution") == [("flaky", 1, False), ("slow", 1, True)]
    record = run_workflow(registry, "p.late_start", backend=sqlite_backend, clock=clock)
    assert json.loads(record.result_json) == ["landed", "flaky", "late"]
    assert calls == {"slow": 1, "flaky": 2}


@pytest.mark.timeout(30)
def test_a_step_retried_later_inside_another_step_does_not_wait_for_the_step_enclosing_it():
    record = run_workflow(registry, "p.nested_retry")
    assert record.status == "completed" and json.loads(record.result_json) == "flaky"
    assert calls == {"outer": 2, "flaky": 2}  # the outer step was cut short by the suspension


@pytest.mark.timeout(30)
def test_a_timer_beside_a_running_step_suspends_once_that_step_is_recorded(ledger, clock):
    assert deliver(ledger, "test-execution", "p.gather_sleep") == Suspended()
    assert steps(ledger, "test-execution") == [("nap", 1, True), ("landing", 1, True)]
    record = run_workflow(registry, "p.gather_sleep", backend=ledger, clock=clock)
    assert json.loads(record.result_json) == ["landed", "slept"]
    assert calls == {"until napping": 1}


@pytest.mark.timeout(60)
def test_gathered_effects_are_performed_at_once_and_once_each_across_a_replay(ledger, clock):
    record = run_workflow(registry, "p.effects", backend=ledger, clock=clock)
    assert json.loads(record.result_json) == [{"charged": "card"}, {"charged": "wallet"}]
    assert calls == {"charge card": 1, "charge wallet": 1}


@pytest.mark.timeout(30)
def test_a_storage_error_in_a_gathered_step_ends_the_delivery_as_a_retry_recording_nothing(sqlite_backend):
    outcome = deliver(sqlite_backend, "test-execution", "p.gather_busy")
    assert isinstance(outcome, Retry) and outcome.storage_error == "busy"
    assert steps(sqlite_backend, "test-execution") == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize("workflow", ["p.unnamed_first", "p.named_first"])
def test_an_unnamed_step_overlapping_another_is_refused_with_the_fix(workflow):
    record = run_workflow(registry, workflow)
    error = json.loads(record.error_json)
    assert record.status == "failed" and error["type"] == "InvalidArgument"
    assert "overlap must be named" in error["message"] and 'ctx.run("some-key", fn, ...)' in error["message"]


# -- ctx.parallel ---------------------------------------------------------------------------------

def square_in_reverse(i: int) -> int:
    """Item i ends only after item i + 1 has: the items end in reverse order, all running at once."""
    called(f"square {i}")
    with state["gauge"]:
        if i + 1 < state["n"]:
            wait(f"ended {i + 1}")
        event(f"ended {i}").set()
    return i * i


def barrier_pair(i: int) -> int:
    """Passes only with a partner: two calls must be running at once."""
    called(f"pair {i}")
    with state["gauge"]:
        state["pairs"].wait(WAIT_S)
    return i


async def async_barrier_pair(i: int) -> int:
    called(f"pair {i}")
    with state["gauge"]:
        await asyncio.wait_for(state.setdefault("async pairs", asyncio.Barrier(2)).wait(), WAIT_S)
    return i


@registry.workflow("p.squares")
def squares(ctx, input):
    return ctx.parallel("sq", square_in_reverse, range(input))


@registry.workflow("p.async_squares")  # a plain fn in an async workflow: on threads too
async def async_squares(ctx, input):
    return await ctx.parallel("sq", square_in_reverse, range(input))


@registry.workflow("p.pairs")
def pairs(ctx, input):
    return ctx.parallel("pair", barrier_pair, list(range(input)), max_concurrency=2)


@registry.workflow("p.async_pairs")
async def async_pairs(ctx, input):
    return await ctx.parallel("pair", async_barrier_pair, list(range(input)), max_concurrency=2)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workflow", ["p.squares", "p.async_squares"])
def test_parallel_runs_every_item_at_once_and_returns_results_in_item_order(ledger, clock, workflow):
    state["n"] = 4
    record = run_workflow(registry, workflow, 4, backend=ledger, clock=clock)
    assert record.status == "completed" and json.loads(record.result_json) == [0, 1, 4, 9]
    assert state["gauge"].most == 4
    # Each item its own step, recorded as it ended (the last items first, in whatever order).
    assert sorted(steps(ledger, "test-execution")) == [(f"sq[{i}]", 1, True) for i in range(4)]
    assert calls == {f"square {i}": 1 for i in range(4)}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workflow", ["p.pairs", "p.async_pairs"])
def test_parallel_runs_at_most_max_concurrency_items_at_once(workflow):
    state["pairs"] = threading.Barrier(2)
    record = run_workflow(registry, workflow, 6)
    assert record.status == "completed" and json.loads(record.result_json) == list(range(6))
    assert state["gauge"].most == 2  # pairs met, so 2 at once; never more
    assert calls == {f"pair {i}": 1 for i in range(6)}


def fail_one(i: int) -> int:
    """Item 1 fails at once; the others end after it has, so they end after the failure."""
    if i == 1:
        event("failed").set()
        raise ValueError("item 1 broke")
    wait("failed")
    with _lock:
        state.setdefault("ended", []).append(i)
    return i


async def async_fail_one(i: int) -> int:
    if i == 1:
        async_event("failed").set()
        raise ValueError("item 1 broke")
    await asyncio.wait_for(async_event("failed").wait(), WAIT_S)
    await asyncio.sleep(0)
    state.setdefault("ended", []).append(i)
    return i


def caught(failed: StepFailed) -> dict:
    return {"step": failed.step_key, "type": failed.error_type, "ended": sorted(state.get("ended", []))}


@registry.workflow("p.fail")
def fail(ctx, input):
    try:
        return ctx.parallel("f", fail_one, [0, 1, 2])
    except StepFailed as failed:
        return caught(failed)


@registry.workflow("p.async_fail")
async def async_fail(ctx, input):
    try:
        return await ctx.parallel("f", async_fail_one, [0, 1, 2])
    except StepFailed as failed:
        return caught(failed)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workflow", ["p.fail", "p.async_fail"])
def test_a_failed_item_raises_step_failed_once_every_item_has_ended_and_the_others_are_recorded(
        ledger, clock, workflow):
    record = run_workflow(registry, workflow, backend=ledger, clock=clock)
    assert json.loads(record.result_json) == {"step": "f[1]", "type": "ValueError", "ended": [0, 2]}
    recorded = {key: (attempt, done) for key, attempt, done in steps(ledger, "test-execution")}
    assert recorded == {"f[0]": (1, True), "f[1]": (1, True), "f[2]": (1, True)}
    values = {r.step_key: json.loads(r.step_response_json) for r in ledger.executions.get_with_steps(
        "test-execution")[1]}
    # The items of one call are one group for the order rule (worker/_runtime/order.py).
    assert values["f[0]"] == {"value": 0, "group": "f"} and values["f[2]"] == {"value": 2, "group": "f"}
    assert values["f[1]"]["error"]["message"] == "item 1 broke"


def counted(i: int) -> int:
    called(f"item {i}")
    return i + 100


parallel_workflow("p.one_at_a_time", "it", counted, range(5), max_concurrency=1)


@pytest.mark.timeout(60)
def test_a_delivery_stopped_mid_parallel_is_replayed_running_only_the_unrecorded_items(ledger, clock):
    # The supervisor goes silent once item 1 is recorded: the delivery stops before item 2 starts.
    silent = lambda: ledger.heap.read_step("test-execution", "it[1]") is None  # noqa: E731
    assert deliver(ledger, "test-execution", "p.one_at_a_time", may_write=silent) == LeaseLost()
    assert calls == {"item 0": 1, "item 1": 1}
    clock.advance(LEASE_MS)  # the stopped delivery's lease expires, as a killed worker's would
    record = run_workflow(registry, "p.one_at_a_time", backend=ledger, clock=clock)
    assert record.status == "completed" and json.loads(record.result_json) == [100, 101, 102, 103, 104]
    assert calls == {f"item {i}": 1 for i in range(5)}
    assert steps(ledger, "test-execution") == [(f"it[{i}]", 1, True) for i in range(5)]


def gated(i: int) -> int:
    """Every item starts, then waits for the test's gate (on the first delivery only)."""
    if called(f"gated {i}") == 1:
        event(f"started {i}").set()
        wait("gate")
    return i


parallel_workflow("p.gated", "g", gated, [0, 1, 2])


@pytest.mark.timeout(60)
def test_a_lease_lost_while_items_run_refuses_every_write_of_theirs(ledger, clock):
    ledger.executions.admit("test-execution", "p.gated")
    stale = claim(ledger)
    ended = []
    first = threading.Thread(target=lambda: ended.append(run_delivery(ledger, stale, registry)))
    first.start()
    for i in range(3):
        wait(f"started {i}")
    clock.advance(LEASE_MS + 1)  # the lease expires while all three run, and another holder claims it
    assert ledger.executions.claim_due(limit=1, duration=LEASE_MS)
    event("gate").set()  # the three write at once, each with the stale token
    first.join(WAIT_S)
    assert ended == [LeaseLost()] and steps(ledger, "test-execution") == []
    clock.advance(LEASE_MS + 1)  # the new holder's lease expires unused: deliver it here
    record = run_workflow(registry, "p.gated", backend=ledger, clock=clock)
    assert json.loads(record.result_json) == [0, 1, 2]
    assert calls == {f"gated {i}": 2 for i in range(3)}
    assert {key for key, _, _ in steps(ledger, "test-execution")} == {"g[0]", "g[1]", "g[2]"}


def retry_first_two(i: int) -> int:
    """Items 0 and 1 ask to be retried (after 5 s and 2 s) on their first attempt; item 2 ends
    only after both have asked."""
    if called(f"retry {i}") == 1 and i < 2:
        event(f"raised {i}").set()
        raise RetryableError("later", interval=(5.0, 2.0)[i])
    if i == 2:
        wait("raised 0")
        wait("raised 1")
    return i


parallel_workflow("p.retry", "r", retry_first_two, [0, 1, 2])


@pytest.mark.timeout(60)
def test_items_retried_later_let_the_others_land_then_suspend_until_the_earliest_wake(ledger, clock):
    claimed_at = clock.now
    assert deliver(ledger, "test-execution", "p.retry") == Suspended()
    recorded = {key: (attempt, done) for key, attempt, done in steps(ledger, "test-execution")}
    assert recorded == {"r[0]": (1, False), "r[1]": (1, False), "r[2]": (1, True)}
    assert ledger.executions.get("test-execution").due_at == claimed_at + 2000
    record = run_workflow(registry, "p.retry", backend=ledger, clock=clock)
    assert record.status == "completed" and json.loads(record.result_json) == [0, 1, 2]
    assert calls == {"retry 0": 2, "retry 1": 2, "retry 2": 1}
    # Three deliveries: the first, item 1's retry at +2 s, item 0's at +5 s.
    assert [h.outcome for h in ledger.executions.history("test-execution")] == [
        "suspended", "suspended", "completed"]


def busy_second(i: int) -> int:
    called(f"busy {i}")
    if i == 1:
        raise StorageBusy("database is locked")
    return i


parallel_workflow("p.busy", "b", busy_second, [0, 1, 2], max_concurrency=1)


@pytest.mark.timeout(30)
def test_a_storage_error_in_one_item_ends_the_delivery_as_a_retry_and_starts_no_other_item(sqlite_backend):
    outcome = deliver(sqlite_backend, "test-execution", "p.busy")
    assert isinstance(outcome, Retry) and outcome.storage_error == "busy"
    assert calls == {"busy 0": 1, "busy 1": 1}
    assert steps(sqlite_backend, "test-execution") == [("b[0]", 1, True)]


def square(x):
    return x * x


@registry.workflow("p.bad")
def bad_arguments(ctx, input):
    refused = []
    for key, fn, items, kwargs in [("k", square, 5, {}), ("k", square, "abc", {}),
                                   ("k", square, [1], {"max_concurrency": 0}),
                                   ("k", square, [1], {"max_concurrency": True}),
                                   ("@k", square, [1], {}), ("", square, [1], {}), (None, square, [1], {}),
                                   ("k" * 253, square, range(10), {}), ("k", None, [1], {}),
                                   ("k", pause, [1], {})]:
        try:
            ctx.parallel(key, fn, items, **kwargs)
        except InvalidArgument as exc:
            refused.append(str(exc))
    return {"refused": refused, "then": ctx.parallel("k", square, (2, 3))}


@pytest.mark.timeout(30)
def test_bad_parallel_arguments_are_refused_naming_the_argument_and_nothing_is_written(sqlite_backend):
    outcome = deliver(sqlite_backend, "test-execution", "p.bad")
    assert isinstance(outcome, Completed)
    result = json.loads(outcome.result_json)
    named = ["items", "items", "max_concurrency", "max_concurrency", "step key", "step key", "step key",
             "at most 255", "fn", "coroutine function"]
    assert len(result["refused"]) == len(named)
    for message, name in zip(result["refused"], named):
        assert name in message, (name, message)
    # Nothing was written by the refused calls, and their key was still free for a good one.
    assert result["then"] == [4, 9]
    assert steps(sqlite_backend, "test-execution") == [("k[0]", 1, True), ("k[1]", 1, True)]


# -- under a real supervisor --------------------------------------------------------------------

APP = str(TESTS / "apps" / "parallel_app.py")


@pytest.mark.timeout(120)
def test_a_worker_killed_mid_parallel_is_replaced_and_each_item_runs_once_per_recorded_result(
        sqlite_path, sqlite_ledger, supervisors, tmp_path):
    log, gate = str(tmp_path / "effects.log"), str(tmp_path / "gate")
    admit(sqlite_path, "par", "par.items", {"log": log, "gate": gate, "n": 5, "hold_tokens": [1]})
    supervisors.start(sqlite_path, app=APP, concurrency=1)
    recorded = [f"item[{i}]" for i in range(4)]
    # Item 4 is held under token 1 while the other four are recorded: kill its worker then.
    held = wait_until(lambda: next((e for e in read_log(log) if e.step_key == "item[4]" and e.token == 1), None),
                      timeout=30)
    wait_until(lambda: sorted(key for key, _, _ in step_tokens(sqlite_path, "par")) == recorded, timeout=30)
    sigkill(held.pid)
    wait_gone([held.pid], timeout=10)
    wait_until(lambda: sqlite_ledger.executions.get("par").status == "completed", timeout=60)
    assert json.loads(sqlite_ledger.executions.get("par").result_json) == [0, 10, 20, 30, 40]
    events = read_log(log)
    begun = Counter(e.step_key for e in events if e.event == "begin")
    ended = Counter(e.step_key for e in events if e.event == "end")
    # One run per recorded result: the four recorded under token 1 never ran again; item 4,
    # killed before its end, ran once more and ended once.
    assert ended == {f"item[{i}]": 1 for i in range(5)}
    assert begun == {**{key: 1 for key in recorded}, "item[4]": 2}
    assert sorted(step_tokens(sqlite_path, "par")) == sorted([(key, 1, 1) for key in recorded] + [("item[4]", 1, 2)])
