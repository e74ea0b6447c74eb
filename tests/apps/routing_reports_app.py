"""An app of the routing tests (SPEC section 11): it registers `rt.report` and `rt.shared`, and not
`rt.order`, which `routing_orders_app.py` registers."""

from __future__ import annotations

import os

from worker import workflow


@workflow("rt.report")
def report(ctx, input):
    return {"pid": ctx.run("pid", os.getpid), "app": "reports"}


@workflow("rt.shared")
def shared(ctx, input):
    return {"pid": ctx.run("pid", os.getpid), "app": "reports"}
