"""The application client: start workflows and wait for their results, from sync or async code.

    from worker import Client, WorkflowFailed

    with Client("shop.db") as client:
        handle = client.start("order", {"order_id": 42}, id="order-42")
        receipt = handle.result(timeout=30)

`start` admits an execution (idempotent by `id`); any supervisor on the ledger runs it. `fork`
admits a copy of one that runs again from a recorded step. A `Handle` names one execution:
`status()`, `result(timeout=None)`, `cancel()`, `fork(from_step=...)`. `AsyncClient`
has the same calls as coroutines, for asyncio code (`await handle.result()`), and never blocks
its event loop: ledger calls run on a thread of the client's own.

Waiting (SPEC section 9): `result()` does not poll the ledger in a loop. The commit that makes
an execution terminal announces its id to every waiting client on the host (a datagram to a
socket of theirs, see `supervisor.ledger.sqlite.nudge`); one thread per client listens, reads the records of
the announced executions it waits for, and wakes their waiters, however many threads or tasks
wait on them. An announcement can be lost (a full socket buffer, a commit made by a process of
an older version): the thread then finds the outcome at its next slow poll, every `poll_s`
seconds while anything waits; with nothing waiting it sleeps until something does. A client
that cannot make its socket (this user has no private folder for one: see
`supervisor.ledger.sqlite.socket_folder`) waits by that poll alone, and the process says so once.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import select
import threading
import uuid
from collections.abc import Callable
from typing import Any, Optional, Union, cast

from supervisor import open_backend
from supervisor.ledger import arguments
from supervisor.ledger.contract import Backend
from supervisor.ledger.errors import (
    ExecutionConflict,
    InvalidArgument,
    UnknownEffect,
    UnknownExecution,
    WorkflowCancelled,
    WorkflowFailed,
    YieldstarError,
    fork_id_taken,
)
from supervisor.ledger.values import (
    TERMINAL_STATUSES,
    WORKFLOWS_TIMEOUT,
    EffectState,
    ExecutionRecord,
    ExecutionStatus,
    SettleConflict,
)

from ._runtime import tracing
from .queues import Queue
from .registry import Registry

#: A ledger: a SQLite path (created when missing) or a postgresql:// URI, as `open_backend` takes.
Target = Union[str, "os.PathLike[str]"]
#: `() -> (found, value)`: what a waiter of `OutcomeWatch` looks for, read again at each announcement.
Probe = Callable[[], tuple[bool, Any]]
POLL_S = 1.0  # how often a waiting client looks for outcomes whose announcement it missed

log = logging.getLogger("yieldstar.client")
_told_polling = False  # this process has logged that a client of it cannot listen


def outcome_of(record: ExecutionRecord) -> Any:
    """The decoded result of a terminal execution, or the exception its outcome raises."""
    if record.status == ExecutionStatus.COMPLETED:
        return json.loads(cast(str, record.result_json))  # a completed execution has a result
    error = json.loads(record.error_json) if record.error_json else {}
    if record.status == ExecutionStatus.CANCELLED:
        raise WorkflowCancelled(record.execution_id, error.get("message"))
    raise WorkflowFailed(record.execution_id, error)


def workflow_name(workflow: Any) -> str:
    """The registered name of `workflow`: a name, or a function decorated with `@workflow`."""
    if isinstance(workflow, str):
        return arguments.identifier("workflow", workflow)
    name = getattr(workflow, "workflow_name", None)
    if callable(workflow) and isinstance(name, str):
        return name
    raise InvalidArgument(f"workflow must be a registered workflow's name or a function decorated with @workflow,"
                          f" not {workflow!r}")


class OutcomeWatch:
    """One client's waiters, woken by announcements of outcomes (or found by the slow poll).

    `add(execution_id, notify)` registers `notify(record)`, called once, from the watch's
    thread, when the execution is found terminal (with None if it is found gone: purged); the
    caller reads the record itself after registering, so an outcome committed before
    registration is not missed either.

    `add(execution_id, notify, probe=probe)` waits for something else the commit that makes it
    announces the execution's id (an event set: `get_event`): `probe()` returns `(found, value)`,
    and `notify(value)` is called once it found it."""

    def __init__(self, backend: Backend, poll_s: float = POLL_S, listen: bool = True):
        self._backend = backend
        self._poll_s = poll_s
        self._listener = None  # without one, the slow poll alone finds outcomes
        if listen:
            try:
                self._listener = backend.listen_for_outcomes()
            except OSError as exc:
                _polling(exc, poll_s)
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        self._lock = threading.Lock()
        self._waiters: dict[str, dict[int, tuple[Optional[Probe], Callable[[Any], None]]]] = {}
        self._next = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="yieldstar-outcomes", daemon=True)
        self._thread.start()

    def add(self, execution_id: str, notify: Callable[[Any], None], *, probe: Optional[Probe] = None) -> int:
        with self._lock:
            self._next += 1
            self._waiters.setdefault(execution_id, {})[self._next] = (probe, notify)
            key = self._next
        self._poke()  # a thread asleep with nothing to wait for starts its slow poll
        return key

    def remove(self, execution_id: str, key: int) -> None:
        with self._lock:
            waiting = self._waiters.get(execution_id)
            if waiting is not None:
                waiting.pop(key, None)
                if not waiting:
                    del self._waiters[execution_id]

    def close(self) -> None:
        self._closed = True
        self._poke()
        self._thread.join(5)
        for fd in (self._wake_read, self._wake_write):
            os.close(fd)
        if self._listener is not None:
            self._listener.close()

    def _poke(self) -> None:
        try:
            os.write(self._wake_write, b"!")
        except BlockingIOError:
            pass  # already poked

    def _run(self) -> None:
        sources = [self._wake_read] + ([self._listener] if self._listener is not None else [])
        while not self._closed:
            with self._lock:
                waiting = bool(self._waiters)
            readable, _, _ = select.select(sources, [], [], self._poll_s if waiting else None)
            if self._wake_read in readable:
                os.read(self._wake_read, 4096)
                if self._closed:
                    return
            if self._listener is not None and self._listener in readable:
                self._check(self._listener.read())
            elif not readable:
                self._check(None)  # the slow poll: everything waited for

    def _check(self, announced: Optional[set[str]]) -> None:
        with self._lock:
            found = [(execution_id, list(waiting.items())) for execution_id, waiting in self._waiters.items()
                     if announced is None or execution_id in announced]
        for execution_id, waiting in found:
            outcome: list[tuple[bool, Any]] = []  # the record, read once for all its waiters
            for key, (probe, notify) in waiting:
                try:
                    if probe is None:
                        if not outcome:
                            outcome.append(self._outcome(execution_id))
                        done, value = outcome[0]
                    else:
                        done, value = probe()
                except YieldstarError:
                    continue  # a busy or failing ledger: the next announcement or poll tries again
                if not done:
                    continue
                with self._lock:
                    mine = self._waiters.get(execution_id, {}).pop(key, None)
                    if execution_id in self._waiters and not self._waiters[execution_id]:
                        del self._waiters[execution_id]
                if mine is not None:
                    notify(value)

    def _outcome(self, execution_id: str) -> tuple[bool, Optional[ExecutionRecord]]:
        record = self._backend.executions.get(execution_id)
        return record is None or record.status in TERMINAL_STATUSES, record


def _polling(exc: OSError, poll_s: float) -> None:
    """Say, once per process, that a client waits for outcomes by its slow poll alone: the first
    cause is the one to fix (a squatted socket folder: see `supervisor.ledger.sqlite.socket_folder`)."""
    global _told_polling
    if not _told_polling:
        _told_polling = True
        log.warning("no outcome socket (%s): result() finds outcomes by polling every %g s", exc, poll_s,
                    extra={"event": "no_outcome_socket"})


class _Base:
    """What `Client` and `AsyncClient` share: the backend, the registry check, the watch."""

    def __init__(self, target: Target, *, registry: Optional[Registry] = None, poll_s: float = POLL_S,
                 listen: bool = True, create: bool = True, max_payload_bytes: Optional[int] = None):
        if registry is not None and not isinstance(registry, Registry):
            raise InvalidArgument(f"registry must be a worker.Registry, not {type(registry).__name__}")
        if not (arguments.finite(poll_s) and poll_s > 0):
            raise InvalidArgument(f"poll_s must be a number of seconds > 0, got {poll_s!r}")
        self._registry = registry
        self._poll_s = poll_s
        self._listen = arguments.boolean("listen", listen)
        self.backend = open_backend(target, create=arguments.boolean("create", create),
                                    max_payload_bytes=max_payload_bytes)
        self._limit = self.backend.max_payload_bytes
        self._watch: Optional[OutcomeWatch] = None
        self._watch_lock = threading.Lock()

    def _registered(self, workflow: Any) -> str:
        name = workflow_name(workflow)
        if self._registry is not None and name not in self._registry:
            known = ", ".join(self._registry.names()) or "none"
            raise InvalidArgument(f"no workflow is registered as {name!r} (registered: {known})")
        return name

    def _start(self, workflow: Any, input: Any, id: Optional[str], queue: Any = None, key: Optional[str] = None,
               priority: Optional[int] = None, timeout: Optional[float] = None) -> ExecutionRecord:
        name = self._registered(workflow)
        input_json = arguments.to_json("input", input, limit=self._limit)
        return self._admit(name, input_json, None if id is None else arguments.identifier("id", id), queue, key,
                           priority, timeout)

    def _start_json(self, workflow: Any, input_json: str, id: Optional[str], queue: Any = None,
                    key: Optional[str] = None, priority: Optional[int] = None,
                    timeout: Optional[float] = None) -> ExecutionRecord:
        # The ledger checks the text, the id, the queue, the key and the priority; the size is
        # checked here too, to name the input as the caller knows it.
        if isinstance(input_json, str):
            arguments.payload("input", input_json, self._limit)
        return self._admit(self._registered(workflow), input_json, id, queue, key, priority, timeout)

    def _admit(self, workflow: str, input_json: str, id: Optional[str], queue: Any = None, key: Optional[str] = None,
               priority: Optional[int] = None, timeout: Optional[float] = None) -> ExecutionRecord:
        """Admit, in the queue, at the priority and with the timeout (seconds) given, or else the
        workflow's defaults: those the app declares (`@workflow(queue=, priority=, timeout=)`),
        as its supervisor records them in the ledger when it starts (the ledger's `admit` of None
        for the queue and priority, and of WORKFLOWS_TIMEOUT for the timeout: before any record,
        the first record's, the deadline still counted from the admission). Inside an
        OpenTelemetry span, the execution stores its trace context, and its deliveries' spans are
        children of that span (`worker._runtime.tracing`)."""
        timeout_ms = arguments.seconds_to_ms("timeout", timeout)
        if isinstance(queue, Queue):
            queue = queue.name
        if timeout_ms is None:
            timeout_ms = WORKFLOWS_TIMEOUT
        return self.backend.executions.admit(uuid.uuid4().hex if id is None else id, workflow, input_json,
                                             queue=queue, key=key, priority=priority, timeout_ms=timeout_ms,
                                             trace_context=tracing.current_context())

    def _fork(self, execution_id: str, from_step: str, id: Optional[str]) -> ExecutionRecord:
        """Fork with the id given, or a new one made as `start` makes one; inside an OpenTelemetry
        span, the fork stores its trace context as a start does."""
        arguments.identifier("execution_id", execution_id)
        arguments.identifier("from_step", from_step)
        new_id = uuid.uuid4().hex if id is None else arguments.identifier("id", id)
        try:
            return self.backend.executions.fork(execution_id, new_id, from_step=from_step,
                                                trace_context=tracing.current_context())
        except ExecutionConflict:  # the ledger names its own argument, new_id
            raise fork_id_taken("id", new_id) from None

    def _record(self, execution_id: str) -> ExecutionRecord:
        record = self.backend.executions.get(execution_id)
        if record is None:
            raise UnknownExecution(f"no execution {execution_id!r} in {self.backend.path}")
        return record

    def _settle(self, effect_id: str, result_json: str, create: bool) -> EffectState | SettleConflict:
        if not create and self.backend.effects.get(effect_id) is None:
            raise UnknownEffect(f"no execution has begun effect {effect_id!r}: check the id, or pass create=True"
                                " to settle it before it begins")
        return self.backend.effects.settle(effect_id, result_json)

    def _put(self, store: str, item: Any) -> Any:
        item_json = arguments.to_json(f"store {store!r} item", item, limit=self._limit)
        return json.loads(self.backend.stores.put(store, item_json).state_json)

    def _send(self, execution_id: str, message: Any, topic: str, id: Optional[str]) -> str:
        """Send `message` to the execution; returns the message's id (made when None)."""
        arguments.identifier("execution_id", execution_id)
        arguments.identifier("topic", topic)
        message_id = uuid.uuid4().hex if id is None else arguments.identifier("id", id)
        message_json = arguments.to_json("message", message, limit=self._limit)
        self.backend.messages.send(execution_id, message_json, topic=topic, message_id=message_id)
        return message_id

    def _event_probe(self, execution_id: str, key: str) -> Probe:
        arguments.identifier("execution_id", execution_id)
        arguments.identifier("key", key)

        def probe() -> tuple[bool, Any]:
            event = self.backend.events.get(execution_id, key)
            return event is not None, None if event is None else json.loads(event.value_json)
        return probe

    def _watching(self) -> OutcomeWatch:
        with self._watch_lock:
            if self._watch is None:
                self._watch = OutcomeWatch(self.backend, self._poll_s, self._listen)
            return self._watch

    def _close(self) -> None:
        if self._watch is not None:
            self._watch.close()
        self.backend.close()


def _timeout(timeout: Optional[float]) -> Optional[float]:
    if timeout is not None and not (arguments.finite(timeout) and timeout >= 0):
        raise InvalidArgument(f"timeout must be None or a number of seconds >= 0, got {timeout!r}")
    return timeout


def _wait_timeout(timeout: float) -> float:
    if not (arguments.finite(timeout) and timeout >= 0):
        raise InvalidArgument(f"timeout must be a number of seconds >= 0, got {timeout!r}")
    return timeout


def _found(execution_id: str, record: Optional[ExecutionRecord]) -> ExecutionRecord:
    if record is None:
        raise UnknownExecution(f"execution {execution_id!r} was purged while its result was awaited")
    return record


def _timed_out(execution_id: str, record: Optional[ExecutionRecord], timeout: Optional[float]) -> TimeoutError:
    status = record.status if record is not None else "unknown"
    return TimeoutError(f"execution {execution_id!r} was not finished within {timeout} s (it is {status})")


# -- sync ------------------------------------------------------------------------------------------

class Handle:
    """One execution, as the client that started or found it sees it."""

    def __init__(self, client: "Client", execution_id: str, workflow: str):
        self._client = client
        self.execution_id = execution_id
        self.workflow = workflow

    def record(self) -> ExecutionRecord:
        """The execution's whole ledger record, as of now."""
        return self._client._record(self.execution_id)

    def status(self) -> str:
        """`admitted`, `running`, `suspended`, `completed`, `failed` or `cancelled`."""
        return self.record().status

    def result(self, timeout: Optional[float] = None) -> Any:
        """Wait until the execution is terminal and return its decoded result. Raises
        `WorkflowFailed`, `WorkflowCancelled`, or `TimeoutError` after `timeout` seconds."""
        timeout = _timeout(timeout)
        done = threading.Event()
        found: list[Optional[ExecutionRecord]] = []

        def notify(record: Optional[ExecutionRecord]) -> None:
            found.append(record)
            done.set()

        watch = self._client._watching()
        key = watch.add(self.execution_id, notify)
        try:
            record = self.record()  # after registering: an outcome from before is seen here
            if record.status not in TERMINAL_STATUSES:
                if not done.wait(timeout):
                    raise _timed_out(self.execution_id, self._client.backend.executions.get(self.execution_id),
                                     timeout)
                record = _found(self.execution_id, found[0])
        finally:
            watch.remove(self.execution_id, key)
        return outcome_of(record)

    def send(self, message: Any, *, topic: str = "default", id: Optional[str] = None) -> str:
        """As `Client.send`, to this execution."""
        return self._client.send(self.execution_id, message, topic=topic, id=id)

    def get_event(self, key: str, *, timeout: float = 0.0) -> Any:
        """As `Client.get_event`, of this execution."""
        return self._client.get_event(self.execution_id, key, timeout=timeout)

    def cancel(self, reason: Optional[str] = None) -> str:
        """Cancel the execution (see `yieldstar cancel`); returns its status afterwards, which
        is that of its outcome if it had already finished."""
        return self._client.backend.executions.cancel(self.execution_id, reason=reason).status

    def fork(self, *, from_step: str, id: Optional[str] = None) -> "Handle":
        """As `Client.fork`, of this execution."""
        return self._client.fork(self.execution_id, from_step=from_step, id=id)

    def __repr__(self) -> str:
        return f"Handle({self.execution_id!r}, workflow={self.workflow!r})"


class Client(_Base):
    """Start workflows and wait for their results. Safe to share between threads.

    Args:
        target: the ledger: a SQLite path (created when missing), as `open_backend` takes.
        registry: when given, `start` refuses workflow names it does not know.
        poll_s: how often a waiting `result()` looks for outcomes whose announcement it missed.
        listen: False to wait by that poll alone, without listening for announcements (LISTEN on
            PostgreSQL): for a connection pooler that cannot LISTEN.
        create: False to raise `NoLedger` for a SQLite path with no ledger, instead of creating one.
        max_payload_bytes: the size limit of an input, an effect's result or a store item this
            client writes, in bytes of UTF-8 JSON (None: 4 MiB); a larger one raises
            `PayloadTooLarge` and writes nothing.
    """

    def start(self, workflow: Any, input: Any = None, *, id: Optional[str] = None, queue: Any = None,
              key: Optional[str] = None, priority: Optional[int] = None, timeout: Optional[float] = None) -> Handle:
        """Admit an execution of `workflow` (a name, or the decorated function) with `input` (any
        JSON value) and return its handle. `id` is the idempotency key: the same id with the same
        workflow, input, queue, key, priority and timeout returns the same execution; with others
        it raises `ExecutionConflict`. Without it, a new id is made. `queue` (a `Queue` or its
        name), `priority` and `timeout` default to the workflow's (`@workflow(queue=, priority=,
        timeout=)`, as its supervisor recorded them); `key` is what the queue's `per_key` limit
        counts by. `timeout` (seconds > 0): not finished that long after now, the execution fails
        as `WorkflowTimedOut` (SPEC section 12). Called inside an OpenTelemetry span, the
        execution's deliveries are spans in that span's trace (SPEC section 13)."""
        record = self._start(workflow, input, id, queue, key, priority, timeout)
        return Handle(self, record.execution_id, record.workflow)

    def start_json(self, workflow: Any, input_json: str = "null", *, id: Optional[str] = None, queue: Any = None,
                   key: Optional[str] = None, priority: Optional[int] = None,
                   timeout: Optional[float] = None) -> Handle:
        """As `start`, with the input as JSON text, recorded as given (`yieldstar start --input`)."""
        record = self._start_json(workflow, input_json, id, queue, key, priority, timeout)
        return Handle(self, record.execution_id, record.workflow)

    def fork(self, execution_id: str, *, from_step: str, id: Optional[str] = None) -> Handle:
        """Run execution `execution_id` again from its step `from_step` (SPEC section 14): admit a
        new execution of the same workflow and input (in the same queue, with the same key,
        priority and timeout, counted from now) whose recorded steps are copies of the original's
        up to, not including, `from_step`, and return its handle. Any supervisor runs it from
        there: the steps before are replayed, `from_step` and every step after run again. The
        original is unchanged. `id` names the new execution (None: a new id is made); unlike
        `start`'s, it is not an idempotency key: an id already taken raises `ExecutionConflict`.
        A `from_step` the execution has not recorded raises `UnknownStep`, an unknown execution
        `UnknownExecution`; neither writes anything."""
        record = self._fork(execution_id, from_step, id)
        return Handle(self, record.execution_id, record.workflow)

    def handle(self, execution_id: str) -> Handle:
        """A handle for an existing execution; `UnknownExecution` if there is none."""
        record = self._record(arguments.identifier("execution_id", execution_id))
        return Handle(self, record.execution_id, record.workflow)

    def settle(self, effect_id: str, result: Any, *, create: bool = False) -> EffectState | SettleConflict:
        """Settle an effect from outside (an external system finishing its work), as `yieldstar
        settle` does: the first result is kept, and a later different one comes back as a
        `SettleConflict` naming the kept one. An effect no execution has begun is refused
        (`UnknownEffect`, a `ValueError`) unless `create`."""
        return self._settle(effect_id, arguments.to_json("result", result, limit=self._limit), create)

    def settle_json(self, effect_id: str, result_json: str, *, create: bool = False) -> EffectState | SettleConflict:
        """As `settle`, with the result as JSON text, recorded as given (`yieldstar settle --result`)."""
        return self._settle(effect_id, result_json, create)

    def put(self, store: str, item: Any) -> Any:
        """Append `item` to a list store (a mailbox), waking its waiters; returns the new state."""
        return self._put(store, item)

    def send(self, execution_id: str, message: Any, *, topic: str = "default", id: Optional[str] = None) -> str:
        """Send `message` (any JSON value) to the execution's `topic`, where its `ctx.recv` takes
        it; durable, kept in send order per topic, and waking a waiting `recv` at once. `id`
        makes it idempotent: a repeat with the same id adds nothing and succeeds, even once the
        execution has ended (None: a new id is made). Returns the message's id. Raises
        `UnknownExecution` for an unknown execution, `ExecutionConflict` for a new message to a
        terminal one, `InvalidArgument` for a message JSON cannot hold or a topic or id empty or
        too long (and then sends nothing)."""
        return self._send(execution_id, message, topic, id)

    def get_event(self, execution_id: str, key: str, *, timeout: float = 0.0) -> Any:
        """The latest value the execution set as event `key` (`ctx.set_event`). A key not set yet
        is waited for up to `timeout` seconds, woken by the commit that sets it; then None."""
        timeout = _wait_timeout(timeout)
        probe = self._event_probe(execution_id, key)
        found, value = probe()
        if found or timeout == 0:
            return value
        done = threading.Event()
        got: list[Any] = []

        def notify(value: Any) -> None:
            got.append(value)
            done.set()

        watch = self._watching()
        waiter = watch.add(execution_id, notify, probe=probe)
        try:
            found, value = probe()  # after registering: a set from before is seen here
            if found:
                return value
            return got[0] if done.wait(timeout) else None
        finally:
            watch.remove(execution_id, waiter)

    def close(self) -> None:
        self._close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- async -----------------------------------------------------------------------------------------

class AsyncHandle:
    """`Handle` for asyncio code: the same calls, as coroutines."""

    def __init__(self, client: "AsyncClient", execution_id: str, workflow: str):
        self._client = client
        self.execution_id = execution_id
        self.workflow = workflow

    async def record(self) -> ExecutionRecord:
        return await self._client._call(self._client._record, self.execution_id)

    async def status(self) -> str:
        return (await self.record()).status

    async def result(self, timeout: Optional[float] = None) -> Any:
        """As `Handle.result`; waiting blocks no thread of the event loop's."""
        import asyncio  # loaded already: this runs in its event loop (see `AsyncClient._call`)

        timeout = _timeout(timeout)
        loop = asyncio.get_running_loop()
        found: asyncio.Future = loop.create_future()

        def settle(record: Optional[ExecutionRecord]) -> None:
            if not found.done():
                found.set_result(record)

        watch = await self._client._call(self._client._watching)
        key = watch.add(self.execution_id, lambda record: loop.call_soon_threadsafe(settle, record))
        try:
            record = await self.record()
            if record.status not in TERMINAL_STATUSES:
                try:
                    record = _found(self.execution_id, await asyncio.wait_for(found, timeout))
                except asyncio.TimeoutError:
                    now = await self._client._call(self._client.backend.executions.get, self.execution_id)
                    raise _timed_out(self.execution_id, now, timeout) from None
        finally:
            watch.remove(self.execution_id, key)
        return outcome_of(record)

    async def send(self, message: Any, *, topic: str = "default", id: Optional[str] = None) -> str:
        return await self._client.send(self.execution_id, message, topic=topic, id=id)

    async def get_event(self, key: str, *, timeout: float = 0.0) -> Any:
        return await self._client.get_event(self.execution_id, key, timeout=timeout)

    async def cancel(self, reason: Optional[str] = None) -> str:
        record = await self._client._call(self._client.backend.executions.cancel, self.execution_id, reason=reason)
        return record.status

    async def fork(self, *, from_step: str, id: Optional[str] = None) -> "AsyncHandle":
        return await self._client.fork(self.execution_id, from_step=from_step, id=id)

    def __repr__(self) -> str:
        return f"AsyncHandle({self.execution_id!r}, workflow={self.workflow!r})"


class AsyncClient(_Base):
    """`Client` for asyncio code: `async with AsyncClient(target) as client: ...`.

    Its ledger calls run on one thread of its own, so a database that is slow or busy never
    blocks the event loop; waiting for results costs no thread per waiter."""

    def __init__(self, target: Target, *, registry: Optional[Registry] = None, poll_s: float = POLL_S,
                 listen: bool = True, create: bool = True, max_payload_bytes: Optional[int] = None):
        super().__init__(target, registry=registry, poll_s=poll_s, listen=listen, create=create,
                         max_payload_bytes=max_payload_bytes)
        # Imported here, as asyncio is below: a worker imports this module too, and has no use for it.
        import concurrent.futures

        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="yieldstar-client")

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # Imported here, where it is loaded already (this runs in its event loop): a worker
        # imports this module too, and asyncio would add about 40 ms to its start.
        import asyncio

        loop = asyncio.get_running_loop()
        # In the caller's context (which an executor does not pass on): a start made in a span
        # stores that span's trace context.
        context = contextvars.copy_context()
        return await loop.run_in_executor(self._executor, lambda: context.run(fn, *args, **kwargs))

    async def start(self, workflow: Any, input: Any = None, *, id: Optional[str] = None, queue: Any = None,
                    key: Optional[str] = None, priority: Optional[int] = None,
                    timeout: Optional[float] = None) -> AsyncHandle:
        """As `Client.start`."""
        record = await self._call(self._start, workflow, input, id, queue, key, priority, timeout)
        return AsyncHandle(self, record.execution_id, record.workflow)

    async def start_json(self, workflow: Any, input_json: str = "null", *, id: Optional[str] = None,
                         queue: Any = None, key: Optional[str] = None, priority: Optional[int] = None,
                         timeout: Optional[float] = None) -> AsyncHandle:
        """As `Client.start_json`."""
        record = await self._call(self._start_json, workflow, input_json, id, queue, key, priority, timeout)
        return AsyncHandle(self, record.execution_id, record.workflow)

    async def fork(self, execution_id: str, *, from_step: str, id: Optional[str] = None) -> AsyncHandle:
        """As `Client.fork`."""
        record = await self._call(self._fork, execution_id, from_step, id)
        return AsyncHandle(self, record.execution_id, record.workflow)

    async def handle(self, execution_id: str) -> AsyncHandle:
        record = await self._call(self._record, arguments.identifier("execution_id", execution_id))
        return AsyncHandle(self, record.execution_id, record.workflow)

    async def settle(self, effect_id: str, result: Any, *, create: bool = False) -> EffectState | SettleConflict:
        return await self._call(self._settle, effect_id, arguments.to_json("result", result, limit=self._limit), create)

    async def settle_json(self, effect_id: str, result_json: str, *,
                          create: bool = False) -> EffectState | SettleConflict:
        """As `Client.settle_json`."""
        return await self._call(self._settle, effect_id, result_json, create)

    async def put(self, store: str, item: Any) -> Any:
        return await self._call(self._put, store, item)

    async def send(self, execution_id: str, message: Any, *, topic: str = "default", id: Optional[str] = None) -> str:
        """As `Client.send`."""
        return await self._call(self._send, execution_id, message, topic, id)

    async def get_event(self, execution_id: str, key: str, *, timeout: float = 0.0) -> Any:
        """As `Client.get_event`; waiting blocks no thread of the event loop's."""
        import asyncio  # loaded already: this runs in its event loop

        timeout = _wait_timeout(timeout)
        probe = self._event_probe(execution_id, key)
        found, value = await self._call(probe)
        if found or timeout == 0:
            return value
        loop = asyncio.get_running_loop()
        got: asyncio.Future = loop.create_future()

        def settle(value: Any) -> None:
            if not got.done():
                got.set_result(value)

        watch = await self._call(self._watching)
        waiter = watch.add(execution_id, lambda value: loop.call_soon_threadsafe(settle, value), probe=probe)
        try:
            found, value = await self._call(probe)
            if found:
                return value
            try:
                return await asyncio.wait_for(got, timeout)
            except asyncio.TimeoutError:
                return None
        finally:
            watch.remove(execution_id, waiter)

    async def close(self) -> None:
        await self._call(self._close)
        self._executor.shutdown(wait=False)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
