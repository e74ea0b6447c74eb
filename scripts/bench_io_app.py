"""The I/O-bound workflows of `scripts/bench_io.py`: three steps, each awaiting (or sleeping) a
fixed time, as a workflow waiting on a payment provider or an API would. Loaded by path."""

from __future__ import annotations

import asyncio
import os
import time

from worker import workflow

WAIT_S = float(os.environ.get("BENCH_IO_WAIT_S", "0.2"))


async def call_async() -> None:
    await asyncio.sleep(WAIT_S)


def call_sync() -> None:
    time.sleep(WAIT_S)


@workflow("io3")
async def io3(ctx, input):
    for key in ("one", "two", "three"):
        await ctx.run(key, call_async)
    return "ok"


@workflow("io3_sync")
def io3_sync(ctx, input):
    for key in ("one", "two", "three"):
        ctx.run(key, call_sync)
    return "ok"
