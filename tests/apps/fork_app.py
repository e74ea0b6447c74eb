"""Workflows for the tests of forks (`tests/supervisor/test_fork_supervised.py`), loaded by path
as a supervisor's APP. Names start with `fork.` so they cannot clash with other apps.

Each step function appends a line to the file `input["log"]` when it really runs (a replay
returns the recorded value and runs nothing), and returns a value of its own making, so that a
test can tell a copied result from one made again."""

from __future__ import annotations

import uuid

from worker import workflow


def record(log: str, name: str) -> str:
    """Appends `name` to the log; returns `name` with a token this run alone has."""
    with open(log, "a") as f:
        f.write(name + "\n")
    return f"{name}-{uuid.uuid4().hex[:8]}"


@workflow("fork.three")
def three(ctx, input):
    """Steps a, b and c, each result published as an event, then an effect: c's notice, whose
    effect id is the execution's own."""
    log = input["log"]
    a = ctx.run("a", record, log, "a")
    ctx.set_event("a", a)
    b = ctx.run("b", record, log, "b")
    c = ctx.run("c", record, log, "c")
    ctx.set_event("c", c)
    ctx.effect("notify", lambda effect_id: record(log, f"notify {effect_id}"))
    return [a, b, c]


@workflow("fork.three_async")
async def three_async(ctx, input):
    """`fork.three`, as an async workflow (without the effect)."""
    log = input["log"]
    a = await ctx.run("a", record, log, "a")
    b = await ctx.run("b", record, log, "b")
    c = await ctx.run("c", record, log, "c")
    return [a, b, c]
