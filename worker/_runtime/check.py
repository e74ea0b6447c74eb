"""A check replay: would an execution's recorded steps replay against this code, or diverge?

`replay_check` replays one execution in-process, as a delivery would, with a writer that refuses
every write and every ledger call, and stops at the first step it has no record of (or whose
function would run: a retry not yet done). No step function, timer, effect, start or store
change runs; nothing is written; recorded timers and retry backoffs count as over, so the check
sees as far into the records as the code goes. It answers with the divergence detail the
delivery would end with (`Suspended(diverged=detail)`), or None when the replay keeps the order
rule up to where it stopped (or the workflow would complete or fail by its own code).

It is cheap enough to check many executions in one process (`yieldstar check`): no process, no
lease, no connection of its own; an async workflow runs on an event loop of its own per
execution, as a delivery does.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Callable, Optional

from supervisor.ledger.errors import InvalidArgument
from supervisor.ledger.values import ExecutionLease

from ..async_context import AsyncWorkflowContext, is_async_workflow, run_to_end
from ..context import WorkflowContext
from ..registry import Registry
from .fenced import FencedWriter
from .unwinding import EndOfHistory, ReplayDiverged, RetryLater, StopDelivery, Suspend

# Every recorded timer and retry backoff is over at this time (ms): year 2200 or so.
_FAR_FUTURE = 7_258_118_400_000


class RefusingWriter(FencedWriter):
    """The door of a check replay: every write and every ledger call ends the replay there."""

    def __init__(self, backend: Any, lease: ExecutionLease):
        super().__init__(backend, lease)

    def check(self) -> None:
        raise EndOfHistory("a check writes nothing")

    def write_step(self, step_key: str, attempt: int, done: bool, response_json: str):
        raise EndOfHistory(f"a check records nothing (step {step_key!r})")

    async def write_step_async(self, step_key: str, attempt: int, done: bool, response_json: str):
        raise EndOfHistory(f"a check records nothing (step {step_key!r})")

    def call(self, method: Callable, *args: Any, **kwargs: Any):
        raise EndOfHistory("a check calls nothing in the ledger")

    def request_wake(self, at: int) -> None:
        raise EndOfHistory("a check asks for no wake")


def replay_check(backend: Any, execution: Any, recorded: list, registry: Registry) -> Optional[str]:
    """Replay `execution` (an `ExecutionRecord`) over its `recorded` steps (`HeapRecord`s in
    write order, as `executions.get_with_steps` gives them) with the workflow `registry` holds.

    Returns:
        The divergence detail a delivery would park the execution with, or None.

    Raises:
        InvalidArgument: `registry` has no workflow of the execution's name.
    """
    fn = registry.get(execution.workflow)
    if fn is None:
        raise InvalidArgument(f"no workflow is registered as {execution.workflow!r}")
    writer = RefusingWriter(backend, ExecutionLease(execution.execution_id, execution.token, 0))
    asynchronous = is_async_workflow(fn)
    ctx = _context(asynchronous, writer, execution, recorded)
    try:
        if asynchronous:
            result = run_to_end(fn(ctx, json.loads(execution.input_json)))
        else:
            result = fn(ctx, json.loads(execution.input_json))
            if inspect.iscoroutine(result) and not ctx._keys_used:
                result.close()  # a plain function that returned a coroutine: an async workflow after all
                ctx = _context(True, writer, execution, recorded)
                run_to_end(fn(ctx, json.loads(execution.input_json)))
    except ReplayDiverged as exc:
        return exc.detail
    except (Suspend, StopDelivery, RetryLater):
        pass
    except Exception:  # noqa: BLE001 - the workflow's own error: a delivery would fail with it
        return _ended(ctx, "raised")
    else:
        return _ended(ctx, "returned")
    return ctx._unwound.detail if isinstance(ctx._unwound, ReplayDiverged) else None


def _context(asynchronous: bool, writer: RefusingWriter, execution: Any, recorded: list) -> WorkflowContext:
    context = (AsyncWorkflowContext if asynchronous else WorkflowContext)(
        writer, execution, recorded, lambda: _FAR_FUTURE)
    context._checking = True
    return context


def _ended(ctx: WorkflowContext, how: str) -> Optional[str]:
    """The detail of a check whose workflow ended by itself (`how`), however it treated the
    unwinding of the check (a bare `except:` that returned)."""
    if isinstance(ctx._unwound, ReplayDiverged):
        return ctx._unwound.detail
    if ctx._unwound is not None:
        return None
    return ctx._left_behind(how)
