"""The app of the supervised queue tests (SPEC section 12): `q.narrow` runs in the queue
"narrow", at most 2 at once across every supervisor; `q.keyed` in "keyed", at most 1 at once per
key; `q.rated` in "rated", at most 4 claims in any second. Each delivery of the first two holds
its lease a moment (a step that sleeps), so that deliveries would overlap were the limit not
held. `q.urgent` is in the default queue at priority 5, `q.plain` at priority 0."""

from __future__ import annotations

import time

from worker import Queue, workflow

NARROW = Queue("narrow", concurrency=2)
KEYED = Queue("keyed", per_key=1)
RATED = Queue("rated", rate=(4, 1.0))


@workflow("q.narrow", queue=NARROW)
def narrow(ctx, input):
    return ctx.run("hold", lambda: time.sleep(0.15) or "held")


@workflow("q.keyed", queue=KEYED)
def keyed(ctx, input):
    return ctx.run("hold", lambda: time.sleep(0.15) or "held")


@workflow("q.rated", queue=RATED)
def rated(ctx, input):
    return "done"


@workflow("q.urgent", priority=5)
def urgent(ctx, input):
    return "done"


@workflow("q.plain")
def plain(ctx, input):
    return "done"
