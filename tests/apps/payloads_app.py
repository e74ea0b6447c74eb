"""Workflows whose steps and results are as large as their input says, for the tests of the
payload limit in supervised runs (`tests/supervisor/test_payload_limits_supervised.py`).

Each step counts its calls in a file (`input["calls"]`), so a test sees whether a step too
large to record was tried again.
"""

from __future__ import annotations

from worker import PayloadTooLarge, RetryPolicy, StepFailed, workflow


def _counted(path: str, size: int) -> str:
    with open(path, "a") as calls:
        calls.write("x")
    return "x" * size


@workflow("pl.step_caught")
def step_caught(ctx, input):
    """A step's result too large to record, caught by the workflow, which goes on."""
    try:
        ctx.run("charge", _counted, input["calls"], input["size"], retry=RetryPolicy(max_attempts=3, interval=0.01))
    except StepFailed as exc:
        return {"step": exc.step_key, "type": exc.error_type, "message": exc.error_message, "attempts": exc.attempts,
                "after": ctx.run("after", lambda: "went on")}
    return "recorded"


@workflow("pl.step_uncaught")
def step_uncaught(ctx, input):
    """A step's result too large to record, not caught: the workflow fails with StepFailed."""
    return ctx.run("charge", _counted, input["calls"], input["size"])


@workflow("pl.async_step")
async def async_step(ctx, input):
    """`pl.step_caught` as an async workflow."""
    try:
        await ctx.run("charge", _counted, input["calls"], input["size"])
    except StepFailed as exc:
        return {"step": exc.step_key, "type": exc.error_type, "message": exc.error_message}
    return "recorded"


@workflow("pl.store")
def store_value(ctx, input):
    """A store's new value too large: the ledger refuses the change, and the workflow catches it."""
    box = ctx.store("box")
    box.get_or_create("create", [])
    try:
        box.update("grow", lambda state: state + ["x" * input["size"]])
    except PayloadTooLarge as exc:
        return {"type": type(exc).__name__, "message": str(exc)}
    return "grown"


@workflow("pl.result")
def result(ctx, input):
    """A result as large as asked for."""
    return "x" * input["size"]


def _deep(depth: int) -> None:
    if depth:
        _deeper(depth - 1)  # two functions in turn: a traceback does not fold their frames into one line
    raise ValueError("boom")


def _deeper(depth: int) -> None:
    _deep(depth)


def _fails_once_deeply(path: str) -> str:
    """Fails its first call with a traceback of some 40 frames (far above 1,000 bytes), then works."""
    with open(path, "a") as calls:
        calls.write("x")
    with open(path) as calls:
        if len(calls.read()) == 1:
            _deep(40)
    return "ok"


@workflow("pl.step_error")
def step_error(ctx, input):
    """A step whose first attempt raises with a traceback too large to record: retried all the same."""
    return ctx.run("flaky", _fails_once_deeply, input["calls"], retry=RetryPolicy(max_attempts=2, interval=0.01))
