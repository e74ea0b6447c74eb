"""Step timeouts, `ctx.run(key, fn, ..., timeout=seconds)`: how an attempt is stopped at its deadline.

An attempt still running `timeout` seconds after it began counts as a failed attempt whose
recorded error type is "StepTimeout", retried by the step's retry policy; once attempts run out,
the workflow receives `StepFailed` with `error_type == "StepTimeout"`. How it is stopped depends on
what runs it:

- **An async step** (a coroutine function, in an async workflow) is cancelled at the deadline
  (`awaited_within`). The failed attempt is recorded at once, and the workflow goes on in the same
  delivery: it suspends until the retry, or receives `StepFailed`.
- **A plain function** (any step of a sync workflow, or a plain function in an async one) runs on
  a thread of its own (`StepThread`) while the delivery waits for it until the deadline. Python
  cannot stop a thread, so one still running then is *abandoned*, and the delivery ends there
  (`WorkflowContext._abandon`): it shuts its door to the ledger first, so that nothing the
  abandoned thread does afterwards is written (its writes are refused as a stopped delivery's),
  then records the failed attempt itself, fenced by its token, asks for a wake at the retry's time
  (at once when attempts ran out: the next delivery replays the failure as `StepFailed`), and
  ends as `Suspended`. Its `Done` asks the supervisor to replace the worker
  (`worker._runtime.abandoned`), which kills it and releases its other deliveries at once, as it
  does for a delivery that will not stop on a cancel.

The worker records the attempt rather than leave it to the supervisor or the next delivery
because it alone knows the step's key, attempt and policy at that moment, and a fenced write is
refused anyway if the lease was lost meanwhile.
"""

from __future__ import annotations

import contextvars
import sys
import threading
import traceback
from typing import Any, Callable, Optional

from supervisor.ledger.arguments import finite
from supervisor.ledger.errors import InvalidArgument, StepTimeout


def checked_timeout(timeout: Any) -> Optional[float]:
    """`timeout=` as given to `ctx.run` or `ctx.parallel`: None, or a finite number of seconds > 0.

    Raises:
        InvalidArgument: anything else (a bool, a string, 0, a negative number, NaN, infinity).
    """
    if timeout is None:
        return None
    if not finite(timeout) or timeout <= 0:
        raise InvalidArgument(f"timeout must be None or a finite number of seconds > 0, got {timeout!r}")
    return float(timeout)


async def awaited_within(awaitable: Any, timeout: float, expired: StepTimeout) -> Any:
    """Await `awaitable` in this task, cancelled after `timeout` seconds; raises `expired` then.
    A `TimeoutError` the step raises itself stays its own error, and a cancel of the task from
    elsewhere stays a cancel (`asyncio.timeout` does the same from Python 3.11; this works on 3.10)."""
    import asyncio

    task = asyncio.current_task()
    fired = False

    def fire() -> None:
        nonlocal fired
        fired = True
        task.cancel()

    handle = asyncio.get_running_loop().call_later(timeout, fire)
    try:
        return await awaitable
    except asyncio.CancelledError:
        if not fired:
            raise
        if hasattr(task, "uncancel") and task.uncancel() > 0:
            raise  # cancelled from elsewhere too (3.11+ counts the requests)
        raise expired from None
    finally:
        handle.cancel()


class StepThread:
    """A step function running on a thread of its own, in a copy of the caller's context (the
    steps it starts are nested in it), so that its caller can stop waiting for it."""

    def __init__(self, call: Callable[[], Any], name: str):
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._value: Any = None
        self._error: Optional[BaseException] = None
        self._wakes: list[Callable[[], None]] = []
        context = contextvars.copy_context()
        # A daemon: an abandoned step must not keep its process alive at exit.
        self.thread = threading.Thread(target=self._run, args=(context, call), name=name, daemon=True)
        self.thread.start()

    def _run(self, context: contextvars.Context, call: Callable[[], Any]) -> None:
        try:
            self._value = context.run(call)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, whatever it is
            self._error = exc
        finally:
            with self._lock:
                self._done.set()
                wakes, self._wakes = self._wakes, []
            for wake in wakes:
                wake()

    def wait(self, timeout: float) -> bool:
        """Whether the function ended within `timeout` seconds."""
        return self._done.wait(timeout)

    async def wait_async(self, timeout: float) -> bool:
        """`wait`, awaited: the event loop runs on meanwhile."""
        import asyncio

        loop = asyncio.get_running_loop()
        ended = loop.create_future()

        def wake() -> None:
            try:
                loop.call_soon_threadsafe(lambda: ended.done() or ended.set_result(None))
            except RuntimeError:  # the delivery's loop closed before the function ended
                pass

        with self._lock:
            if self._done.is_set():
                return True
            self._wakes.append(wake)
        try:
            await asyncio.wait_for(ended, timeout)
            return True
        except asyncio.TimeoutError:  # the builtin TimeoutError from 3.11 on, not on 3.10
            return False

    def result(self) -> Any:
        """What the function returned, or raise what it raised (once it ended)."""
        if self._error is not None:
            raise self._error
        return self._value

    def stack(self) -> str:
        """Where the function is now: the thread's stack, for the record of its timeout."""
        frame = sys._current_frames().get(self.thread.ident)
        return "".join(traceback.format_stack(frame)) if frame is not None else ""
