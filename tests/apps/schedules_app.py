"""An app of the schedule tests (SPEC section 12): `sc.tick` ticks every second and records the
tick it was admitted for, `sc.nightly` ticks at 03:00 Paris time (never during a test), and
`sc.plain` has no schedule."""

from __future__ import annotations

from worker import workflow


@workflow("sc.tick", every=1)
def tick(ctx, input):
    return {"scheduled_at": input["scheduled_at"]}


@workflow("sc.nightly", schedule="0 3 * * *", timezone="Europe/Paris")
def nightly(ctx, input):
    return input


@workflow("sc.plain")
def plain(ctx, input):
    return input
