"""Yieldstar's application side: the workflow SDK, the client that starts workflows and waits
for their results, and the child processes' replay driver, fenced writes and parent watch.

    from worker import workflow

    @workflow("order")
    def order(ctx, input):
        order = ctx.run("load", load_order, input["order_id"])
        receipt = ctx.run("charge", charge_card, order)
        return {"receipt": receipt}

    from worker import Client

    with Client("shop.db") as client:
        receipt = client.start(order, {"order_id": 42}, id="order-42").result(timeout=30)
"""

from .client import AsyncClient, AsyncHandle, Client, Handle, WorkflowCancelled, WorkflowFailed
from .context import WorkflowContext
from ._runtime.driver import run_delivery
from ._runtime.loading import load_app
from .registry import AppNotFound, Registry, default_registry, workflow
from .retry import RetryableError, RetryPolicy, StepFailed
from ._runtime.unwinding import ReplayDiverged

__all__ = [
    "Client", "AsyncClient", "Handle", "AsyncHandle", "WorkflowFailed", "WorkflowCancelled",
    "workflow", "Registry", "default_registry", "load_app", "AppNotFound",
    "WorkflowContext", "run_delivery",
    "RetryableError", "RetryPolicy", "StepFailed", "ReplayDiverged",
]
