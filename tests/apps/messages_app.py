"""Workflows for the tests of messages and events (`tests/worker/test_messages.py`), loaded by
path as a supervisor's APP. Names start with `msg.` so they cannot clash with other apps."""

from __future__ import annotations

import time

from worker import workflow


@workflow("msg.approval")
def approval(ctx, input):
    """Publishes that it waits, waits for a decision on the topic "approval", publishes it."""
    ctx.set_event("status", "waiting for approval")
    decision = ctx.recv("approval")
    ctx.set_event("status", decision["verdict"])
    return decision


@workflow("msg.approval_async")
async def approval_async(ctx, input):
    """`msg.approval`, as an async workflow."""
    await ctx.set_event("status", "waiting for approval")
    decision = await ctx.recv("approval")
    await ctx.set_event("status", decision["verdict"])
    return decision


@workflow("msg.collect")
def collect(ctx, input):
    """Takes messages on the default topic until one says "end"; returns them in order."""
    taken = []
    while True:
        message = ctx.recv()
        taken.append(message)
        if message == "end":
            return taken


@workflow("msg.timeout")
def timeout(ctx, input):
    """Waits `input` seconds for a message on a topic nobody sends to."""
    return {"got": ctx.recv("nobody-sends-here", timeout=input)}


@workflow("msg.timeout_async")
async def timeout_async(ctx, input):
    """`msg.timeout`, as an async workflow."""
    return {"got": await ctx.recv("nobody-sends-here", timeout=input)}


@workflow("msg.ping")
def ping(ctx, input):
    """For each of `input` messages: the wall time it was taken at, as the event woke-<i>."""
    for i in range(input):
        ctx.recv()
        ctx.set_event(f"woke-{i}", ctx.run(f"woke-{i}", time.time))
    return input


@workflow("msg.stamp")
def stamp(ctx, input):
    """The wall time its one step ran: what the latency of result() is measured from."""
    return ctx.run("stamp", time.time)


def crash_once(marker: str) -> str:
    """Kills its own worker process the first time (the marker file says it did)."""
    import os
    import signal

    if not os.path.exists(marker):
        with open(marker, "w"):
            pass
        os.kill(os.getpid(), signal.SIGKILL)
    return "survived"


@workflow("msg.crash_after_recv")
def crash_after_recv(ctx, input):
    """Takes a message, then its worker is killed once; the replay must see the same message."""
    first = ctx.recv()
    ctx.run("crash-once", crash_once, input)
    return [first, ctx.recv()]
