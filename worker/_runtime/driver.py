"""One delivery: replay a workflow function under a lease and say how it ended.

`run_delivery` does not acknowledge; it returns the outcome and leaves that to the lease holder
(the supervisor, or `worker.testing` in-process). It never raises for the workflow's sake:

| the workflow...                                    | outcome     |
| -------------------------------------------------- | ----------- |
| returns a JSON-serialisable value                  | `Completed` |
| raises (or returns something JSON cannot hold)     | `Failed` with `{type, message, traceback}` |
| returns a value above the ledger's payload limit   | `Failed` with `PayloadTooLarge` (`_within_limit`) |
| raises an error above it (a deep traceback)        | `Failed`, its traceback cut to the end that fits |
| suspends (timer, retry backoff, waiting)           | `Suspended` |
| diverges from its records (`worker._runtime.order`: | `Suspended(diverged=detail)`: parked, never failed |
|   an unrecorded step while recorded ones remain, a  |             |
|   step out of order, an end with steps unreached)   |             |
| meets a storage error anywhere in the delivery     | `Retry(reason, storage_error=kind)`: never a workflow outcome |
| loses its lease, or its parent goes silent         | `LeaseLost`: stopped at once, no more writes |

An `async def` workflow (a coroutine function, a partial of one, an object with an async
`__call__`, or a plain function that returns a coroutine) runs on an event loop of its own for
the delivery (`asyncio.run`), with an `AsyncWorkflowContext`, and ends in the same outcomes by
the same rules: the unwinding exceptions come out of the loop as they went in.

A worker that runs several deliveries at once (`worker._runtime.deliveries`) takes a delivery
in its phases instead (`WorkflowRun`): `prepare` reads the execution and finds its workflow,
then `run` runs a sync one on the calling thread, or `run_async` an async one as a task of the
worker's one event loop, with the same outcomes. `stop` ends one delivery early (its lease is
lost, its execution cancelled): its writes are refused from then on, and a task cancelled
because of it ends as `LeaseLost` too.

A delivery's context serves that delivery alone: once its outcome is decided, the context,
wherever it was kept (a module global a later delivery reads, a thread or task that outlived the
step or the workflow function), raises `DeliveryEnded` naming the execution and the token at
every call, and writes nothing. Without that, such a call would run its step function and make
unfenced calls (a child start, an effect, a store change) for an execution that moved on, then
raise its stale token's refusal into whatever code made it, where a later delivery would take
it for its own lost lease.

A storage error (a busy database, a full disk, an I/O error, a corrupt file: any
`StorageError`) may come from a step's write, a start, an effect or store call, the delivery's
own reads, the clock of a backend that asks its server, or a step function that called the
ledger itself. It unwinds the workflow like a suspension (`RetryLater` is a `BaseException`),
and every later step call raises it again, so workflow code can neither record it as an error
nor take another path around it. The holder releases the lease, and the execution runs again
once the fault clears; a corrupt ledger (`storage_error="corrupt"`) stops the supervisor.

Time: whether a timer or a retry backoff is due is decided by `max(backend clock, claimed_at)`,
where `claimed_at` is the ledger time of the claim that made this delivery (the claim's `now`).
A holder whose clock lags the claimer's would otherwise find a timer that made the execution
claimable not yet due, ask for a wake that is already due, and be claimed again at once.
"""

from __future__ import annotations

import inspect
import json
import traceback
from typing import TYPE_CHECKING, Callable, NamedTuple, Optional

from supervisor.ledger import arguments
from supervisor.ledger.errors import PayloadTooLarge, StorageError
from supervisor.ledger.values import Completed, DeliveryOutcome, ExecutionLease, Failed, LeaseLost, Retry, Suspended

from ..async_context import AsyncWorkflowContext, is_async_workflow, run_to_end
from ..context import WorkflowContext, error_info, error_within
from ..registry import Registry
from .fenced import FencedWriter, always
from .tracing import begin_delivery
from .unwinding import ReplayDiverged, RetryLater, StopDelivery, Suspend

if TYPE_CHECKING:  # a worker of one delivery has no group commit, and does not import it
    from .step_commits import StepCommits


def failure(error_type: str, message: str, tb: str | None = None) -> Failed:
    return Failed(json.dumps({"type": error_type, "message": message, "traceback": tb}))


def storage_retry(exc: StorageError) -> Retry:
    """How a delivery that met a storage error ends: retried, naming the kind of failure."""
    return Retry(str(exc), storage_error=exc.kind)


def raised_outside(exc: Exception) -> Retry:
    """How a delivery ends that raised `exc` outside its workflow (a bug of the runtime, a
    storage error outside the steps): retried, a storage error as `storage_retry` says, anything
    else with its traceback, so that the supervisor releases the lease and logs why."""
    if isinstance(exc, StorageError):
        return storage_retry(exc)
    return Retry("the delivery raised outside the workflow:\n" + "".join(traceback.format_exception(exc)))


def unwound(writer: FencedWriter, ctx: WorkflowContext) -> DeliveryOutcome | None:
    """How a delivery that began to unwind ends, however the workflow treated the unwinding
    (a bare `except:` that returned, or raised another error in its place); None if it did not.
    One that abandoned a step's thread (`worker.timeouts`) recorded the step's attempt and asked
    for its wake before it shut its door: it is suspended."""
    if writer.abandoned is not None:
        return suspended(ctx._unwound)
    if writer.stopped:
        return LeaseLost()
    if writer.storage_failure is not None:
        return Retry(writer.storage_failure.reason, storage_error=writer.storage_failure.storage_error)
    if isinstance(ctx._unwound, ReplayDiverged):
        return Suspended(diverged=ctx._unwound.detail)
    if ctx._unwound is not None:
        return suspended(ctx._unwound)
    return None


def suspended(unwinding: Optional[BaseException]) -> Suspended:
    """How a delivery ends that `unwinding` (a `Suspend`, if it is one) suspended: with the error
    of the step attempt it waits to retry, if that is why."""
    return Suspended(step_error_json=getattr(unwinding, "step_error", None))


class Start(NamedTuple):
    """What a workflow's context needs of a first delivery's execution (an `ExecutionRecord`
    serves as well)."""

    execution_id: str
    workflow: str
    input_json: str


class WorkflowRun:
    """One delivery in its phases: `prepare`, then `run` or `run_async`; `stop` from any thread."""

    def __init__(self, backend, lease: ExecutionLease, registry: Registry, *,
                 may_write: Callable[[], bool] = always, claimed_at: Optional[int] = None,
                 start: Optional[tuple[str, str]] = None, commits: Optional[StepCommits] = None,
                 trace_context: Optional[str] = None):
        """Args: as `run_delivery`'s; `commits`: the worker's group commit of step writes, if it
        runs several deliveries. Its span (`worker._runtime.tracing`), if this process traces,
        starts here and ends at `end`."""
        self.backend = backend
        self.lease = lease
        self.registry = registry
        self.writer = FencedWriter(backend, lease, may_write, commits)
        self.claimed_at = claimed_at
        self.start = start
        self.execution = None
        self.recorded: list = []
        self.fn: Optional[Callable] = None
        self.asynchronous = False
        self.trace_context = trace_context
        self.trace = begin_delivery(lease, trace_context, None if start is None else start[0])

    def end(self, outcome: DeliveryOutcome) -> DeliveryOutcome:
        """The delivery ended in `outcome`, about to be reported: its span ends. Returns it."""
        if self.trace is not None:
            self.trace.end(outcome, None if self.execution is None else self.execution.workflow)
        return outcome

    def prepare(self) -> Optional[DeliveryOutcome]:
        """Read the execution (unless `start` says what it is) and find its workflow; returns
        the outcome if the delivery ends here (an unknown execution or workflow, a storage error)."""
        try:
            if self.start is not None:
                self.execution, self.recorded = Start(self.lease.execution_id, *self.start), []
            else:
                found = self.backend.executions.get_with_steps(self.lease.execution_id)
                if found is None:
                    return failure("UnknownExecution", f"execution {self.lease.execution_id!r} is not in the ledger")
                self.execution, self.recorded = found
        except StorageError as exc:  # the delivery's own reads
            return storage_retry(exc)
        self.fn = self.registry.get(self.execution.workflow)
        if self.fn is None:
            # Not this worker's to run (routing, SPEC section 11): released, never failed. A
            # supervisor claims only the workflows its workers reported, so this is an app
            # changed on disk under a running supervisor, or a delivery made by hand; the
            # execution stays admitted (or suspended) for a supervisor that serves it.
            known = ", ".join(self.registry.names()) or "none"
            return Retry(f"UnknownWorkflow: no workflow is registered as {self.execution.workflow!r} in this"
                         f" worker's app (registered: {known}); released for a supervisor that serves it")
        self.asynchronous = is_async_workflow(self.fn)
        return None

    def stop(self, why: str) -> None:
        """Refuse this delivery's writes from now on (it raises `StopDelivery` at its next one);
        safe from any thread."""
        self.writer.stop(why)

    def _context(self, asynchronous: bool) -> WorkflowContext:
        context = AsyncWorkflowContext if asynchronous else WorkflowContext
        return context(self.writer, self.execution, self.recorded, self.backend.clock, self.claimed_at,
                       trace=self.trace, trace_context=self.trace_context)

    def _input(self):
        return json.loads(self.execution.input_json)

    def run(self) -> DeliveryOutcome:
        """Run the prepared workflow on this thread: a sync one, or an async one on an event loop
        of its own (`run_to_end`). Its context is of no use once this returns (`FencedWriter.end`)."""
        try:
            return self._run()
        finally:
            self.writer.end()

    def _run(self) -> DeliveryOutcome:
        ctx = self._context(self.asynchronous)
        attached = None if self.trace is None else self.trace.attach()  # the workflow's code sees its span
        try:
            if self.asynchronous:  # on an event loop of its own, closed with the delivery
                result = run_to_end(self.fn(ctx, self._input()))
            else:
                result = self.fn(ctx, self._input())
                if inspect.iscoroutine(result) and not ctx._keys_used:
                    # A plain function that returned a coroutine, without using its context: it
                    # is an async workflow after all (see worker/async_context.py).
                    result.close()
                    ctx = self._context(True)
                    result = run_to_end(self.fn(ctx, self._input()))
        except Exception as exc:
            return self._raised(ctx, exc)
        except (Suspend, StopDelivery, RetryLater) as exc:  # ReplayDiverged is a Suspend
            return self._raised(ctx, exc)
        finally:
            if attached is not None:
                self.trace.detach(attached)
        return self._returned(ctx, result)

    async def run_async(self) -> DeliveryOutcome:
        """Run the prepared async workflow as a task of the running event loop. Cancelled after
        `stop`, it ends as `LeaseLost`; cancelled otherwise, the cancellation goes on up. Its
        context is of no use once this returns: tasks the workflow left running on the loop
        get `DeliveryEnded` from it."""
        try:
            return await self._run_async()
        finally:
            self.writer.end()

    async def _run_async(self) -> DeliveryOutcome:
        import asyncio  # imported by the first async workflow: see `run_to_end`

        ctx = self._context(True)
        if self.trace is not None:
            self.trace.attach()  # in this task's own context, which ends with it
        try:
            result = await self.fn(ctx, self._input())
        except asyncio.CancelledError:
            if self.writer.stopped:
                return LeaseLost()
            raise
        except Exception as exc:
            return self._raised(ctx, exc)
        except (Suspend, StopDelivery, RetryLater) as exc:  # ReplayDiverged is a Suspend
            return self._raised(ctx, exc)
        return self._returned(ctx, result)

    def _raised(self, ctx: WorkflowContext, exc: BaseException) -> DeliveryOutcome:
        if isinstance(exc, ReplayDiverged):
            return Suspended(diverged=exc.detail)
        if isinstance(exc, Suspend):
            return suspended(exc)
        if isinstance(exc, StopDelivery):  # a refused write, or one of the door shut on abandoning a step
            return unwound(self.writer, ctx) or LeaseLost()
        if isinstance(exc, RetryLater):
            return Retry(exc.reason, storage_error=exc.storage_error)
        if isinstance(exc, StorageError):  # workflow code that called the ledger itself, outside a step
            return unwound(self.writer, ctx) or storage_retry(exc)
        ended = unwound(self.writer, ctx)
        if ended is not None:
            return ended
        detail = ctx._left_behind("raised")  # a path the records do not know: parked, not failed
        if detail is not None:
            return Suspended(diverged=detail)
        return self._within_limit(Failed(json.dumps(error_info(exc))))

    def _returned(self, ctx: WorkflowContext, result) -> DeliveryOutcome:
        ended = unwound(self.writer, ctx)
        if ended is not None:
            return ended
        detail = ctx._left_behind("returned")
        if detail is not None:
            return Suspended(diverged=detail)
        try:
            return self._within_limit(Completed(json.dumps(result, allow_nan=False)))
        except (TypeError, ValueError) as exc:
            return failure("NonSerialisableResult", f"workflow {self.execution.workflow!r} returned a value that is"
                           f" not JSON-serialisable: {exc}")


    def _within_limit(self, outcome: Completed | Failed) -> Completed | Failed:
        """`outcome`, or, if its result or error is above the ledger's payload limit (which would
        refuse to acknowledge it), what is acknowledged in its place: the error with its
        traceback cut short (`error_within`), else a failure with `PayloadTooLarge`."""
        limit = self.backend.max_payload_bytes
        completed = isinstance(outcome, Completed)
        name, text = ("result", outcome.result_json) if completed else ("error", outcome.error_json)
        if arguments.within_limit(text, limit):
            return outcome
        too_large = PayloadTooLarge(name, arguments.utf8_size(text), limit)
        message = str(too_large)
        if not completed:  # its traceback cut short, else at least what it raised
            raised = json.loads(text)
            cut = error_within(raised, lambda error: arguments.within_limit(json.dumps(error), limit))
            if cut is not None:
                return Failed(json.dumps(cut))
            message += f"; the workflow raised {raised['type']}"
        return failure(type(too_large).__name__, message)


def run_delivery(backend, lease: ExecutionLease, registry: Registry, *,
                 may_write: Callable[[], bool] = always, claimed_at: Optional[int] = None,
                 start: Optional[tuple[str, str]] = None, trace_context: Optional[str] = None,
                 step_seconds: Optional[list[float]] = None) -> DeliveryOutcome:
    """Run one delivery of `lease.execution_id` with its fencing token and return its outcome.

    Args:
        may_write: asked before every ledger call; False stops the delivery (`LeaseLost`).
        claimed_at: the ledger time (ms) at which the lease was claimed. Timers and retry
            backoffs are judged due against the backend's clock, but never against a time
            earlier than this (see the module doc). None: the backend's clock alone.
        start: (workflow, input JSON) of the execution when this is its first delivery, as the
            claim found them (`Claimed`): nothing is recorded under an earlier token, so there
            is nothing to read. None: read the execution and its recorded steps.
        trace_context: the trace context the execution's start stored (`Claimed`): the
            delivery's span, if this process traces, is its child.
        step_seconds: a list to which how long each step attempt took (s) is appended, for
            the supervisor's metrics (`Done.steps`).
    """
    delivery = WorkflowRun(backend, lease, registry, may_write=may_write, claimed_at=claimed_at, start=start,
                           trace_context=trace_context)
    if step_seconds is not None:
        delivery.writer.step_seconds = step_seconds
    try:
        outcome = delivery.prepare()
        if outcome is None:
            outcome = delivery.run()
    except StorageError as exc:  # raised outside the workflow's own code
        outcome = storage_retry(exc)
    except Exception as exc:
        delivery.end(raised_outside(exc))  # as its caller reports it
        raise
    return delivery.end(outcome)
