"""The schedule tests' app, edited (SPEC section 12): `sc.tick` is still served but no longer
scheduled, and `sc.nightly` is gone from the app."""

from __future__ import annotations

from worker import workflow


@workflow("sc.tick")
def tick(ctx, input):
    return input
