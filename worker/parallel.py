"""Parallel steps: `ctx.parallel(key, fn, items)` calls `fn(item)` for every item at once, each
call recorded as its own step `f"{key}[{i}]"`, and returns the results in item order.

Items with a recorded outcome replay it without calling `fn`; the others run, a plain `fn` each
on a thread (at most `max_concurrency` at a time), an `async def` one as a task of an async
workflow's loop. Every item runs to its end before the call decides, so the results of the
others are recorded whatever one of them did; then, once every item has ended:

| some item...                                      | `ctx.parallel`                                  |
| -------------------------------------------------- | ----------------------------------------------- |
| found the delivery stopped (lost lease, storage)   | unwinds as that; items not begun never start    |
| asked to be tried again later (`RetryableError`)   | suspends; the ledger keeps the earliest wake    |
| failed for good                                    | raises the first failed item's `StepFailed`     |
| (none of these)                                    | returns the recorded results, in item order     |
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable
from typing import Any, Callable, NamedTuple, Optional

from supervisor.ledger.arguments import MAX_ID_LENGTH
from supervisor.ledger.errors import InvalidArgument

from ._runtime.unwinding import StopDelivery
from .retry import RetryPolicy
from .timeouts import checked_timeout


class Ended(NamedTuple):
    """How one item's step ended: its recorded value, or what it raised."""

    value: Any = None
    error: Optional[BaseException] = None


def ended(call: Callable[[], Any]) -> Ended:
    try:
        return Ended(call())
    except BaseException as exc:  # noqa: BLE001 - every item ends before the call decides
        return Ended(error=exc)


def is_coroutine_function(fn: Callable) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


class ParallelCall(NamedTuple):
    """A checked `ctx.parallel(...)` call: its item step keys, items, and concurrency limit."""

    keys: list[str]
    items: list
    limit: int  # threads or tasks at once


class ParallelMixin:
    def parallel(self, key: str, fn: Callable[[Any], Any], items: Iterable, *,
                 max_concurrency: Optional[int] = None, retry: Optional[RetryPolicy] = None,
                 timeout: Optional[float] = None) -> list:
        """Call `fn(item)` for every item at once, each call recorded as step `f"{key}[{i}]"`,
        and return the recorded results in item order (see the module doc).

        Args:
            max_concurrency: at most this many calls at a time (threads); None: all at once.
            retry: as `ctx.run`'s, for each item.
            timeout: as `ctx.run`'s, for each attempt of each item.

        Raises:
            InvalidArgument: `key`, `fn`, `items`, `max_concurrency`, `retry` or `timeout` is not
                usable (nothing runs).
            StepFailed: an item failed for good; raised once every item has ended.
        """
        call = self._parallel_call(key, fn, items, max_concurrency, retry, timeout, asynchronous=False)
        return self._parallel_result(self._parallel_outcomes(call, fn, retry, timeout))

    # -- internals ---------------------------------------------------------------------------

    def _parallel_call(self, key: Any, fn: Any, items: Any, max_concurrency: Any,
                       retry: Any, timeout: Any, *, asynchronous: bool) -> ParallelCall:
        """Check every argument, then take the step keys; nothing runs or is written before."""
        self._guard()
        checked_timeout(timeout)
        if not callable(fn):
            raise InvalidArgument(f"ctx.parallel: fn must be callable, not {type(fn).__name__}")
        if not asynchronous and is_coroutine_function(fn):
            raise InvalidArgument(f"ctx.parallel({key!r}): {getattr(fn, '__qualname__', fn)!r} is a coroutine"
                                  " function; run it from an async def workflow, with await ctx.parallel(...)")
        if isinstance(items, (str, bytes, bytearray)) or not isinstance(items, Iterable):
            raise InvalidArgument(f"ctx.parallel: items must be a sequence or another iterable of items, not"
                                  f" {type(items).__name__}")
        if max_concurrency is not None and (not isinstance(max_concurrency, int) or isinstance(max_concurrency, bool)
                                            or max_concurrency < 1):
            raise InvalidArgument(f"ctx.parallel: max_concurrency must be an int >= 1 or None, got {max_concurrency!r}")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise InvalidArgument(f"retry must be a RetryPolicy, not {type(retry).__name__}")
        items = list(items)
        keys = [f"{key}[{i}]" for i in range(len(items))]
        if isinstance(key, str) and keys and len(keys[-1]) > MAX_ID_LENGTH:
            raise InvalidArgument(f"ctx.parallel: key {key!r} makes the step key of its last item {len(keys[-1])}"
                                  f" characters long; at most {MAX_ID_LENGTH} are allowed")
        with self._lock:  # the call's own key and its items' keys, all or none
            taken = [k for k in keys if k in self._keys_used]
            if taken:
                raise InvalidArgument(f"step key {taken[0]!r} is used twice in one run of the workflow")
            self._named_key(key, reach=False)
            self._keys_used.update(keys)
            # The items are one step for the order rule, and one group in the records.
            self._reach_together(keys, key)
            for item_key in keys:
                self._groups.setdefault(item_key, key)
        return ParallelCall(keys, items, min(max_concurrency or len(items), len(items)))

    def _parallel_outcomes(self, call: ParallelCall, fn: Callable, retry: Optional[RetryPolicy],
                           timeout: Optional[float] = None) -> list[Ended]:
        """Every item's outcome: recorded ones replayed here, the others run on threads."""
        outcomes: list[Optional[Ended]] = [None] * len(call.keys)
        missing = []
        for i, key in enumerate(call.keys):
            record = self._recorded.get(key)
            if record is not None and record.done:
                outcomes[i] = ended(functools.partial(self._replay, key, record))
            else:
                missing.append(i)
        if missing:
            # Imported by the first parallel call: a worker that never makes one does not pay
            # for the module at its start.
            import concurrent.futures

            with concurrent.futures.ThreadPoolExecutor(min(call.limit, len(missing)),
                                                       thread_name_prefix="yieldstar-parallel") as pool:
                running = [(i, pool.submit(ended, functools.partial(
                    self._parallel_item, call.keys[i], fn, call.items[i], retry, timeout))) for i in missing]
            for i, future in running:
                outcomes[i] = future.result()
        return outcomes  # type: ignore[return-value]  # every slot is filled

    def _parallel_item(self, key: str, fn: Callable, item: Any,
                       retry: Optional[RetryPolicy], timeout: Optional[float]) -> Any:
        # A stopped delivery starts nothing more; a sibling's suspension does not stop this one,
        # which would otherwise only run on the next delivery.
        self._writer.check()
        return self._step(key, fn, (item,), {}, retry, timeout)

    def _parallel_result(self, outcomes: list[Ended]) -> list:
        """The call's values in item order, or what ends it (see the module doc's table)."""
        if self._writer.stopped:
            raise StopDelivery(self._writer.stopped_because)
        if self._writer.storage_failure is not None:
            raise self._writer.retry_later()
        errors = [outcome.error for outcome in outcomes if outcome.error is not None]
        for error in errors:  # a suspension, a diverged replay: the delivery ends
            if not isinstance(error, Exception):
                raise error
        if errors:
            raise errors[0]
        return [outcome.value for outcome in outcomes]

