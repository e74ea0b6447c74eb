"""One delivery: replay a workflow function under a lease and say how it ended.

`run_delivery` does not acknowledge; it returns the outcome and leaves that to the lease holder
(the supervisor, or `worker.testing` in-process). It never raises for the workflow's sake:

| the workflow...                                | outcome     |
| ---------------------------------------------- | ----------- |
| returns a JSON-serialisable value              | `Completed` |
| raises (or returns something JSON cannot hold) | `Failed` with `{type, message, traceback}` |
| suspends (timer, retry backoff, waiting)       | `Suspended` |
| hits a busy database                           | `Retry` (the holder releases the lease) |
| loses its lease, or its parent goes silent     | `LeaseLost`: stopped at once, no more writes |
"""

from __future__ import annotations

import json
from typing import Callable

from supervisor.errors import StorageBusy
from supervisor.values import Completed, DeliveryOutcome, ExecutionLease, Failed, LeaseLost, Retry, Suspended

from .context import WorkflowContext, error_info
from .fenced import FencedWriter, always
from .registry import Registry
from .unwinding import ReplayDiverged, RetryLater, StopDelivery, Suspend


def failure(error_type: str, message: str, tb: str | None = None) -> Failed:
    return Failed(json.dumps({"type": error_type, "message": message, "traceback": tb}))


def unwound(writer: FencedWriter, ctx: WorkflowContext) -> DeliveryOutcome | None:
    """How a delivery that began to unwind ends, however the workflow treated the unwinding
    (a bare `except:` that returned, or raised another error in its place); None if it did not."""
    if writer.stopped:
        return LeaseLost()
    if writer.busy_because is not None:
        return Retry(writer.busy_because)
    if ctx._unwound is not None:
        return Suspended() if isinstance(ctx._unwound, Suspend) else failure("ReplayDiverged", str(ctx._unwound))
    return None


def run_delivery(backend, lease: ExecutionLease, registry: Registry, *,
                 may_write: Callable[[], bool] = always) -> DeliveryOutcome:
    """Run one delivery of `lease.execution_id` with its fencing token and return its outcome."""
    writer = FencedWriter(backend, lease, may_write)
    try:
        execution = backend.executions.get(lease.execution_id)
        if execution is None:
            return failure("UnknownExecution", f"execution {lease.execution_id!r} is not in the ledger")
        fn = registry.get(execution.workflow)
        if fn is None:
            known = ", ".join(registry.names()) or "none"
            return failure("UnknownWorkflow",
                           f"no workflow is registered as {execution.workflow!r} (registered: {known})")
        ctx = WorkflowContext(writer, execution, backend.heap.steps(lease.execution_id), backend.clock)
        try:
            result = fn(ctx, json.loads(execution.input_json))
        except Suspend:
            return Suspended()
        except StopDelivery:
            return LeaseLost()
        except RetryLater as exc:
            return Retry(str(exc))
        except ReplayDiverged as exc:
            return failure("ReplayDiverged", str(exc))
        except StorageBusy as exc:
            return Retry(str(exc))
        except Exception as exc:
            return unwound(writer, ctx) or Failed(json.dumps(error_info(exc)))
        ended = unwound(writer, ctx)
        if ended is not None:
            return ended
        try:
            return Completed(json.dumps(result, allow_nan=False))
        except (TypeError, ValueError) as exc:
            return failure("NonSerialisableResult", f"workflow {execution.workflow!r} returned a value that is not"
                           f" JSON-serialisable: {exc}")
    except StorageBusy as exc:
        return Retry(str(exc))
