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
  while it runs; that is fine, as the delivery is all the loop has.
- Steps run one at a time: starting an operation while another of the same workflow is still
  running (two `ctx.run` in an `asyncio.gather`, say) raises `InvalidArgument`, because unnamed
  steps are numbered in call order and a replay must meet them in the same order.
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

import inspect
from typing import Any, Awaitable, Callable, Iterable, Optional

from supervisor.ledger.errors import InvalidArgument

from .context import WorkflowContext
from .retry import RetryPolicy
from .stores import StoreHandle


def is_async_workflow(fn: Callable) -> bool:
    """Whether the workflow `fn` is a coroutine function, a partial of one, or an object whose
    `__call__` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


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
    """What an `async def` workflow sees of its execution. One instance per delivery."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._busy: Optional[str] = None  # the operation running now, if any

    # -- steps -------------------------------------------------------------------------------

    async def run(self, key_or_fn: Any, *args: Any, retry: Optional[RetryPolicy] = None, **kwargs: Any) -> Any:
        """As `WorkflowContext.run`; `fn` may be a coroutine function."""
        self._one_at_a_time("ctx.run")
        key, fn, args = self._step_call(key_or_fn, args, retry)
        return await self._astep(key, fn, args, kwargs, retry)

    async def effect(self, key: str, fn: Callable[[str], Any], *, retry: Optional[RetryPolicy] = None,
                     external: bool = False) -> Any:
        """As `WorkflowContext.effect`; `fn` may be a coroutine function unless `external`."""
        self._one_at_a_time("ctx.effect")
        if external:
            if inspect.iscoroutinefunction(fn):
                raise InvalidArgument(f"effect {key!r}: the request function of an external effect must be a plain"
                                      " function, not a coroutine function")
            return super().effect(key, fn, retry=retry, external=True)
        key = self._named_key(key)
        effect_id = self._derived_id(key)

        async def perform() -> Any:
            settled = self._effect_begin(effect_id)
            if settled is not None:
                return settled.value
            result = fn(effect_id)
            return self._effect_settle(key, effect_id, await result if inspect.isawaitable(result) else result)

        return await self._astep(key, perform, (), {}, retry)

    async def _astep(self, key: str, fn: Callable, args: tuple, kwargs: dict, policy: Optional[RetryPolicy]) -> Any:
        attempt, replayed = self._step_start(key)
        if attempt is None:
            return replayed
        self._busy = f"step {key!r}"
        try:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            return self._step_raised(key, attempt, exc, policy)
        finally:
            self._busy = None
        return self._step_done(key, attempt, value)

    def _one_at_a_time(self, what: str) -> None:
        if self._busy is not None:
            raise InvalidArgument(f"{what} was called while {self._busy} of this workflow is still running: the"
                                  " operations of one workflow run one at a time, so await each before the next")

    # -- the rest, awaited -------------------------------------------------------------------
    # The same calls as the sync context's, as coroutines (or an async store handle): a type
    # checker sees an override with another return type, which is the point.

    async def sleep(self, key: str, seconds: float) -> None:  # type: ignore[override]
        self._one_at_a_time("ctx.sleep")
        super().sleep(key, seconds)

    async def sleep_until(self, key: str, when: Any) -> None:  # type: ignore[override]
        self._one_at_a_time("ctx.sleep_until")
        super().sleep_until(key, when)

    async def start(self, key: str, workflow: str, input: Any = None) -> str:  # type: ignore[override]
        self._one_at_a_time("ctx.start")
        return super().start(key, workflow, input)

    async def wait_for(self, execution_id: str, key: Optional[str] = None) -> Any:
        self._one_at_a_time("ctx.wait_for")
        return super().wait_for(execution_id, key)

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
        self._ctx._one_at_a_time("store.get_or_create")
        return self._handle.get_or_create(key, initial)

    async def update(self, key: str, fn: Callable[[Any], Any]) -> Any:
        self._ctx._one_at_a_time("store.update")
        return self._handle.update(key, fn)

    async def update_from(self, key: str, items: dict) -> Any:
        self._ctx._one_at_a_time("store.update_from")
        return self._handle.update_from(key, items)

    async def delete_from(self, key: str, names: Iterable[str]) -> dict:
        self._ctx._one_at_a_time("store.delete_from")
        return self._handle.delete_from(key, names)

    async def take(self, key: str, match: Any = None, *, wait: bool = True) -> Any:
        self._ctx._one_at_a_time("store.take")
        return self._handle.take(key, match, wait=wait)
