"""Workflows whose steps and results are as large as their input says, for the tests of the
payload limit in supervised runs (`tests/supervisor/test_payload_limits_supervised.py`).

Each step counts its calls in a file (`input["calls"]`), so a test sees whether a step too
large to record was tried again.
"""

from __future__ import annotations

from worker import RetryPolicy, StepFailed, workflow


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


@workflow("pl.result")
def result(ctx, input):
    """A result as large as asked for."""
    return "x" * input["size"]
