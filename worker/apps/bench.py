"""Workflows for the benchmarks in scripts/: as cheap as a workflow can be, or simply slow."""

import time

from worker import workflow


def noop() -> None:
    return None


@workflow("noop3")
def noop3(ctx, input):
    """Three recorded no-op steps: the per-delivery cost of the runtime itself."""
    ctx.run("a", noop)
    ctx.run("b", noop)
    ctx.run("c", noop)
    return input


@workflow("wait3")
def wait3(ctx, seconds):
    """Three recorded steps that each wait `seconds` (as a step that calls a provider waits on
    it): the runtime's cost beside steps that do something."""
    ctx.run("a", time.sleep, seconds)
    ctx.run("b", time.sleep, seconds)
    ctx.run("c", time.sleep, seconds)
    return seconds


@workflow("echo1")
def echo1(ctx, input):
    """One recorded no-op step that returns the input: a client's start-to-result round trip."""
    ctx.run("a", noop)
    return input


@workflow("sleepy")
def sleepy(ctx, seconds):
    """One step that sleeps: a delivery that is busy for a while."""
    ctx.run("sleep", time.sleep, seconds)
    return seconds


@workflow("inbox")
def inbox(ctx, count):
    """Takes `count` messages one at a time; after each, a step records when it ran (the wall
    clock, in ns) as the event `woke-N`: a send's wake-up, as its sender sees it, is that time
    less the send's."""
    for i in range(count):
        ctx.recv()
        ctx.set_event(f"woke-{i}", ctx.run(f"woke-{i}", time.time_ns))
    return count


@workflow("stamp")
def stamp(ctx, input):
    """One step that records when it ran (the wall clock, in ns), returned as the result: from a
    workflow's last step to its `result()` returning."""
    return ctx.run("at", time.time_ns)
