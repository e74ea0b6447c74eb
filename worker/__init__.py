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

from supervisor.exports import lazy_exports

# Each name is imported when first used (`supervisor.exports`): a worker process, which needs the
# replay driver, does not import the client.
_WHERE = {
    **dict.fromkeys(["Client", "AsyncClient", "Handle", "AsyncHandle", "WorkflowFailed", "WorkflowCancelled"],
                    ".client"),
    **dict.fromkeys(["workflow", "Registry", "default_registry", "load_app", "AppNotFound"], ".registry"),
    "WorkflowContext": ".context",
    "run_delivery": ".driver",
    **dict.fromkeys(["RetryableError", "RetryPolicy", "StepFailed"], ".retry"),
    "ReplayDiverged": ".unwinding",
}
__all__ = list(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
