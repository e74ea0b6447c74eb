"""Yieldstar's child side: the workflow SDK, the replay driver, fenced writes, the parent watch.

    from worker import workflow

    @workflow("order")
    def order(ctx, input):
        order = ctx.run("load", load_order, input["order_id"])
        receipt = ctx.run("charge", charge_card, order)
        return {"receipt": receipt}
"""

from .context import WorkflowContext
from .driver import run_delivery
from .registry import AppNotFound, Registry, default_registry, load_app, workflow
from .retry import RetryableError, RetryPolicy, StepFailed
from .unwinding import ReplayDiverged

__all__ = [
    "workflow", "Registry", "default_registry", "load_app", "AppNotFound",
    "WorkflowContext", "run_delivery",
    "RetryableError", "RetryPolicy", "StepFailed", "ReplayDiverged",
]
