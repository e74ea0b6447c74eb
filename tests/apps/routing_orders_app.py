"""An app of the routing tests (SPEC section 11): it registers `rt.order` and `rt.shared`, and not
`rt.report`, which `routing_reports_app.py` registers. Each workflow returns the pid of the
worker that ran it, so a test can tell which supervisor's worker did."""

from __future__ import annotations

import os

from worker import workflow


@workflow("rt.order")
def order(ctx, input):
    return {"pid": ctx.run("pid", os.getpid), "app": "orders"}


@workflow("rt.shared")
def shared(ctx, input):
    return {"pid": ctx.run("pid", os.getpid), "app": "orders"}
