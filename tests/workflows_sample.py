"""Sample workflows for the worker SDK's tests: importable, top-level, on their own registry.

Tests drive these through `worker._runtime.driver.run_delivery` or `worker.testing.run_workflow` with
`registry` (this module's own `Registry`, so nothing here leaks into `worker.default_registry`).

Three pieces of module state let a test see and steer what happens across deliveries; an
autouse fixture in each test module calls `reset()` before every test:

- `calls`: how many times each step function (and each workflow function) really ran, over all
  deliveries, so a test can tell a replayed step from one that ran again;
- `hooks`: `hooks[name](value)` runs inside the step function `note(name, value)`; it may raise,
  take the lease over from another holder, or return a value that replaces the step's result;
- `flags`: switches a workflow reads to take another path (nondeterministic replay);
- `seen`: values the workflow function itself observed, in order, fresh and on replay.
"""

from __future__ import annotations

import collections
import datetime as dt
import itertools
from typing import Any, Callable

from worker import Registry, RetryableError, RetryPolicy, StepFailed
from worker._runtime.unwinding import Suspend

registry = Registry()
workflow = registry.workflow

calls: collections.Counter = collections.Counter()
hooks: dict[str, Callable[[Any], Any]] = {}
flags: dict[str, Any] = {}
seen: list[Any] = []


def reset() -> None:
    calls.clear()
    hooks.clear()
    flags.clear()
    seen.clear()


# -- step functions ---------------------------------------------------------------------------

def note(name: str, value: Any = None) -> Any:
    """A step body: counts its call, runs `hooks[name]` if any, and returns `value` (or the
    hook's result when that is not None)."""
    calls[name] += 1
    hook = hooks.get(name)
    if hook is not None:
        replaced = hook(value)
        if replaced is not None:
            return replaced
    return value


def make_tuple() -> tuple:
    calls["make_tuple"] += 1
    return (1, "two", {"three": [3, (4,)]})


def echo(value: Any) -> Any:
    calls["echo"] += 1
    return value


def step_a() -> str:
    calls["step_a"] += 1
    return "a"


def step_b() -> str:
    calls["step_b"] += 1
    return "b"


def flaky(name: str, failures: int, max_attempts: int, interval: float) -> str:
    """Raises `RetryableError` on its first `failures` calls, then succeeds."""
    calls[name] += 1
    if calls[name] <= failures:
        raise RetryableError(f"{name} not yet ({calls[name]})", max_attempts=max_attempts, interval=interval)
    return f"{name} ok after {calls[name]}"


def declined(name: str) -> str:
    """Always fails with an ordinary error; only a retry policy makes it retried."""
    calls[name] += 1
    raise ValueError("card declined")


class Opaque:
    """A step result JSON cannot hold."""


def make_opaque() -> Opaque:
    calls["make_opaque"] += 1
    return Opaque()


def make_nan() -> float:
    calls["make_nan"] += 1
    return float("nan")


# -- workflows --------------------------------------------------------------------------------

@workflow("abc")
def abc(ctx, input):
    """Three steps, each building on the last."""
    calls["workflow:abc"] += 1
    a = ctx.run("a", note, "a", "a")
    b = ctx.run("b", note, "b", a + "b")
    c = ctx.run("c", note, "c", b + "c")
    return [a, b, c]


@workflow("timer_between_steps")
def timer_between_steps(ctx, input):
    calls["workflow:timer_between_steps"] += 1
    first = ctx.run("first", note, "first", input["x"])
    ctx.sleep("pause", 10)
    second = ctx.run("second", note, "second", first + 1)
    return {"first": first, "second": second}


@workflow("data_flow")
def data_flow(ctx, input):
    made = ctx.run("make", make_tuple)
    seen.append(made)
    echoed = ctx.run("echo", echo, made)
    seen.append(echoed)
    ctx.sleep("pause", 1)
    return {"made": made, "echoed": echoed}


@workflow("retrying")
def retrying(ctx, input):
    """A step that raises RetryableError `failures` times before it succeeds."""
    before = ctx.run("before", note, "before", "ready")
    try:
        value = ctx.run("flaky", flaky, "flaky", input["failures"], input["max_attempts"], input["interval"])
    except StepFailed as exc:
        if not input.get("catch"):
            raise
        return {"before": before, "error_type": exc.error_type, "error_message": exc.error_message,
                "attempts": exc.attempts, "step_key": exc.step_key}
    return {"before": before, "value": value}


@workflow("retry_policy")
def retry_policy(ctx, input):
    """An ordinary error retried by a per-step RetryPolicy; uncaught once exhausted unless `catch`."""
    policy = RetryPolicy(**input["policy"]) if input.get("policy") else None
    try:
        return ctx.run("charge", declined, "charge", retry=policy)
    except StepFailed as exc:
        if not input.get("catch"):
            raise
        return {"error_type": exc.error_type, "error_message": exc.error_message, "attempts": exc.attempts}


@workflow("sleeper")
def sleeper(ctx, input):
    """Sleeps by `ctx.sleep` (input seconds), or until an aware datetime or epoch seconds."""
    calls["workflow:sleeper"] += 1
    kind = input["kind"]
    if kind == "sleep":
        ctx.sleep("nap", input["seconds"])
    elif kind == "datetime":
        ctx.sleep_until("nap", dt.datetime.fromtimestamp(input["at_ms"] / 1000, tz=dt.timezone.utc))
    else:
        ctx.sleep_until("nap", input["at_ms"] / 1000)
    return ctx.run("woke", note, "woke", ctx.now_ms())


@workflow("swallow_except_exception")
def swallow_except_exception(ctx, input):
    try:
        ctx.sleep("nap", 10)
    except Exception:
        calls["swallowed"] += 1
    ctx.run("after", note, "after", "after")
    return "carried on"


@workflow("swallow_bare")
def swallow_bare(ctx, input):
    """Swallows the suspension with a bare except, then tries to go on as `input` says."""
    try:
        ctx.sleep("nap", 10)
    except:  # noqa: E722 - the point of this workflow
        calls["swallowed"] += 1
    if input == "continue":
        for i in range(3):
            try:
                ctx.run(f"after{i}", note, "after", i)
            except:  # noqa: E722
                calls["swallowed"] += 1
        return "carried on"
    if input == "raise":
        raise RuntimeError("turned the suspension into an error")
    return "returned"


@workflow("unnamed")
def unnamed(ctx, input):
    """Two unnamed steps around a timer; `flags["swapped"]` changes their order."""
    first, second = (step_b, step_a) if flags.get("swapped") else (step_a, step_b)
    one = ctx.run(first)
    ctx.sleep("pause", 1)
    two = ctx.run(second)
    return one + two


@workflow("reserved_key")
def reserved_key(ctx, input):
    return ctx.run("@mine", note, "reserved", 1)


@workflow("key_twice")
def key_twice(ctx, input):
    ctx.run("same", note, "once", 1)
    return ctx.run("same", note, "twice", 2)


@workflow("non_serialisable_step")
def non_serialisable_step(ctx, input):
    try:
        ctx.run("opaque", make_nan if input == "nan" else make_opaque)
    except StepFailed as exc:
        return {"step_key": exc.step_key, "error_type": exc.error_type, "error_message": exc.error_message}
    return "unreachable"


@workflow("non_serialisable_result")
def non_serialisable_result(ctx, input):
    ctx.run("fine", note, "fine", 1)
    return {1, 2, 3}


@workflow("charge_or_fallback")
def charge_or_fallback(ctx, input):
    """Catches every error of the charge step and takes a compensating path."""
    try:
        return ctx.run("charge", note, "charge", "charged")
    except Exception:
        return ctx.run("fallback", note, "fallback", "fell back")


@workflow("start_or_fallback")
def start_or_fallback(ctx, input):
    """Like `charge_or_fallback`, for a ledger call that is not a step: starting a child."""
    try:
        return ctx.start("child", "abc")
    except Exception:
        return ctx.run("fallback", note, "fallback", "fell back")


@workflow("order")
def order(ctx, input):
    """A small end-to-end workflow: steps, a timer, a retried step, a wall-clock deadline."""
    started = ctx.run("started", ctx.now_ms)  # recorded: a replay must not read the clock afresh
    reserved = ctx.run("reserve", note, "reserve", {"sku": input["sku"], "qty": input["qty"]})
    ctx.sleep("cool_off", 60)
    paid = ctx.run("pay", flaky, "pay", 2, 5, 30)
    ctx.sleep_until("ship_window", input["ship_at_ms"] / 1000)
    shipped = ctx.run("ship", note, "ship", ctx.now_ms() - started)
    return {"reserved": reserved, "paid": paid, "shipped_after_ms": shipped}


@workflow("forever")
def forever(ctx, input):
    """Sleeps a minute at a time and never finishes."""
    for i in itertools.count():
        ctx.sleep(f"tick{i}", 60)


@workflow("waits_for_nothing")
def waits_for_nothing(ctx, input):
    """Suspends without asking for any wake, as a wait on an outside event would."""
    raise Suspend("waiting for an event that never comes")
