"""The app of the supervised queue tests (SPEC section 12): `q.narrow` runs in the queue
"narrow", at most 2 at once across every supervisor; each delivery holds its lease a moment (a
step that sleeps), so that deliveries would overlap were the limit not held. `q.urgent` is in the
default queue at priority 5."""

from __future__ import annotations

import time

from worker import Queue, workflow

NARROW = Queue("narrow", concurrency=2)


@workflow("q.narrow", queue=NARROW)
def narrow(ctx, input):
    return ctx.run("hold", lambda: time.sleep(0.15) or "held")


@workflow("q.urgent", priority=5)
def urgent(ctx, input):
    return "done"
