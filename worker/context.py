"""The `ctx` a workflow function receives: recorded steps, durable timers, retries.

Replay rule (RFC 002): a step with a recorded result is skipped and its recorded value returned;
a step without one runs, and its result is recorded through the fenced heap before the workflow
sees it. The workflow always continues with the *recorded* value, so a fresh run and a replay
see exactly the same data (a tuple comes back as a list in both).

Step records are JSON objects: `{"value": v}` for a result, `{"error": {type, message,
traceback}, "retry_at": ms | null}` for a failed attempt (`done` is false while another attempt
is scheduled), `{"until": ms}` for a timer.

A record is never above the ledger's payload limit (`max_payload_bytes`, which would refuse it):
a result too large is recorded as the step's last attempt failed with `PayloadTooLarge`, not
retried, and raised into the workflow as `StepFailed` like any failed step; an error too large
keeps its type and message and the end of its traceback (`WorkflowContext._within_limit`).

A record written while other steps overlapped it carries `"group": <name>` as well (see
`worker._runtime.order`, which also states the order rule every replay keeps: a replay that
breaks it parks the execution, `ReplayDiverged`, before anything runs or is written).

Unnamed steps, `ctx.run(fn, *args)`, are keyed `@<n>:<qualified name of fn>`, where n counts the
unnamed steps of the workflow in call order from 1. A replay that reaches unnamed step n with a
different function than the one recorded there has diverged: the workflow code changed, or it
took a different path, and its records can no longer be trusted to line up.

Patch markers, `ctx.patched(patch_id)`, are keyed `@0:patch:<patch_id>` and record `{"value":
true}`. Named keys may not start with `@` and unnamed steps count from 1, so a marker's key is
nobody else's (and a release that knows no patches reads it as unnamed step 0, which it never
reaches).

Steps may overlap (`asyncio.gather` of `ctx.run` calls, `ctx.parallel`), so the context's
bookkeeping is shared by the threads and tasks of one delivery. A step is *in flight* from the
moment its function is called until its outcome is recorded. Unnamed steps are numbered in call
order, and an order that depends on which of several running steps ends first would not be the
same on a replay; so an unnamed step may neither start while another step is in flight nor be in
flight while another starts: the step that starts then raises `InvalidArgument`.
"""

from __future__ import annotations

import datetime as _dt
import inspect
import json
import threading
import time
import traceback
from contextvars import ContextVar
from typing import Any, Callable, NamedTuple, Optional

from supervisor.ledger.arguments import LAST_TIME, MAX_TIME_MS, MIN_TIME_MS, TIME_RANGE, finite, identifier
from supervisor.ledger import arguments
from supervisor.ledger.errors import InvalidArgument, PayloadTooLarge, StepFailed, StepTimeout, StorageError
from supervisor.ledger.values import ExecutionRecord, HeapRecord

from ._runtime.derived_ids import derived_id
from .effects import EffectsMixin
from .messages import MessagesMixin
from ._runtime.fenced import FencedWriter
from .parallel import ParallelMixin
from .retry import RetryableError, RetryPolicy
from .starts import StartsMixin
from .stores import StoresMixin
from .timeouts import StepThread, checked_timeout
from ._runtime import abandoned
from ._runtime.order import Order
from ._runtime.tracing import NO_STEP, DeliveryTrace
from ._runtime.unwinding import EndOfHistory, ReplayDiverged, StopDelivery, Suspend

AUTO_PREFIX = "@"

# The steps whose function encloses the code running now, innermost first, as a chain of
# (id of their context, step key, the chain outside it), or None: a step started in there is
# nested (its records say `"within"`), and an async suspension in there must not wait for them
# to land (`AsyncWorkflowContext._drained`). A chain of tuples costs one tuple per step.
_ENCLOSING: ContextVar[Optional[tuple]] = ContextVar("yieldstar_enclosing_steps", default=None)


def enclosing_steps(owner: int) -> list[str]:
    """The keys of the steps of context `owner` whose function encloses the code running now,
    innermost first."""
    keys, link = [], _ENCLOSING.get()
    while link is not None:
        if link[0] == owner:
            keys.append(link[1])
        link = link[2]
    return keys


PATCH_PREFIX = "@0:patch:"  # see the module doc
MAX_PATCH_ID_LENGTH = 255 - len(PATCH_PREFIX)

# One encoder for every record: `json.dumps(..., allow_nan=False)` builds a new one per call.
_to_json = json.JSONEncoder(allow_nan=False).encode
# Values of exactly these types come back from a JSON round trip unchanged.
_JSON_SCALARS = frozenset((str, int, float, bool, type(None)))


class Write(NamedTuple):
    """A step attempt to record. The end of a step is said once for both contexts, in three
    parts: what to write (`_done_write`, `_raised_write`), the write (made in the caller's thread
    by `_record`; awaited by `AsyncWorkflowContext._record_async`, so that the event loop runs the
    worker's other deliveries while the write waits for its commit), and what the workflow sees
    of the record (`_done_value`, `_replay`)."""

    key: str
    attempt: int
    done: bool
    response_json: str


def _name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def error_info(exc: BaseException) -> dict:
    """The JSON form of an error: its type, message and traceback."""
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }


CUT_SHORT = "... (the start of this traceback is cut: the whole error is above the payload limit)\n"


def error_within(error: dict, fits: Callable[[dict], bool]) -> Optional[dict]:
    """`error` (as `error_info` makes it) with its traceback cut to its end, as little as will
    make `fits(error)` true; None if it does not fit even without its traceback.

    An error is a step's or a workflow's only record of why it failed, so one above the payload
    limit keeps its type and message, and as much of its traceback as fits (the innermost frames,
    nearest the raise), instead of being replaced. Only on that error path is anything encoded
    more than once: each try halves what is kept of the traceback."""
    traceback_ = error.get("traceback")
    keep = len(traceback_) if isinstance(traceback_, str) else 0
    while keep > 0:
        keep //= 2
        cut = {**error, "traceback": CUT_SHORT + traceback_[len(traceback_) - keep:]}
        if fits(cut):
            return cut
    cut = {**error, "traceback": None}
    return cut if fits(cut) else None


class WorkflowContext(StartsMixin, EffectsMixin, StoresMixin, MessagesMixin, ParallelMixin):
    """What a workflow function sees of its execution. One instance per delivery: once the
    delivery ended, every operation raises `DeliveryEnded` and writes nothing, wherever the
    instance was kept (see `worker._runtime.driver`)."""

    def __init__(self, writer: FencedWriter, execution: ExecutionRecord, recorded: list[HeapRecord],
                 clock: Callable[[], int], claimed_at: Optional[int] = None, *,
                 trace: Optional[DeliveryTrace] = None, trace_context: Optional[str] = None):
        """`trace`: the delivery's span, if its process traces (each step attempt is a child span
        of it); `trace_context`: the one its start stored, which a child start passes on where
        this process traces nothing (`worker._runtime.tracing`)."""
        self.execution_id = execution.execution_id
        self.workflow = execution.workflow
        self.token = writer.lease.token
        self._writer = writer
        self._backend = writer.backend
        self._clock = clock
        self._claimed_at = claimed_at
        self._recorded: dict[str, HeapRecord] = {}
        self._auto_recorded: dict[int, str] = {}
        for record in recorded:  # in write order, so the highest attempt of each step wins
            self._recorded[record.step_key] = record
            if record.step_key.startswith(AUTO_PREFIX):
                self._auto_recorded[int(record.step_key[1:].split(":", 1)[0])] = record.step_key
        self._order = Order(recorded)
        self._history = bool(recorded)
        self._keys_used: set[str] = set()
        # The group each step's records carry, once it has one (it overlapped others, is an item
        # of `parallel`, or joined a group a crash left partly recorded), and the cluster of
        # overlapping steps now in flight: its name and its members (see `worker._runtime.order`).
        self._groups: dict[str, str] = {}
        self._cluster = ""
        self._cluster_first = ""  # the step that started the cluster
        self._cluster_size = 0
        self._within: dict[str, str] = {}  # nested step -> the step whose function started it
        self._patches: dict[str, bool] = {}  # what `patched` answered, by patch id
        self._checking = False  # a check replay (`worker._runtime.check`): nothing runs, nothing is written
        self._auto_count = 0
        # Guards the claims of step keys (a check, then an add) against the threads of parallel
        # steps. `_in_flight` is changed by one dict operation at a time, each atomic, and read
        # through a copy: every fresh step takes off and lands, and needs no lock for it.
        self._lock = threading.RLock()
        self._in_flight: dict[str, bool] = {}  # the steps whose function runs now: key -> unnamed
        self._unwound: Optional[BaseException] = None
        self._trace = trace
        self._trace_context = trace_context

    # -- time --------------------------------------------------------------------------------

    def now_ms(self) -> int:
        """The ledger's time in ms since the epoch: the backend's clock, but never earlier than
        the claim that started this delivery (see `_now`)."""
        self._alive()
        return self._now()

    # -- steps -------------------------------------------------------------------------------

    def run(self, key_or_fn: Any, *args: Any, retry: Optional[RetryPolicy] = None,
            timeout: Optional[float] = None, **kwargs: Any) -> Any:
        """Run `fn(*args, **kwargs)` as the step `key` once, record its JSON result, and return
        the recorded value. `ctx.run(fn, *args)` names the step automatically (see the module doc).

        A step that raises `RetryableError`, or any exception when `retry` is given, is tried
        again after a delay (the workflow suspends meanwhile); once it fails for good,
        `StepFailed` is raised into the workflow.

        With `timeout` (seconds), an attempt still running then fails as `StepTimeout` and is
        retried alike; a function that does not return is abandoned and its worker replaced
        (see `worker.timeouts`). `retry` and `timeout` are not passed on to `fn`.
        """
        key, fn, args = self._step_call(key_or_fn, args, retry, timeout)
        return self._step(key, fn, args, kwargs, retry, timeout)

    def sleep(self, key: str, seconds: float) -> None:
        """A durable timer: the workflow continues `seconds` after this step first ran."""
        if not finite(seconds) or seconds < 0:
            raise InvalidArgument(f"seconds must be a finite number >= 0, got {seconds!r}")
        if seconds * 1000 > MAX_TIME_MS:
            raise InvalidArgument(f"seconds {seconds!r} is longer than the ledger can wait: its times end at {LAST_TIME}")
        self._timer(self._named_key(key), lambda now: min(now + int(seconds * 1000), MAX_TIME_MS))

    def sleep_until(self, key: str, when: Any) -> None:
        """A durable timer until `when`: an aware `datetime`, or seconds since the epoch."""
        if isinstance(when, _dt.datetime):
            if when.tzinfo is None:
                raise InvalidArgument("sleep_until needs an aware datetime (with tzinfo)")
            target = int(when.timestamp() * 1000)
        elif finite(when):
            target = int(when * 1000)
        else:
            raise InvalidArgument(f"when must be an aware datetime or seconds since the epoch, got {when!r}")
        if not MIN_TIME_MS <= target <= MAX_TIME_MS:
            raise InvalidArgument(f"when {when!r} is outside the times the ledger holds: {TIME_RANGE}, in ms since"
                                  " the epoch")
        self._timer(self._named_key(key), lambda now: target)

    # -- deploys -----------------------------------------------------------------------------

    def patched(self, patch_id: str) -> bool:
        """Whether this execution takes the patched path `patch_id` (not awaited, in an async
        workflow too): True for a run beyond its recorded history (which records a marker step)
        and for a replay that meets its recorded marker; False for a replay that reaches it
        where recorded steps remain and no marker was recorded there (nothing is recorded: the
        execution keeps its old path). The answer holds for the rest of the run.

        Raises:
            InvalidArgument: `patch_id` is not a non-empty str of at most 246 characters without
                control characters (nothing is written).
        """
        if not isinstance(patch_id, str):
            raise InvalidArgument(f"patch id must be a str, not {type(patch_id).__name__}")
        if len(patch_id) > MAX_PATCH_ID_LENGTH:
            raise InvalidArgument(f"patch id is {len(patch_id)} characters long; at most {MAX_PATCH_ID_LENGTH}"
                                  f" are allowed (its marker step key adds the prefix {PATCH_PREFIX!r})")
        identifier("patch id", patch_id)
        key = PATCH_PREFIX + patch_id
        with self._lock:
            self._guard()
            known = self._patches.get(patch_id)
            if known is not None:
                return known
            if not self._order.recorded(key) and not self._order.beyond_history():
                self._patches[patch_id] = False  # the old path: recorded steps are still to come
                return False
            self._claim_key(key)  # may diverge: a recorded marker met out of its order
            self._patches[patch_id] = True
        self._recorded_step(key, lambda: True)
        return True

    # -- internals ---------------------------------------------------------------------------

    def _step_call(self, key_or_fn: Any, args: tuple, retry: Any, timeout: Any) -> tuple[str, Callable, tuple]:
        """The step key, function and arguments of a `ctx.run(...)` call."""
        checked_timeout(timeout)
        if isinstance(key_or_fn, str):
            if not args or not callable(args[0]):
                raise InvalidArgument(f"ctx.run({key_or_fn!r}, fn, ...) needs a callable after the step key")
            key, fn, args = self._named_key(key_or_fn), args[0], args[1:]
        elif callable(key_or_fn):
            fn = key_or_fn
            key = self._auto_key(fn)
        else:
            raise InvalidArgument(f"ctx.run() takes a step key or a callable first, not {type(key_or_fn).__name__}")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise InvalidArgument(f"retry must be a RetryPolicy, not {type(retry).__name__}")
        return key, fn, args

    def _alive(self) -> None:
        """Raise `DeliveryEnded` if this context's delivery ended: the context of an earlier
        delivery, kept by a later one or by a thread or task that outlived it, changes nothing."""
        if self._writer.ended:
            raise self._writer.ended_error()

    def _guard(self) -> None:
        """Once the workflow unwound, nothing may carry on, however the unwinding was caught;
        once its delivery ended, nothing may be done with its context at all."""
        self._alive()
        if self._unwound is not None:
            raise type(self._unwound)(*self._unwound.args)
        if self._writer.stopped:
            raise StopDelivery(self._writer.stopped_because)
        if self._writer.storage_failure is not None:
            raise self._writer.retry_later()

    def _now(self) -> int:
        """The time that decides whether a timer or a retry backoff is due.

        The execution was claimable at `claimed_at` by the claimer's clock. A timer found not yet
        due against an earlier time would ask for a wake that is already due, suspend, and be
        claimed again at once, over and over while the clocks disagree; never reading a time
        earlier than the claim's makes a wake found early cost at most one extra delivery.
        """
        try:
            now = self._clock()
        except StorageError as exc:  # a backend whose clock is the database server's
            raise self._writer.failed(exc) from exc
        return now if self._claimed_at is None else max(now, self._claimed_at)

    def _unwind(self, exc: BaseException) -> BaseException:
        self._unwound = exc
        return exc

    def _named_key(self, key: str, reach: bool = True) -> str:
        identifier("step key", key)
        if key.startswith(AUTO_PREFIX):
            raise InvalidArgument(f"step key {key!r} may not start with {AUTO_PREFIX!r}: that is kept for unnamed steps")
        return self._claim_key(key, reach)

    def _auto_key(self, fn: Callable) -> str:
        return self._auto_key_named(getattr(fn, '__qualname__', type(fn).__name__))

    def _auto_key_named(self, name: str) -> str:
        """The next unnamed step's key, `@<n>:<name>` (see the module doc)."""
        with self._lock:
            self._guard()
            in_flight = list(self._in_flight)
            if in_flight:
                running = ", ".join(repr(key) for key in in_flight)
                running = f"steps {running} are" if len(in_flight) > 1 else f"step {running} is"
                raise InvalidArgument(
                    f"an unnamed step of {name} was started while {running} still running: steps that"
                    " overlap must be named, as ctx.run(\"some-key\", fn, ...), because unnamed steps are numbered"
                    " in the order they start and a replay could not tell them apart")
            self._auto_count += 1
            n = self._auto_count
            key = f"{AUTO_PREFIX}{n}:{name}"[:255]
            recorded = self._auto_recorded.get(n)
            if recorded is not None and recorded != key:
                raise self._unwind(ReplayDiverged(f"recorded step {recorded!r} was next, but the code reached {key!r}"))
            return self._claim_key(key)

    def _claim_key(self, key: str, reach: bool = True) -> str:
        with self._lock:
            self._guard()
            # Steps in flight are rare when a step starts; an unnamed one among them rarer still.
            unnamed = self._in_flight and next((running for running, auto in list(self._in_flight.items()) if auto),
                                               None)
            if unnamed and not key.startswith(AUTO_PREFIX):
                raise InvalidArgument(
                    f"step {key!r} was started while the unnamed step {unnamed!r} is still running: steps that"
                    " overlap must be named, so name that one as well: ctx.run(\"some-key\", fn, ...)")
            if key in self._keys_used:
                raise InvalidArgument(f"step key {key!r} is used twice in one run of the workflow")
            self._keys_used.add(key)
            if reach and (self._history or self._checking):  # else nothing to keep the order of
                self._reach(key)
            return key

    def _reach(self, key: str) -> None:
        """The order rule for step `key`, before anything of it runs or is written (under the lock)."""
        detail, group = self._order.reach(key)
        if detail is None and group is None and not self._checking:
            return
        if detail is not None and self._defers(key, group):
            return  # decided by `AsyncWorkflowContext._settle_order`, before the step starts
        self._reached(key, detail, group)

    def _reached(self, key: str, detail: Optional[str], group: Optional[str]) -> None:
        if detail is not None:
            raise self._unwind(ReplayDiverged(detail))
        if group is not None:
            self._groups[key] = group
        if self._checking and not self._order.recorded(key):
            raise self._unwind(EndOfHistory(f"step {key!r} is not recorded yet"))

    def _defers(self, key: str, group: Optional[str]) -> bool:
        """Whether the verdict on step `key` waits for the workflow's other tasks (async only)."""
        return False

    def _reach_together(self, keys: list[str], group: Optional[str]) -> None:
        """`_reach` for steps reached at once (a parallel call's items; an effect and its request)."""
        with self._lock:
            detail = self._order.reach_together(keys, group)
            if detail is not None:
                raise self._unwind(ReplayDiverged(detail))
            if self._checking and not all(self._order.recorded(key) for key in keys):
                raise self._unwind(EndOfHistory(f"step {keys[0]!r} is not recorded yet"))

    def _left_behind(self, how: str) -> Optional[str]:
        """The divergence detail of a workflow that `how` ("returned", "raised") with recorded
        steps not reached, or None."""
        with self._lock:
            return self._order.left_behind(how)

    def _take_off(self, key: str) -> None:
        """Step `key` began (`_step_start` said it runs): it is in flight until `_landed`. It
        starts a cluster of overlapping steps, named after its group if it has one, else after
        itself, or joins the cluster of the steps in flight."""
        if not self._in_flight:
            # Alone, and so enclosed by no step: no lock. Threads that race here are items of one
            # `parallel` call, whose records carry the call's key as their group whatever the
            # cluster says.
            self._cluster = self._groups.get(key) or key if self._groups else key
            self._cluster_first, self._cluster_size = key, 1
            self._in_flight[key] = key.startswith(AUTO_PREFIX)
            return
        with self._lock:
            if self._in_flight:
                self._join_cluster(key)
            else:
                self._cluster = self._groups.get(key) or key
                self._cluster_first, self._cluster_size = key, 1
            self._in_flight[key] = key.startswith(AUTO_PREFIX)
            if _ENCLOSING.get() is not None:
                self._nest(key)

    def _nest(self, key: str) -> None:
        """Under the lock: if a step of this delivery encloses the code running now, `key` is
        nested in it."""
        outer = next((step for step in enclosing_steps(id(self)) if step != key), None)
        if outer is not None:
            self._within.setdefault(key, outer)

    def _join_cluster(self, key: str) -> None:
        """Under the lock, with steps in flight: `key` overlaps them, so it and they are a group."""
        if self._cluster_size == 1:
            self._groups.setdefault(self._cluster_first, self._cluster)
        self._cluster_size += 1
        self._groups[key] = self._cluster

    def _grouped(self, key: str, response: dict) -> dict:
        """`response` with its step's group, if it has one; a record written while steps are in
        flight (a timer's, a start's) joins their cluster."""
        if self._in_flight and key not in self._in_flight:
            with self._lock:
                if self._in_flight:
                    self._join_cluster(key)
                    if _ENCLOSING.get() is not None:
                        self._nest(key)
        if self._groups:
            group = self._groups.get(key)
            if group is not None:
                response["group"] = group
        if self._within:
            within = self._within.get(key)
            if within is not None:
                response["within"] = within
        return response

    def _landed(self, key: str) -> None:
        """Step `key` is no longer in flight: its outcome is recorded, or it never will be."""
        self._in_flight.pop(key, None)

    def _write(self, key: str, attempt: int, done: bool, response: dict) -> HeapRecord:
        return self._record(Write(key, attempt, done, _to_json(self._grouped(key, response))))

    def _record(self, write: Write) -> HeapRecord:
        write = self._within_limit(write)
        record = self._writer.write_step(write.key, write.attempt, write.done, write.response_json)
        self._recorded[write.key] = record
        return record

    def _within_limit(self, write: Write) -> Write:
        """`write`, or, if its record is above the ledger's payload limit (which would refuse
        it), what is recorded in its place:

        - a failed attempt's error with its traceback cut short (`error_within`), retried or
          not as the attempt would have been;
        - for a result, or an error too large even so, the step's last attempt failed with
          `PayloadTooLarge`: not retried, as the same step would most likely return as much
          again, and raised into the workflow as `StepFailed` like any failed step, so that the
          workflow may catch it and go on.
        """
        limit = self._backend.max_payload_bytes
        if arguments.within_limit(write.response_json, limit):
            return write
        is_error = write.response_json.startswith('{"error"')
        what = "result" if write.response_json.startswith('{"value"') else "error" if is_error else "record"
        too_large = PayloadTooLarge(f"step {write.key!r} {what}", arguments.utf8_size(write.response_json), limit)
        info = {"type": type(too_large).__name__, "message": str(too_large), "traceback": None}
        if is_error:
            response = json.loads(write.response_json)
            cut = error_within(response["error"], lambda error: arguments.within_limit(
                _to_json({**response, "error": error}), limit))
            if cut is not None:
                return Write(write.key, write.attempt, write.done, _to_json({**response, "error": cut}))
            info["message"] += f"; the step raised {response['error'].get('type')}"
        response = _to_json(self._grouped(write.key, {"error": info, "retry_at": None}))
        return Write(write.key, write.attempt, True, response)

    def _suspend_until(self, at: int, step_error: Optional[str] = None) -> None:
        """Suspend until `at`; `step_error`: see `Suspend.step_error`."""
        self._writer.request_wake(at)
        suspend = Suspend(f"waiting until {at}")
        suspend.step_error = step_error
        raise self._unwind(suspend)

    def _suspend_waiting(self, what: str) -> None:
        """Suspend with no wake of our own: a registered waiter will be woken by `what`."""
        raise self._unwind(Suspend(f"waiting for {what}"))

    def _child_trace_context(self) -> Optional[str]:
        """The trace context a child start stores: this delivery's span, where this process
        traces; else the one this execution's start stored, passed on."""
        return self._trace_context if self._trace is None else self._trace.child_context()

    def _derived_id(self, key: str) -> str:
        """The effect or start-request id owned by this execution's step `key`."""
        return derived_id(self.execution_id, key)

    def _recorded_step(self, key: str, produce: Callable[[], Any]) -> Any:
        """The recorded value of step `key`, or record `produce()` (a JSON value) as it."""
        record = self._recorded.get(key)
        if record is None:
            record = self._write(key, 1, True, {"value": produce()})
        return self._replay(key, record)

    def _step(self, key: str, fn: Callable, args: tuple, kwargs: dict, policy: Optional[RetryPolicy],
              timeout: Optional[float] = None) -> Any:
        attempt, replayed = self._step_start(key)
        if attempt is None:
            return replayed
        self._take_off(key)
        enclosing = _ENCLOSING.set((id(self), key, _ENCLOSING.get()))  # steps started in fn are nested
        span = NO_STEP if self._trace is None else self._trace.step(key, attempt)
        started = time.monotonic()
        try:
            try:
                if timeout is None:
                    value = fn(*args, **kwargs)
                else:
                    value = self._ended_within(key, attempt, StepThread(
                        lambda: fn(*args, **kwargs), f"yieldstar-step {key}"), timeout, policy)
            except Exception as exc:
                span.failed(exc)
                return self._step_raised(key, attempt, exc, policy)
            if inspect.iscoroutine(value):
                value.close()  # never run: nothing of it happened
                raise InvalidArgument(f"step {key!r}: {_name(fn)} is a coroutine function; run it from an async"
                                      " def workflow, with await ctx.run(...)")
            return self._step_done(key, attempt, value)
        finally:
            span.end()
            self._writer.step_seconds.append(time.monotonic() - started)
            _ENCLOSING.reset(enclosing)
            self._landed(key)

    def _ended_within(self, key: str, attempt: int, step: StepThread, timeout: float,
                      policy: Optional[RetryPolicy]) -> Any:
        """What the step's function on `step` returned, if it ended within `timeout` seconds;
        else the delivery ends (`_abandon`)."""
        if not step.wait(timeout):
            self._abandon(key, attempt, step, timeout, policy)
        return step.result()

    def _abandon(self, key: str, attempt: int, step: StepThread, timeout: float,
                 policy: Optional[RetryPolicy]) -> None:
        """End the delivery for a step function that did not return within its timeout: its
        thread cannot be stopped, so the worker process is to be replaced, and the attempt is
        recorded as failed, past a door already shut to that thread (see `worker.timeouts`).
        Raises `Suspend`, with a wake at the retry's time, or at once once attempts ran out (the
        next delivery replays the failure)."""
        error = StepTimeout(key, attempt, timeout)
        abandoned.abandon(step.thread, str(error))
        write = self._within_limit(self._raised_write(key, attempt, error, policy, step.stack()))
        wake_at = self._now() if write.done else json.loads(write.response_json)["retry_at"]
        self._recorded[key] = self._writer.end_abandoned(f"{error}: its thread was abandoned", *write, wake_at)
        suspend = Suspend(f"step {key!r} timed out; waiting until {wake_at}")
        if not write.done:  # a retry waits: the timeout is this attempt's error
            suspend.step_error = json.dumps({"type": type(error).__name__, "message": str(error), "step": key,
                                             "attempt": attempt})
        raise self._unwind(suspend)

    def _step_start(self, key: str) -> tuple[Optional[int], Any]:
        """`(None, value)` for a step whose recorded value replays, else `(attempt, None)` for a
        step whose function runs now (a retry backoff not yet over suspends instead)."""
        record = self._recorded.get(key)
        attempt = 1
        if record is not None:
            if record.done:
                return None, self._replay(key, record)
            retry_at = json.loads(record.step_response_json).get("retry_at")
            attempt = record.attempt + 1
            if retry_at is not None and self._now() < retry_at:
                self._suspend_until(retry_at)
        if self._checking:
            raise self._unwind(EndOfHistory(f"step {key!r} would run"))
        return attempt, None

    def _step_done(self, key: str, attempt: int, value: Any) -> Any:
        """Record the value a step's function returned, and return the recorded value."""
        write, as_value = self._done_write(key, attempt, value)
        return self._done_value(key, value, write, as_value, self._record(write))

    def _done_write(self, key: str, attempt: int, value: Any) -> tuple[Write, bool]:
        """What records `value`, and whether it records it as the step's value (not as an error)."""
        try:
            response = {"value": value}
            if self._groups or self._within or len(self._in_flight) > 1:  # it may have a group
                self._grouped(key, response)
            return Write(key, attempt, True, _to_json(response)), True
        except (TypeError, ValueError) as exc:
            info = {"type": "NonSerialisableResult",
                    "message": f"step {key!r} returned a value that is not JSON-serialisable: {exc}",
                    "traceback": None}
            return Write(key, attempt, True, _to_json(self._grouped(key, {"error": info, "retry_at": None}))), False

    def _done_value(self, key: str, value: Any, write: Write, as_value: bool, record: HeapRecord) -> Any:
        if as_value and type(value) in _JSON_SCALARS and record.step_response_json == write.response_json:
            return value  # recorded as sent, so decoding the record would give this very value
        return self._replay(key, record)

    def _step_raised(self, key: str, attempt: int, exc: Exception, policy: Optional[RetryPolicy]) -> Any:
        """What a step's function raising `exc` comes to: a recorded failed attempt (see
        `_raised_write`), or, for a storage error, the end of the delivery."""
        return self._replay(key, self._record(self._raised_write(key, attempt, exc, policy)))

    def _raised_write(self, key: str, attempt: int, exc: Exception, policy: Optional[RetryPolicy],
                      stack: Optional[str] = None) -> Write:
        """What records `exc` as the failed attempt `attempt`; `stack`, where the step was, in
        place of the traceback of an error it did not raise itself (a timeout)."""
        if isinstance(exc, StorageError):
            # The step called the ledger itself and its storage failed: a fault of the host, not
            # of the step, so it is not recorded as the step's error; the delivery is retried.
            raise self._writer.failed(exc) from exc
        if isinstance(exc, RetryableError):
            policy = exc.policy
        info = error_info(exc)
        if stack:
            info["traceback"] = f"{info['traceback']}the step's thread was abandoned at:\n{stack}"
        if policy is not None and attempt < policy.max_attempts:
            retry_at = self._now() + policy.delay_ms(attempt)
            return Write(key, attempt, False, _to_json(self._grouped(key, {"error": info, "retry_at": retry_at})))
        return Write(key, attempt, True, _to_json(self._grouped(key, {"error": info, "retry_at": None})))

    def _replay(self, key: str, record: HeapRecord) -> Any:
        response = json.loads(record.step_response_json)
        if "value" in response:
            return response["value"]
        if "until" in response:
            return None
        error = response["error"]
        if not record.done:
            self._suspend_until(response["retry_at"], json.dumps(
                {"type": error["type"], "message": error["message"], "step": key, "attempt": record.attempt}))
        raise StepFailed(key, error["type"], error["message"], record.attempt, error.get("traceback"))

    def _timer(self, key: str, target: Callable[[int], int]) -> None:
        record = self._recorded.get(key)
        if record is None:
            record = self._write(key, 1, True, {"until": target(self._now())})
        until = json.loads(record.step_response_json)["until"]
        if self._now() < until:
            self._suspend_until(until)
