"""Workflows that keep their `ctx` past their delivery, for tests/supervisor/test_ended_context_supervised.py.

Names start with `ec.`. Whatever the kept context raises when used late (the test reads it), the
code that used it returns or writes down its type and message: a workflow as its result, a thread
or a task in the JSON file `input["out"]`. Each also says which worker process it ran in.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time

from worker import workflow

GATE_TIMEOUT_S = 60.0
KEPT: dict = {}  # the contexts of earlier deliveries, kept as a module global would keep them
TASKS: set = set()  # the tasks left running on the worker's event loop, kept from the collector


def late() -> str:
    return "late"


def raised(exc: BaseException | None) -> dict:
    return {"pid": os.getpid(), "raised": None if exc is None else type(exc).__name__,
            "message": None if exc is None else str(exc)}


def write_out(path: str, what: dict) -> None:
    with open(path + ".part", "w") as f:
        json.dump(what, f)
    os.replace(path + ".part", path)


@workflow("ec.keep")
def keep(ctx, input):
    KEPT["sync"] = ctx
    ctx.run("first", late)
    return {"pid": os.getpid()}


@workflow("ec.keep_async")
async def keep_async(ctx, input):
    KEPT["async"] = ctx
    await ctx.run("first", late)
    return {"pid": os.getpid()}


@workflow("ec.reuse")
def reuse(ctx, input):
    """Use the context a delivery of `ec.keep` left in `KEPT`, as a later delivery."""
    try:
        KEPT["sync"].run("late", late)
    except BaseException as exc:  # noqa: BLE001 - whatever it is, the test reads it
        return raised(exc)
    return raised(None)


@workflow("ec.reuse_async")
async def reuse_async(ctx, input):
    try:
        await KEPT["async"].run("late", late)
    except BaseException as exc:  # noqa: BLE001 - whatever it is, the test reads it
        return raised(exc)
    return raised(None)


def wait_for_gate(gate: str) -> None:
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)


@workflow("ec.thread")
def thread(ctx, input):
    """A step starts a thread that uses the context once the test opens the gate (after the
    execution completed)."""
    def outlives() -> None:
        wait_for_gate(input["gate"])
        try:
            ctx.run("late", late)
        except BaseException as exc:  # noqa: BLE001 - whatever it is, the test reads it
            write_out(input["out"], raised(exc))
        else:
            write_out(input["out"], raised(None))

    ctx.run("spawn", lambda: threading.Thread(target=outlives, daemon=True).start())
    return {"pid": os.getpid()}


@workflow("ec.task")
async def task(ctx, input):
    """Leave a task on the worker's event loop that uses the context once the test opens the
    gate (under `supervise --workers`: with one delivery per worker, the delivery's own loop
    cancels it as the delivery ends)."""
    async def outlives() -> None:
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while not os.path.exists(input["gate"]) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        try:
            await ctx.run("late", late)
        except BaseException as exc:  # noqa: BLE001 - whatever it is, the test reads it
            write_out(input["out"], raised(exc))
        else:
            write_out(input["out"], raised(None))

    left = asyncio.get_running_loop().create_task(outlives())
    TASKS.add(left)
    left.add_done_callback(TASKS.discard)
    await ctx.run("first", late)
    return {"pid": os.getpid()}


@workflow("ec.reuse_uncaught")
def reuse_uncaught(ctx, input):
    """`ec.reuse`, letting what the kept context raises end this workflow."""
    ctx.run("own", late)
    KEPT["sync"].run("late", late)
    return raised(None)
