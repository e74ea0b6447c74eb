"""The app of the `supervise --metrics` tests (SPEC section 13): workflows whose deliveries,
step attempts and outcomes a test counts, then finds in a scrape.

- `mx.steps` (queue "reports"): `input["steps"]` steps of 50 ms each, then completes;
- `mx.async_steps` (queue "reports"): the same, as an async workflow;
- `mx.fails`: raises outside any step, so it fails at once, with no step;
- `mx.gated`: one step that waits for the file `input["gate"]` (at most a minute), so that a
  scrape can see it running.

It imports its gate from `supervised_app`, whose `sv.` workflows it serves too (none is started).
"""

from __future__ import annotations

import asyncio
import time

from supervised_app import wait_for_file
from worker import Queue, workflow

REPORTS = Queue("reports")
STEP_S = 0.05


@workflow("mx.steps", queue=REPORTS)
def steps(ctx, input):
    for i in range(input["steps"]):
        ctx.run(f"step-{i}", lambda: time.sleep(STEP_S) or "done")
    return input["steps"]


@workflow("mx.async_steps", queue=REPORTS)
async def async_steps(ctx, input):
    for i in range(input["steps"]):
        await ctx.run(f"step-{i}", asyncio.sleep, STEP_S)
    return input["steps"]


@workflow("mx.fails")
def fails(ctx, input):
    raise ValueError("this workflow fails")


@workflow("mx.gated")
def gated(ctx, input):
    return ctx.run("wait", wait_for_file, input["gate"])
