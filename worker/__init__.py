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

from supervisor.ledger.errors import AppNotFound, StepFailed, WorkflowCancelled, WorkflowFailed

from .client import AsyncClient, AsyncHandle, Client, Handle
from .context import WorkflowContext
from .driver import run_delivery
from .registry import Registry, default_registry, load_app, workflow
from .retry import RetryableError, RetryPolicy
from .unwinding import ReplayDiverged

__all__ = [
    "Client", "AsyncClient", "Handle", "AsyncHandle", "WorkflowFailed", "WorkflowCancelled",
    "workflow", "Registry", "default_registry", "load_app", "AppNotFound",
    "WorkflowContext", "run_delivery",
    "RetryableError", "RetryPolicy", "StepFailed", "ReplayDiverged",
]
