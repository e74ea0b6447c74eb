"""Workflows for the step-timeout tests (SPEC section 12) under a real supervisor, loaded by path
as their APP.

It leaves evidence as `supervised_app.py`'s workflows do (its side-effect log), and imports that
app, so that its workflows (`sv.async_gate`, a sibling delivery) are served too.
"""

from __future__ import annotations

import asyncio
import os
import threading

from supervised_app import log_event
from worker import RetryPolicy, StepFailed, workflow

# Two attempts, the second at once: a test waits for no backoff.
TWICE = RetryPolicy(max_attempts=2, interval=0.0)


async def naps(log: str, execution_id: str, token: int, seconds: float) -> str:
    """Log `begin`, then sleep on the event loop far beyond any timeout given."""
    log_event(log, "begin", execution_id, token, "nap")
    await asyncio.sleep(seconds)
    return "woke"


@workflow("to.async_nap")
async def async_nap(ctx, input):
    """An async step that sleeps `input["seconds"]` under `timeout=input["timeout"]`, tried twice;
    returns what `StepFailed` said."""
    try:
        await ctx.run("nap", naps, input["log"], ctx.execution_id, ctx.token, input["seconds"], retry=TWICE,
                      timeout=input["timeout"])
    except StepFailed as exc:
        return {"error_type": exc.error_type, "attempts": exc.attempts, "message": exc.error_message}
    return {"error_type": None}


def hangs_at_first(log: str, execution_id: str, token: int, marker: str) -> int:
    """Log `begin`; the first time (no `marker` file yet) make it and hang for good, as a call that
    never answers would; later, return this worker's pid."""
    log_event(log, "begin", execution_id, token, "hang")
    if not os.path.exists(marker):
        open(marker, "w").close()
        threading.Event().wait(600)
    log_event(log, "end", execution_id, token, "hang")
    return os.getpid()


@workflow("to.sync_hang")
def sync_hang(ctx, input):
    """A sync step that hangs in its first attempt and returns in its second."""
    pid = ctx.run("hang", hangs_at_first, input["log"], ctx.execution_id, ctx.token, input["marker"], retry=TWICE,
                  timeout=input["timeout"])
    return {"pid": pid, "token": ctx.token}
