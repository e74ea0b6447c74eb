"""The `ctx` of an `async def` workflow: every operation of `WorkflowContext`, awaited.

    @workflow("order")
    async def order(ctx, input):
        details = await ctx.run("load", load_order, input["order_id"])   # sync or async fn
        await ctx.sleep("cool-off", 5)
        return details

The rules are the sync SDK's, from the same code: a recorded step replays its value without
calling its function, errors and retries are recorded alike, suspension, a lost lease and a
storage error unwind the workflow with `BaseException`s that `except Exception` cannot swallow,
and every write is fenced. What async adds:

- A step function may be a plain function or an `async def` (or return an awaitable), in
  `ctx.run` and `ctx.effect`. A plain one runs on the event loop's thread, blocking the loop
  while it runs: with one delivery per worker the delivery is all the loop has; under
  `supervise --workers` it holds up the worker's other async deliveries too (docs/async.md).
- Named steps may run at once (`asyncio.gather` of `ctx.run` calls, `ctx.parallel`); an unnamed
  step may not overlap another, because unnamed steps are numbered in call order and a replay
  must meet them in the same order (`InvalidArgument` says so). An operation that suspends
  while other steps are in flight lets them land (end and be recorded) before it unwinds.
- The request function of an external effect (`external=True`) must be a plain function.

Each delivery runs on an event loop of its own (`asyncio.run`), closed when the delivery ends;
tasks the workflow left running are cancelled then. A delivery started where an event loop is
already running in the thread (`worker.testing.run_workflow` from an async test) runs its loop
on a thread of its own instead. The exceptions that end a delivery (`Suspend`, `StopDelivery`,
`RetryLater`, `ReplayDiverged`) are `BaseException`s that are neither `KeyboardInterrupt` nor
`SystemExit`: asyncio sets them on the task like any error, and `asyncio.run` raises them again,
so the driver maps them exactly as for a sync workflow.

A workflow is taken for async when it is a coroutine function, a `functools.partial` of one, or
an object whose `__call__` is one (`is_async_workflow`). A plain function that returns a
coroutine anyway (a decorator's wrapper, say) is called again with this context, its first
coroutine closed unrun, provided it did not use the sync context it was given first: workflow
code runs again on every delivery, so running its prologue twice is within its contract. Heartbeats are answered by a thread of the
worker, not by the loop, so a step that blocks the loop does not silence the worker; one that
holds the GIL in C code for longer than the heartbeat tolerance does, as in a sync workflow.
"""

from __future__ import annotations

import functools
import inspect
import time
from contextvars import ContextVar
from typing import Any, Awaitable, Callable, Iterable, Optional

from supervisor.ledger.errors import InvalidArgument, StepTimeout
from supervisor.ledger.values import HeapRecord

from ._runtime.tracing import NO_STEP
from ._runtime.unwinding import ReplayDiverged, Suspend
from .context import _ENCLOSING, Write, WorkflowContext, enclosing_steps
from .parallel import Ended, ParallelCall, is_coroutine_function
from .retry import RetryPolicy
from .stores import StoreHandle
from .timeouts import StepThread, awaited_within


# Set while `ctx.run` (or `ctx.effect`) takes its step key: an order verdict may wait then.
_DEFERRABLE: ContextVar[bool] = ContextVar("yieldstar_order_deferrable", default=False)


def is_async_workflow(fn: Callable) -> bool:
    """Whether the workflow `fn` is a coroutine function, a partial of one, or an object whose
    `__call__` is one."""
    return is_coroutine_function(fn)


def run_to_end(awaitable: Awaitable) -> Any:
    """Run `awaitable` on an event loop of its own and return its result (or raise its error,
    `BaseException`s included); the loop is closed, and tasks left running cancelled, at the end."""
    # asyncio is imported here, by the first async workflow: importing it (and the ssl module it
    # brings) would add about 40 ms to the start of every worker, for every app.
    import asyncio
    import concurrent.futures

    main = awaitable if inspect.iscoroutine(awaitable) else _awaited(awaitable)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main)
    # A loop runs in this thread already, and asyncio.run cannot nest: one thread for this loop.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="yieldstar-delivery") as pool:
        return pool.submit(asyncio.run, main).result()


async def _awaited(awaitable: Awaitable) -> Any:
    return await awaitable


class AsyncWorkflowContext(WorkflowContext):
    """What an `async def` workflow sees of its execution. One instance per delivery, of no use
    once it ended (`DeliveryEnded`), to a task left running on the worker's loop too."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # Set, on the delivery's loop, whenever a step in flight lands (see `_drained`).
        self._landing: Optional[tuple[Any, Any]] = None  # (loop, asyncio.Event)
        # Steps reached whose order verdict waits (`_settle_order`), in the order they were reached.
        self._unsettled: dict[str, None] = {}

    # -- steps -------------------------------------------------------------------------------

    async def run(self, key_or_fn: Any, *args: Any, retry: Optional[RetryPolicy] = None,
                  timeout: Optional[float] = None, **kwargs: Any) -> Any:
        """As `WorkflowContext.run`; `fn` may be a coroutine function, which `timeout` cancels.
        Named steps may overlap (`asyncio.gather`); an unnamed one may not (see `worker.context`)."""
        return await self._settled(functools.partial(self._run, key_or_fn, args, kwargs, retry, timeout))

    async def _run(self, key_or_fn: Any, args: tuple, kwargs: dict, retry: Optional[RetryPolicy],
                   timeout: Optional[float]) -> Any:
        deferrable = _DEFERRABLE.set(True)
        try:
            key, fn, args = self._step_call(key_or_fn, args, retry, timeout)
        finally:
            _DEFERRABLE.reset(deferrable)
        if self._unsettled:
            await self._settle_order(key)
        return await self._astep(key, fn, args, kwargs, retry, timeout)

    def _defers(self, key: str, group: Optional[str]) -> bool:
        if not _DEFERRABLE.get():
            return False
        self._unsettled[key] = None
        return True

    async def _settle_order(self, key: str) -> None:
        """Decide on step `key`, whose order verdict waits (see `worker._runtime.order`, "Async
        workflows"): let the workflow's other tasks run until none reaches a step any more, then
        judge again. Nothing of the step has run or been written meanwhile."""
        import asyncio

        if key not in self._unsettled:
            return
        order = self._order
        while True:
            with self._lock:
                self._guard()  # another task's verdict may have unwound the workflow meanwhile
                detail = order.verdict(key)
                reaches = order.reaches
            if detail is None:
                break
            await asyncio.sleep(0)
            with self._lock:
                if order.reaches == reaches:  # nobody else reached a step: the verdict stands
                    detail = order.verdict(key)
                    if detail is not None:
                        # Blame the first step reached that still breaks the order, if another
                        # one waits too: the others may only follow from it.
                        first = next(waiting for waiting in self._unsettled if order.verdict(waiting))
                        detail = order.verdict(first)
                        raise self._unwind(ReplayDiverged(detail))
        with self._lock:
            del self._unsettled[key]
            self._reached(key, None, None if order.recorded(key) else order.open_group())

    async def parallel(self, key: str, fn: Callable[[Any], Any], items: Iterable, *,  # type: ignore[override]
                       max_concurrency: Optional[int] = None, retry: Optional[RetryPolicy] = None,
                       timeout: Optional[float] = None) -> list:
        """As `WorkflowContext.parallel`: a plain `fn` runs on threads, an `async def` one as
        tasks of this loop, at most `max_concurrency` at a time."""
        return await self._settled(functools.partial(self._parallel, key, fn, items, max_concurrency, retry, timeout))

    async def _parallel(self, key: str, fn: Callable, items: Iterable, max_concurrency: Optional[int],
                        retry: Optional[RetryPolicy], timeout: Optional[float]) -> list:
        call = self._parallel_call(key, fn, items, max_concurrency, retry, timeout, asynchronous=True)
        on = self._tasks_result if is_coroutine_function(fn) else self._threads_result
        return await on(call, fn, retry, timeout)

    async def effect(self, key: str, fn: Callable[[str], Any], *, retry: Optional[RetryPolicy] = None,
                     external: bool = False) -> Any:
        """As `WorkflowContext.effect`; `fn` may be a coroutine function unless `external`."""
        if external:
            if inspect.iscoroutinefunction(fn):
                raise InvalidArgument(f"effect {key!r}: the request function of an external effect must be a plain"
                                      " function, not a coroutine function")
            return await self._settled(functools.partial(super().effect, key, fn, retry=retry, external=True))
        return await self._settled(functools.partial(self._effect, key, fn, retry))

    async def _effect(self, key: str, fn: Callable[[str], Any], retry: Optional[RetryPolicy]) -> Any:
        deferrable = _DEFERRABLE.set(True)
        try:
            key = self._named_key(key)
        finally:
            _DEFERRABLE.reset(deferrable)
        if self._unsettled:
            await self._settle_order(key)
        effect_id = self._derived_id(key)

        async def perform() -> Any:
            settled = self._effect_begin(effect_id)
            if settled is not None:
                return settled.value
            result = fn(effect_id)
            return self._effect_settle(key, effect_id, await result if inspect.isawaitable(result) else result)

        return await self._astep(key, perform, (), {}, retry)

    async def _astep(self, key: str, fn: Callable, args: tuple, kwargs: dict, policy: Optional[RetryPolicy],
                     timeout: Optional[float] = None) -> Any:
        attempt, replayed = self._step_start(key)
        if attempt is None:
            return replayed
        self._take_off(key)
        # What runs inside this step (tasks it starts included) is enclosed by it: a suspension
        # in there must not wait for this step to land, which waits for it.
        enclosing = _ENCLOSING.set((id(self), key, _ENCLOSING.get()))
        span = NO_STEP if self._trace is None else self._trace.step(key, attempt)
        started = time.monotonic()
        try:
            try:
                if timeout is None:
                    value = fn(*args, **kwargs)
                    if inspect.isawaitable(value):
                        value = await value
                else:
                    value = await self._awaited_within(key, attempt, fn, args, kwargs, timeout, policy)
            except Exception as exc:
                span.failed(exc)
                return self._replay(key, await self._record_async(self._raised_write(key, attempt, exc, policy)))
            write, as_value = self._done_write(key, attempt, value)
            return self._done_value(key, value, write, as_value, await self._record_async(write))
        finally:
            span.end()
            self._writer.step_seconds.append(time.monotonic() - started)
            _ENCLOSING.reset(enclosing)
            self._landed(key)

    async def _awaited_within(self, key: str, attempt: int, fn: Callable, args: tuple, kwargs: dict,
                              timeout: float, policy: Optional[RetryPolicy]) -> Any:
        """What the step's function returned within `timeout` seconds: a coroutine function is
        cancelled then (`StepTimeout` is raised, and recorded as the attempt's error); a plain one
        runs on a thread of its own, abandoned then (see `worker.timeouts`)."""
        expired = StepTimeout(key, attempt, timeout)
        if is_coroutine_function(fn):
            return await awaited_within(fn(*args, **kwargs), timeout, expired)
        deadline = time.monotonic() + timeout
        step = StepThread(lambda: fn(*args, **kwargs), f"yieldstar-step {key}")
        if not await step.wait_async(timeout):
            self._abandon(key, attempt, step, timeout, policy)
        value = step.result()
        if inspect.isawaitable(value):  # a plain function that returned an awaitable: the rest of the time
            value = await awaited_within(value, max(deadline - time.monotonic(), 0.0), expired)
        return value

    async def _record_async(self, write: Write) -> HeapRecord:
        """`_record`, awaited: the event loop runs on while the write waits for its commit."""
        write = self._within_limit(write)
        record = await self._writer.write_step_async(write.key, write.attempt, write.done, write.response_json)
        self._recorded[write.key] = record
        return record

    async def _tasks_result(self, call: ParallelCall, fn: Callable, retry: Optional[RetryPolicy],
                            timeout: Optional[float]) -> list:
        import asyncio

        limit = asyncio.Semaphore(max(call.limit, 1))

        async def item(key: str, value: Any) -> Ended:
            async with limit:
                try:
                    record = self._recorded.get(key)
                    if record is None or not record.done:
                        self._writer.check()  # a stopped delivery starts nothing more
                    return Ended(await self._astep(key, fn, (value,), {}, retry, timeout))
                except asyncio.CancelledError:
                    raise
                except BaseException as exc:  # noqa: BLE001 - every item ends before the call decides
                    return Ended(error=exc)

        return self._parallel_result(list(await asyncio.gather(*map(item, call.keys, call.items))))

    async def _threads_result(self, call: ParallelCall, fn: Callable, retry: Optional[RetryPolicy],
                              timeout: Optional[float]) -> list:
        import asyncio

        # The sync context's way, on a thread of the loop's executor: the loop stays free.
        return self._parallel_result(await asyncio.to_thread(self._parallel_outcomes, call, fn, retry, timeout))

    # -- suspending while other steps are in flight --------------------------------------------

    async def _settled(self, operation: Callable[[], Any]) -> Any:
        """Run `operation` (a coroutine function, or one of the sync context) and return its
        result. If it suspends the workflow, however early (a step may find the workflow already
        unwinding when it starts), first let the steps still in flight land, so that what they
        did is recorded rather than cut short (see docs/async.md)."""
        try:
            result = operation()
            return await result if inspect.iscoroutine(result) else result
        except Suspend:
            await self._drained()
            raise

    async def _drained(self) -> None:
        """Return once no step of this delivery is in flight, but those enclosing the caller."""
        import asyncio

        enclosing = set(enclosing_steps(id(self)))
        while True:
            with self._lock:
                if all(key in enclosing for key in list(self._in_flight)):
                    return
                if self._landing is None:
                    self._landing = (asyncio.get_running_loop(), asyncio.Event())
                loop, landed = self._landing
                landed.clear()
            await landed.wait()

    def _landed(self, key: str) -> None:
        super()._landed(key)
        with self._lock:  # from the loop's thread, or from a thread of `parallel`
            if self._landing is not None:
                loop, landed = self._landing
                if not loop.is_closed():  # a thread that outlived its delivery wakes nobody
                    loop.call_soon_threadsafe(landed.set)

    # -- the rest, awaited -------------------------------------------------------------------
    # The same calls as the sync context's, as coroutines (or an async store handle): a type
    # checker sees an override with another return type, which is the point.

    async def sleep(self, key: str, seconds: float) -> None:  # type: ignore[override]
        await self._settled(functools.partial(super().sleep, key, seconds))

    async def sleep_until(self, key: str, when: Any) -> None:  # type: ignore[override]
        await self._settled(functools.partial(super().sleep_until, key, when))

    async def start(self, key: str, workflow: str, input: Any = None) -> str:  # type: ignore[override]
        return await self._settled(functools.partial(super().start, key, workflow, input))

    async def wait_for(self, execution_id: str, key: Optional[str] = None) -> Any:
        return await self._settled(functools.partial(super().wait_for, execution_id, key))

    async def recv(self, topic: str = "default", timeout: Optional[float] = None) -> Any:  # type: ignore[override]
        return await self._settled(functools.partial(super().recv, topic, timeout))

    async def set_event(self, key: str, value: Any) -> None:  # type: ignore[override]
        await self._settled(functools.partial(super().set_event, key, value))

    def store(self, name: str) -> "AsyncStoreHandle":  # type: ignore[override]
        return AsyncStoreHandle(self, super().store(name))


class AsyncStoreHandle:
    """`StoreHandle` for an async workflow: the same operations, awaited. Change functions
    (`update`'s `fn`) stay plain functions: they run inside the ledger's transaction."""

    def __init__(self, ctx: AsyncWorkflowContext, handle: StoreHandle):
        self._ctx = ctx
        self._handle = handle
        self.name = handle.name

    async def get_or_create(self, key: str, initial: Any) -> Any:
        return await self._ctx._settled(functools.partial(self._handle.get_or_create, key, initial))

    async def update(self, key: str, fn: Callable[[Any], Any]) -> Any:
        return await self._ctx._settled(functools.partial(self._handle.update, key, fn))

    async def update_from(self, key: str, items: dict) -> Any:
        return await self._ctx._settled(functools.partial(self._handle.update_from, key, items))

    async def delete_from(self, key: str, names: Iterable[str]) -> dict:
        return await self._ctx._settled(functools.partial(self._handle.delete_from, key, names))

    async def take(self, key: str, match: Any = None, *, wait: bool = True) -> Any:
        return await self._ctx._settled(functools.partial(self._handle.take, key, match, wait=wait))
