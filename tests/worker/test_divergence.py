"""The order rule, divergence and patches (SPEC section 11, issue 30), in-process on each backend.

Each test runs an execution under one version of its workflow's code until it suspends (at the
timer `pause`), deploys another version (`code["ops"]`), and delivers it again. A replay that
diverges runs no step function, writes nothing (the whole ledger is compared before and after
the delivery, its claim aside) and ends as `Suspended(diverged=detail)`; a replay of unchanged
code, parallel groups included (recorded in another order, or only in part), never does.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import threading
import time
from collections import Counter

import pytest

from supervisor import Completed, Failed, LeaseLost, Suspended, open_backend
from worker import InvalidArgument, Registry
from worker._runtime.check import replay_check
from worker._runtime.driver import run_delivery
from worker._runtime.protocol import Done
from worker.testing import WorkflowStuck, run_workflow

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("dump_on_hang")]

LEASE_MS = 30_000
EID = "e1"
registry = Registry()
calls: Counter = Counter()
code: dict = {}
_lock = threading.Lock()


@pytest.fixture(autouse=True)
def fresh_state():
    calls.clear()
    code.clear()
    yield


@pytest.fixture
def ledger(each_backend, clock):
    with open_backend(each_backend, clock=clock, redelivery_delay=lambda n: 1) as opened:
        yield opened


def called(name: str) -> str:
    with _lock:
        calls[name] += 1
    return name


# Step functions with names of their own, for unnamed steps (keyed by their qualified name).
def charge():
    return called("charge")


def charge_v2():
    return called("charge_v2")


def ship():
    return called("ship")


def wrap():
    return called("wrap")


UNNAMED = {"charge": charge, "charge_v2": charge_v2, "ship": ship, "wrap": wrap}


def perform(ctx, op: str):
    """One operation of the deployed code: `pause` (a 1 s timer), `@fn` (an unnamed step),
    `effect:KEY`, `start:KEY`, `sleep:KEY`, `raise`, or a named step KEY."""
    if op == "pause":
        return ctx.sleep("pause", 1)
    if op == "raise":
        raise ValueError("the new code raises here")
    if op.startswith("@"):
        return ctx.run(UNNAMED[op[1:]])
    kind, _, key = op.partition(":")
    if kind == "effect" and key:
        return ctx.effect(key, lambda effect_id: called(key))
    if kind == "start" and key:
        return ctx.start(key, "child", None)
    if kind == "sleep" and key:
        return ctx.sleep(key, 0)
    return ctx.run(op, called, op)


@registry.workflow("seq")
def seq(ctx, input):
    return [perform(ctx, op) for op in code["ops"]]


@registry.workflow("child")
def child(ctx, input):
    return "child"


def claim(backend, execution_id=EID):
    """The lease of `execution_id`; child executions claimed on the way run to their end first."""
    for _ in range(10):
        (lease,) = backend.executions.claim_due(limit=1, duration=LEASE_MS)
        if lease.execution_id == execution_id:
            return lease
        backend.executions.acknowledge(lease, run_delivery(backend, lease, registry))
    raise AssertionError(f"{execution_id} was not claimed")


def deliver(backend, execution_id=EID, **kwargs):
    lease = claim(backend, execution_id)
    outcome = run_delivery(backend, lease, registry, claimed_at=lease.expires_at - LEASE_MS, **kwargs)
    if isinstance(outcome, (Suspended, Completed, Failed)):
        backend.executions.acknowledge(lease, outcome)
    return outcome


def steps(backend, execution_id=EID) -> list[tuple[str, int, bool]]:
    return [(r.step_key, r.attempt, r.done) for r in backend.executions.get_with_steps(execution_id)[1]]


def first_run(ledger, ops: list[str]) -> list[str]:
    """Admit `seq` and run it under `ops` until it suspends at `pause`; returns the step keys."""
    code["ops"] = ops
    ledger.executions.admit(EID, "seq", "null")
    assert deliver(ledger) == Suspended()
    calls.clear()
    return [key for key, _, _ in steps(ledger)]


def deploy_and_deliver(ledger, clock, each_backend, db_snapshot, ops: list[str]):
    """Deploy `ops`, let the timer pass, and run one delivery; if it diverged, check that it
    ran nothing and wrote nothing."""
    code["ops"] = ops
    clock.advance(2_000)
    lease = claim(ledger)
    before = db_snapshot(each_backend)
    outcome = run_delivery(ledger, lease, registry, claimed_at=lease.expires_at - LEASE_MS)
    if isinstance(outcome, Suspended) and outcome.diverged:
        assert db_snapshot(each_backend) == before  # no step, timer, effect, start or wake
        assert calls == Counter()  # no step function ran
    if isinstance(outcome, (Suspended, Completed, Failed)):
        ledger.executions.acknowledge(lease, outcome)
    return outcome


# -- what diverges ------------------------------------------------------------------------------

DIVERGING = {
    # name: (ops of the first run, ops deployed, the detail)
    "rename": (["a", "charge", "pause", "ship"], ["a", "charge-v2", "pause", "ship"],
               "recorded step 'charge' was next, but the code reached 'charge-v2'"),
    "add in the middle": (["a", "b", "pause"], ["a", "x", "b", "pause"],
                          "recorded step 'b' was next, but the code reached 'x'"),
    "add at the end of the history": (["a", "b", "pause"], ["a", "b", "x", "pause"],
                                      "recorded step 'pause' was next, but the code reached 'x'"),
    "remove in the middle": (["a", "b", "pause"], ["a", "pause"],
                             "recorded step 'b' was next, but the code reached 'pause'"),
    "remove at the end": (["a", "b", "pause"], ["a", "b"],
                          "the workflow returned while recorded step 'pause' was not reached"),
    "reorder": (["a", "b", "pause"], ["b", "a", "pause"],
                "recorded step 'a' was next, but the code reached 'b'"),
    "raise before the end": (["a", "b", "pause"], ["a", "raise"],
                             "the workflow raised while recorded step 'b' was not reached"),
    "unnamed rename": (["@charge", "pause", "@ship"], ["@charge_v2", "pause", "@ship"],
                       "recorded step '@1:charge' was next, but the code reached '@1:charge_v2'"),
    "unnamed add": (["@charge", "@ship", "pause"], ["@charge", "@wrap", "@ship", "pause"],
                    "recorded step '@2:ship' was next, but the code reached '@2:wrap'"),
    "unnamed remove": (["@charge", "@ship", "pause"], ["@charge", "pause"],
                       "recorded step '@2:ship' was next, but the code reached 'pause'"),
    "unnamed remove at the end": (["@charge", "@ship", "pause"], ["@charge", "@ship"],
                                  "the workflow returned while recorded step 'pause' was not reached"),
    "unnamed reorder": (["@charge", "@ship", "pause"], ["@ship", "@charge", "pause"],
                        "recorded step '@1:charge' was next, but the code reached '@1:ship'"),
    "an effect renamed": (["a", "effect:pay", "pause"], ["a", "effect:pay-v2", "pause"],
                          "recorded step 'pay' was next, but the code reached 'pay-v2'"),
    "a start added": (["a", "pause"], ["a", "start:kid", "pause"],
                      "recorded step 'pause' was next, but the code reached 'kid'"),
    "a timer added": (["a", "b", "pause"], ["a", "sleep:nap", "b", "pause"],
                      "recorded step 'b' was next, but the code reached 'nap'"),
    "a start moved before an effect": (["effect:pay", "start:kid", "pause"], ["start:kid", "effect:pay", "pause"],
                                       "recorded step 'pay' was next, but the code reached 'kid'"),
}


@pytest.mark.parametrize("case", DIVERGING)
def test_a_changed_workflow_parks_without_running_or_writing_anything(ledger, clock, each_backend, db_snapshot,
                                                                     case):
    before, after, detail = DIVERGING[case]
    recorded = first_run(ledger, before)

    outcome = deploy_and_deliver(ledger, clock, each_backend, db_snapshot, after)

    assert outcome == Suspended(diverged=detail)
    assert [key for key, _, _ in steps(ledger)] == recorded
    record = ledger.executions.get(EID)
    assert record.status == "suspended" and record.error_json is None


@pytest.mark.parametrize("ops, expected", [
    (["a", "b", "pause", "c"], ["a", "b", None, "c"]),
    (["@charge", "effect:pay", "start:kid", "pause", "@ship"], ["charge", "pay", "e1/kid", None, "ship"]),
])
def test_unchanged_code_replays_to_its_end(ledger, clock, each_backend, db_snapshot, ops, expected):
    first_run(ledger, ops)

    outcome = deploy_and_deliver(ledger, clock, each_backend, db_snapshot, ops)

    assert outcome == Completed(json.dumps(expected))
    assert calls == Counter({op.lstrip("@"): 1 for op in ops[ops.index("pause") + 1:]})


def test_steps_added_beyond_the_recorded_history_run(ledger, clock, each_backend, db_snapshot):
    first_run(ledger, ["a", "pause"])

    outcome = deploy_and_deliver(ledger, clock, each_backend, db_snapshot, ["a", "pause", "b", "@ship"])

    assert outcome == Completed(json.dumps(["a", None, "b", "ship"]))
    assert calls == Counter({"b": 1, "ship": 1})


def test_a_retried_step_is_placed_by_its_first_record(ledger, clock):
    """Several attempts of one step are one step: its first record places it."""
    attempts = Counter()

    @registry.workflow("retried")
    def retried(ctx, input):
        from worker import RetryableError

        def flaky():
            attempts["flaky"] += 1
            if attempts["flaky"] < 3:
                raise RetryableError("not yet", max_attempts=5, interval=0.001)
            return "ok"
        return [ctx.run("a", called, "a"), ctx.run("flaky", flaky), ctx.run("b", called, "b")]

    record = run_workflow(registry, "retried", backend=ledger, clock=clock)

    assert record.status == "completed" and attempts["flaky"] == 3
    assert [key for key, _, _ in steps(ledger, "test-execution")] == ["a", "flaky", "flaky", "flaky", "b"]


def test_the_diverged_outcome_crosses_the_worker_pipe_with_its_detail():
    detail = "recorded step 'charge' was next, but the code reached 'charge-v2'"
    done = pickle.loads(pickle.dumps(Done(EID, 3, Suspended(diverged=detail), 12)))
    assert done.outcome == Suspended(diverged=detail) and done.outcome.status == "suspended"
    assert pickle.loads(pickle.dumps(Suspended())) == Suspended(diverged=None)


def test_run_workflow_names_the_divergence(ledger, clock):
    first_run(ledger, ["a", "pause"])
    code["ops"] = ["b", "pause"]
    with pytest.raises(WorkflowStuck, match="recorded step 'a' was next, but the code reached 'b'"):
        run_workflow(registry, "seq", backend=ledger, clock=clock, execution_id=EID)


# -- async workflows ----------------------------------------------------------------------------

@registry.workflow("aseq")
async def aseq(ctx, input):
    out = []
    for op in code["ops"]:
        if op == "pause":
            out.append(await ctx.sleep("pause", 1))
        elif op.startswith("@"):
            out.append(await ctx.run(UNNAMED[op[1:]]))
        elif op.startswith("effect:"):
            out.append(await ctx.effect(op[7:], lambda effect_id, key=op[7:]: called(key)))
        else:
            out.append(await ctx.run(op, called, op))
    return out


@pytest.mark.parametrize("before, after, detail", [
    (["a", "charge", "pause"], ["a", "charge-v2", "pause"],
     "recorded step 'charge' was next, but the code reached 'charge-v2'"),
    (["@charge", "@ship", "pause"], ["@ship", "@charge", "pause"],
     "recorded step '@1:charge' was next, but the code reached '@1:ship'"),
    (["a", "effect:pay", "pause"], ["a", "pause"], "recorded step 'pay' was next, but the code reached 'pause'"),
])
def test_an_async_workflow_changed_parks_too(ledger, clock, each_backend, db_snapshot, before, after, detail):
    code["ops"] = before
    ledger.executions.admit(EID, "aseq", "null")
    assert deliver(ledger) == Suspended()
    calls.clear()

    code["ops"] = after
    clock.advance(2_000)
    lease = claim(ledger)
    snapshot = db_snapshot(each_backend)
    outcome = run_delivery(ledger, lease, registry)

    assert outcome == Suspended(diverged=detail)
    assert db_snapshot(each_backend) == snapshot and calls == Counter()


# -- parallel groups: never a false divergence --------------------------------------------------

async def ended_after(key: str, after: list[str]) -> str:
    """Ends only once every step in `after` has ended (so steps land in another order than they
    started), with a deadline."""
    deadline = time.monotonic() + 10
    while not all(calls[other] for other in after):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{after} did not end")
        await asyncio.sleep(0.001)
    return called(key)


@registry.workflow("gathered")
async def gathered(ctx, input):
    # "a" starts first and ends last; "c" ends first: recorded c, b, a.
    values = await asyncio.gather(ctx.run("a", ended_after, "a", ["b", "c"]),
                                  ctx.run("b", ended_after, "b", ["c"]),
                                  ctx.run("c", ended_after, "c", []))
    await ctx.sleep("pause", 1)
    return [*values, await ctx.run("after", called, "after")]


def test_a_gather_recorded_in_another_order_than_it_started_replays(ledger, clock):
    ledger.executions.admit(EID, "gathered", "null")
    assert deliver(ledger) == Suspended()
    assert [key for key, _, _ in steps(ledger)] == ["c", "b", "a", "pause"]
    groups = [json.loads(r.step_response_json).get("group") for r in ledger.executions.get_with_steps(EID)[1]]
    assert groups == ["a", "a", "a", None]

    clock.advance(2_000)
    assert deliver(ledger) == Completed(json.dumps(["a", "b", "c", "after"]))
    assert calls == Counter({"a": 1, "b": 1, "c": 1, "after": 1})


@pytest.mark.parametrize("cut, late", [("a", None), ("b", None), ("b", "c")])
def test_a_gather_recorded_only_in_part_replays_and_runs_the_rest(ledger, clock, cut, late):
    """The delivery stops (its supervisor goes silent) once the other two steps are recorded:
    the first step to start (which names the group) or a middle one is left unrecorded. With
    `late`, that step's task awaits something else before it starts its step, so a replay
    reaches it only after the unrecorded one has started."""
    others = [key for key in "abc" if key != cut]
    silent = lambda: not all(ledger.heap.read_step(EID, key) for key in others)  # noqa: E731
    code["slow"], code["late"] = cut, late

    @registry.workflow("gathered_cut")
    async def gathered_cut(ctx, input):
        async def step(key):
            if key == code["slow"]:
                return await ended_after(key, others)
            return called(key)
        async def start(key):
            if key == code["late"]:
                await asyncio.sleep(0.05)
            return await ctx.run(key, step, key)
        values = await asyncio.gather(*map(start, "abc"))
        return [*values, await ctx.run("after", called, "after")]

    ledger.executions.admit(EID, "gathered_cut", "null")
    assert deliver(ledger, may_write=silent) == LeaseLost()
    assert sorted(key for key, _, _ in steps(ledger)) == others
    clock.advance(LEASE_MS)

    record = run_workflow(registry, "gathered_cut", backend=ledger, clock=clock, execution_id=EID)

    assert record.status == "completed" and json.loads(record.result_json) == ["a", "b", "c", "after"]
    assert calls[cut] == 2 and all(calls[key] == 1 for key in others) and calls["after"] == 1


@registry.workflow("gathered_v")
async def gathered_v(ctx, input):
    """A gather whose step keys the deployed code names (`code["keys"]`), then a pause."""
    values = await asyncio.gather(*(ctx.run(key, called, key) for key in code["keys"]))
    await ctx.sleep("pause", 1)
    return values


def test_a_gather_recorded_before_groups_existed_replays_in_any_order(ledger, clock):
    """Old records carry no group: the gather's steps, recorded in the order they ended, are
    reached within one pass of the event loop, which is enough."""
    code["keys"] = ["a", "b", "c"]
    ledger.executions.admit(EID, "gathered_v", "null")
    lease = claim(ledger)
    for key in ("c", "a", "b"):
        ledger.heap.write_step(lease, step_key=key, step_attempt=1, done=True,
                               step_response_json=json.dumps({"value": key}))
    ledger.heap.write_step(lease, step_key="pause", step_attempt=1, done=True,
                           step_response_json=json.dumps({"until": 0}))
    ledger.executions.acknowledge(lease, Suspended())
    ledger.executions.request_wake(EID, clock.now)

    assert deliver(ledger) == Completed(json.dumps(["a", "b", "c"]))
    assert calls == Counter()


def test_a_step_of_a_gather_renamed_while_the_others_are_recorded_diverges(ledger, clock, each_backend,
                                                                          db_snapshot):
    code["keys"] = ["a", "b", "c"]
    ledger.executions.admit(EID, "gathered_v", "null")
    assert deliver(ledger) == Suspended()
    calls.clear()
    code["keys"] = ["a", "b-v2", "c"]

    outcome = deploy_and_deliver(ledger, clock, each_backend, db_snapshot, [])

    assert outcome == Suspended(diverged="recorded step 'b' was next, but the code reached 'b-v2'")


def test_a_step_added_after_a_gather_diverges_and_one_beyond_the_history_runs(ledger, clock):
    code["keys"] = ["a", "b"]
    ledger.executions.admit(EID, "gathered_v", "null")
    assert deliver(ledger) == Suspended()
    code["keys"] = ["a", "b", "c"]
    clock.advance(2_000)

    assert deliver(ledger) == Suspended(diverged="recorded step 'pause' was next, but the code reached 'c'")


def outer_step(ctx, key: str) -> str:
    """A step that runs another step from inside its own function."""
    return called(key) + "+" + ctx.run(f"{key}.inner", called, f"{key}.inner")


async def async_outer_step(ctx, key: str) -> str:
    return called(key) + "+" + await ctx.run(f"{key}.inner", called, f"{key}.inner")


@registry.workflow("nested")
def nested(ctx, input):
    out = [ctx.run("outer", outer_step, ctx, "outer")]
    ctx.sleep("pause", 1)
    return [*out, ctx.run("after", called, "after")]


@registry.workflow("anested")
async def anested(ctx, input):
    out = list(await asyncio.gather(ctx.run("outer", async_outer_step, ctx, "outer"), ctx.run("other", called, "other")))
    await ctx.sleep("pause", 1)
    return [*out, await ctx.run("after", called, "after")]


@pytest.mark.parametrize("workflow, expected", [
    ("nested", ["outer+outer.inner", "after"]), ("anested", ["outer+outer.inner", "other", "after"])])
def test_steps_started_inside_a_replayed_step_are_not_waited_for(ledger, clock, workflow, expected):
    ledger.executions.admit(EID, workflow, "null")
    assert deliver(ledger) == Suspended()
    inner = [json.loads(r.step_response_json) for r in ledger.executions.get_with_steps(EID)[1]
             if r.step_key == "outer.inner"]
    assert inner[0]["within"] == "outer"
    clock.advance(2_000)

    assert deliver(ledger) == Completed(json.dumps(expected))
    assert calls["outer"] == 1 and calls["outer.inner"] == 1 and calls["after"] == 1


class Crash(BaseException):
    """Stands in for the worker process dying inside a step: nothing of that step is recorded."""


def reversed_item(i: int) -> int:
    """Item i ends only once every later item of 0..3 has ended: recorded 3, 2, 1, 0."""
    deadline = time.monotonic() + 10
    while not all(calls[f"item {j}"] for j in range(i + 1, 4)):
        if time.monotonic() > deadline:
            raise TimeoutError("the later items did not end")
        time.sleep(0.001)
    called(f"item {i}")
    if i in code.get("crash", ()):
        raise Crash()
    return i


async def async_reversed_item(i: int) -> int:
    deadline = time.monotonic() + 10
    while not all(calls[f"item {j}"] for j in range(i + 1, 4)):
        if time.monotonic() > deadline:
            raise TimeoutError("the later items did not end")
        await asyncio.sleep(0.001)
    called(f"item {i}")
    if i in code.get("crash", ()):
        raise Crash()
    return i


@registry.workflow("parallel_sync")
def parallel_sync(ctx, input):
    if code.get("v2"):
        ctx.run("before", called, "before")
    values = ctx.parallel("p", reversed_item, range(4))
    ctx.sleep("pause", 1)
    return [*values, ctx.run("after", called, "after")]


@registry.workflow("parallel_async")
async def parallel_async(ctx, input):
    values = await ctx.parallel("p", async_reversed_item, range(4))
    await ctx.sleep("pause", 1)
    return [*values, await ctx.run("after", called, "after")]


@pytest.mark.parametrize("workflow", ["parallel_sync", "parallel_async"])
def test_a_parallel_call_recorded_in_another_order_replays(ledger, clock, workflow):
    ledger.executions.admit(EID, workflow, "null")
    assert deliver(ledger) == Suspended()
    # Each item ends after every later one, so they are recorded out of index order (as a rule
    # 3, 2, 1, 0; on a busy machine an item may be recorded a moment after the next one).
    recorded = [key for key, _, _ in steps(ledger)]
    assert sorted(recorded[:4]) == ["p[0]", "p[1]", "p[2]", "p[3]"] and recorded[4] == "pause"
    assert recorded[:4] != ["p[0]", "p[1]", "p[2]", "p[3]"]

    clock.advance(2_000)
    assert deliver(ledger) == Completed(json.dumps([0, 1, 2, 3, "after"]))
    assert calls == Counter({**{f"item {i}": 1 for i in range(4)}, "after": 1})


@pytest.mark.parametrize("workflow", ["parallel_sync", "parallel_async"])
def test_a_parallel_call_recorded_only_in_part_replays_and_runs_the_rest(ledger, clock, workflow):
    code["crash"] = {0, 1}  # items 0 and 1 die unrecorded, after 3 and 2 ended
    ledger.executions.admit(EID, workflow, "null")
    with pytest.raises(Crash):
        deliver(ledger)
    assert sorted(key for key, _, _ in steps(ledger)) == ["p[2]", "p[3]"]
    code["crash"] = set()
    clock.advance(LEASE_MS)

    record = run_workflow(registry, workflow, backend=ledger, clock=clock, execution_id=EID)

    assert record.status == "completed" and json.loads(record.result_json) == [0, 1, 2, 3, "after"]
    assert calls == Counter({"item 0": 2, "item 1": 2, "item 2": 1, "item 3": 1, "after": 1})


def test_a_step_moved_before_a_parallel_call_diverges(ledger, clock, each_backend, db_snapshot):
    ledger.executions.admit(EID, "parallel_sync", "null")
    assert deliver(ledger) == Suspended()
    calls.clear()
    code["v2"] = True

    outcome = deploy_and_deliver(ledger, clock, each_backend, db_snapshot, [])

    assert outcome == Suspended(diverged="recorded step 'p[3]' was next, but the code reached 'before'")


def test_old_records_without_groups_replay_a_parallel_call_in_any_order(ledger, clock):
    """Records written before groups existed: the items of a parallel call are one step still."""
    ledger.executions.admit(EID, "parallel_sync", "null")
    lease = claim(ledger)
    for i in (2, 0, 3, 1):
        ledger.heap.write_step(lease, step_key=f"p[{i}]", step_attempt=1, done=True,
                               step_response_json=json.dumps({"value": i}))
    ledger.heap.write_step(lease, step_key="pause", step_attempt=1, done=True,
                           step_response_json=json.dumps({"until": 0}))
    ledger.executions.acknowledge(lease, Suspended())
    ledger.executions.request_wake(EID, clock.now)

    assert deliver(ledger) == Completed(json.dumps([0, 1, 2, 3, "after"]))
    assert calls == Counter({"after": 1})


# -- patches ------------------------------------------------------------------------------------

@registry.workflow("patched")
def patched_workflow(ctx, input):
    out = [ctx.run("a", called, "a")]
    if code.get("patched"):
        if ctx.patched("fee"):
            out.append(ctx.run("fee", called, "fee"))
        assert ctx.patched("fee") == ("fee" in out)  # the same answer for the rest of the run
    ctx.sleep("pause", 1)
    out.append(ctx.run("b", called, "b"))
    return out


@registry.workflow("apatched")
async def apatched_workflow(ctx, input):
    out = [await ctx.run("a", called, "a")]
    if code.get("patched") and ctx.patched("fee"):  # not awaited
        out.append(await ctx.run("fee", called, "fee"))
    await ctx.sleep("pause", 1)
    out.append(await ctx.run("b", called, "b"))
    return out


@pytest.mark.parametrize("workflow", ["patched", "apatched"])
def test_an_execution_started_before_the_patch_keeps_its_old_path(ledger, clock, workflow):
    ledger.executions.admit(EID, workflow, "null")
    assert deliver(ledger) == Suspended()
    code["patched"] = True
    clock.advance(2_000)

    assert deliver(ledger) == Completed(json.dumps(["a", "b"]))
    assert [key for key, _, _ in steps(ledger)] == ["a", "pause", "b"]  # no marker
    assert calls["fee"] == 0


@pytest.mark.parametrize("workflow", ["patched", "apatched"])
def test_an_execution_started_after_the_patch_records_its_marker_and_keeps_the_new_path(ledger, clock, workflow):
    code["patched"] = True
    ledger.executions.admit(EID, workflow, "null")
    assert deliver(ledger) == Suspended()
    assert [key for key, _, _ in steps(ledger)] == ["a", "@0:patch:fee", "fee", "pause"]
    clock.advance(2_000)

    assert deliver(ledger) == Completed(json.dumps(["a", "fee", "b"]))  # the replay met the marker
    assert calls == Counter({"a": 1, "fee": 1, "b": 1})


def test_a_patch_removed_while_its_marker_is_recorded_diverges(ledger, clock, each_backend, db_snapshot):
    code["patched"] = True
    ledger.executions.admit(EID, "patched", "null")
    assert deliver(ledger) == Suspended()
    calls.clear()
    code["patched"] = False
    clock.advance(2_000)
    lease = claim(ledger)

    outcome = run_delivery(ledger, lease, registry)

    assert outcome == Suspended(diverged="recorded step '@0:patch:fee' was next, but the code reached 'pause'")


@pytest.mark.parametrize("bad, message", [
    ("", "must not be empty"), ("x" * 247, "at most 246"), (42, "must be a str, not int"),
    ("new\nfee", "control character")])
@pytest.mark.parametrize("workflow", ["bad_patch", "abad_patch"])
def test_a_bad_patch_id_is_an_invalid_argument_and_writes_nothing(ledger, clock, bad, message, workflow):
    code["bad"] = bad
    ledger.executions.admit(EID, workflow, "null")

    outcome = deliver(ledger)

    error = json.loads(outcome.error_json)
    assert error["type"] == InvalidArgument.__name__ and message in error["message"]
    assert steps(ledger) == []


@registry.workflow("bad_patch")
def bad_patch(ctx, input):
    return ctx.patched(code["bad"])


@registry.workflow("abad_patch")
async def abad_patch(ctx, input):
    return ctx.patched(code["bad"])


# -- the check ----------------------------------------------------------------------------------

def check(ledger, execution_id=EID):
    execution, recorded = ledger.executions.get_with_steps(execution_id)
    return replay_check(ledger, execution, recorded, registry)


@pytest.mark.parametrize("case", ["rename", "remove at the end", "unnamed reorder", "an effect renamed"])
def test_the_check_finds_the_divergence_without_running_or_writing_anything(ledger, clock, each_backend,
                                                                            db_snapshot, case):
    before, after, detail = DIVERGING[case]
    first_run(ledger, before)
    code["ops"] = after
    snapshot = db_snapshot(each_backend)

    assert check(ledger) == detail
    assert db_snapshot(each_backend) == snapshot and calls == Counter()


@pytest.mark.parametrize("ops, after", [
    (["a", "effect:pay", "start:kid", "pause", "b"], ["a", "effect:pay", "start:kid", "pause", "b", "c"]),
    (["@charge", "pause"], ["@charge", "pause", "@ship"]),
])
def test_the_check_passes_unchanged_code_and_stops_at_the_first_step_not_recorded(
        ledger, clock, each_backend, db_snapshot, ops, after):
    first_run(ledger, ops)
    code["ops"] = after
    snapshot = db_snapshot(each_backend)

    assert check(ledger) is None
    assert db_snapshot(each_backend) == snapshot and calls == Counter()  # "b" and later never ran


@pytest.mark.parametrize("workflow", ["gathered", "parallel_sync", "parallel_async", "apatched"])
def test_the_check_passes_parallel_groups_and_async_workflows(ledger, clock, each_backend, db_snapshot, workflow):
    ledger.executions.admit(EID, workflow, "null")
    assert deliver(ledger) == Suspended()
    calls.clear()
    code["patched"] = True  # a patch deployed since: the old path, so no divergence either
    snapshot = db_snapshot(each_backend)

    assert check(ledger) is None
    assert db_snapshot(each_backend) == snapshot and calls == Counter()


def test_the_check_finds_an_async_divergence(ledger, clock):
    code["ops"] = ["a", "b", "pause"]
    ledger.executions.admit(EID, "aseq", "null")
    assert deliver(ledger) == Suspended()
    code["ops"] = ["b", "a", "pause"]

    assert check(ledger) == "recorded step 'a' was next, but the code reached 'b'"


def test_the_check_of_many_executions_takes_milliseconds_each(tmp_path, clock):
    with open_backend(tmp_path / "many.db", clock=clock) as ledger:
        code["ops"] = ["a", "b", "pause"]
        for i in range(200):
            ledger.executions.admit(f"e{i}", "seq", "null")
            deliver(ledger, f"e{i}")
        code["ops"] = ["a", "x", "pause"]
        found = [ledger.executions.get_with_steps(f"e{i}") for i in range(200)]
        started = time.perf_counter()
        details = [replay_check(ledger, execution, recorded, registry) for execution, recorded in found]
        elapsed = time.perf_counter() - started

    assert set(details) == {"recorded step 'b' was next, but the code reached 'x'"}
    assert elapsed < 2.0, f"{elapsed / 200 * 1000:.2f} ms per execution"


def test_a_divergence_detail_is_cut_to_what_the_ledger_takes():
    from supervisor.ledger.arguments import MAX_DETAIL_LENGTH
    from worker._runtime.unwinding import ReplayDiverged

    detail = ReplayDiverged("recorded step 'a' was next, but the code reached '" + "b" * 5000 + "'").detail
    assert len(detail) == MAX_DETAIL_LENGTH and detail.endswith("…")
    assert ReplayDiverged("short").detail == "short"
