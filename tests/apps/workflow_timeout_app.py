"""The app of the supervised workflow-timeout tests (SPEC section 12): `wt.slow` times out one
second after its admission unless its start names another timeout, and its one step takes longer
than that (so its step's record, written at the end, would land after the deadline were the
delivery not stopped); `wt.nap` has no timeout of its own, and its step sleeps for its input's
seconds."""

from __future__ import annotations

import time

from worker import workflow

SLOW_STEP_S = 2.5


@workflow("wt.slow", timeout=1)
def slow(ctx, input):
    return ctx.run("hold", lambda: time.sleep(SLOW_STEP_S) or "late")


@workflow("wt.nap")
def nap(ctx, input):
    return ctx.run("nap", lambda: time.sleep(input) or "rested")
