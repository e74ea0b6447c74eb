"""Yieldstar's application side, and what users import: the workflow SDK, the client that
starts workflows and waits for their results, and the errors they catch.

    from worker import workflow

    @workflow("order")
    def order(ctx, input):
        order = ctx.run("load", load_order, input["order_id"])
        receipt = ctx.run("charge", charge_card, order)
        return {"receipt": receipt}

    from worker import Client

    with Client("shop.db") as client:
        receipt = client.start(order, {"order_id": 42}, id="order-42").result(timeout=30)

The names in `__all__` are the public surface; `worker.testing` runs workflows in-process for
their authors' tests. The child processes' internals (the replay driver, fenced writes, the pipe
and its messages, the parent watch) are in `worker._runtime` and may change without notice; the
sample apps are in `worker.apps`. Every error is defined in `supervisor.ledger.errors`, which both
sides import; the ones users catch are re-exported here.
"""

from supervisor.ledger.errors import (
    AppNotFound,
    DeliveryEnded,
    ExecutionConflict,
    InvalidArgument,
    PayloadTooLarge,
    StepFailed,
    StepTimeout,
    UnknownEffect,
    UnknownExecution,
    UnknownStep,
    WorkflowCancelled,
    WorkflowError,
    WorkflowFailed,
    YieldstarError,
)
from supervisor.ledger.values import EffectState, ExecutionStatus, SettleConflict

from .async_context import AsyncStoreHandle, AsyncWorkflowContext
from .client import AsyncClient, AsyncHandle, Client, Handle
from .context import WorkflowContext
from .queues import Queue
from .registry import Registry, default_registry, workflow
from .retry import RetryableError, RetryPolicy
from .stores import StoreHandle
from ._runtime.unwinding import ReplayDiverged

__all__ = [
    # the SDK: registering workflows, what they receive, retries
    "workflow", "Registry", "default_registry", "Queue",
    "WorkflowContext", "AsyncWorkflowContext", "StoreHandle", "AsyncStoreHandle",
    "RetryPolicy", "RetryableError",
    # the client, and the values its calls return
    "Client", "AsyncClient", "Handle", "AsyncHandle", "ExecutionStatus", "EffectState", "SettleConflict",
    # the errors users catch
    "YieldstarError", "InvalidArgument", "ExecutionConflict", "UnknownExecution", "UnknownEffect", "UnknownStep",
    "PayloadTooLarge", "WorkflowError", "WorkflowFailed", "WorkflowCancelled", "StepFailed", "StepTimeout",
    "ReplayDiverged", "DeliveryEnded", "AppNotFound",
]
