"""Every write a delivery makes, through one door that knows whether it may still write.

A delivery writes with its lease's fencing token; the ledger refuses a stale token. Before
asking the ledger at all, the door checks `may_write()`: in a child process that is the parent
watch, which turns false the moment the supervisor stops being heard, so an orphaned or frozen
child stops writing at once instead of waiting to be refused. After the first refusal the door
stays shut: a holder whose lease is lost makes no further writes (RFC 002). Once the delivery
ended (`end`), the door is shut for good to whatever still holds its context, a global or a
thread or task that outlived the workflow function: every call raises `DeliveryEnded`. A call that fails in
the ledger's storage (a busy database, a full disk, a corrupt file) shuts it too, and the
delivery ends as `Retry` naming the kind of failure: a storage error is never a workflow's
outcome.

Parallel steps write through the same door from several threads at once: the backend serialises
its calls, and the first refusal or storage failure is the one the delivery reports.

In a worker of several deliveries, step writes go through the worker's group commit
(`step_commits.StepCommits`, given as `commits`): each write still carries this door's token and
its refusal or storage error is this door's alone, but the writes of the worker's deliveries that
are ready together share one transaction, and an async delivery awaits its write
(`write_step_async`) while the event loop runs the others.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Callable, Optional

from supervisor.ledger.errors import DeliveryEnded, StorageError
from supervisor.ledger.values import ExecutionLease, HeapRecord, LeaseLost, StepWrite

from .unwinding import RetryLater, StopDelivery

if TYPE_CHECKING:  # a worker of one delivery has no group commit, and does not import it
    from .step_commits import StepCommits

log = logging.getLogger("yieldstar.worker")


def always() -> bool:
    return True


class FencedWriter:
    def __init__(self, backend, lease: ExecutionLease, may_write: Callable[[], bool] = always,
                 commits: Optional[StepCommits] = None):
        self.backend = backend
        self.lease = lease
        self._may_write = may_write
        self._commits = commits  # the worker's group commit, or None: each write its own transaction
        self.stopped_because: Optional[str] = None
        self.storage_failure: Optional[RetryLater] = None  # set by the first storage error
        # Set once the delivery ended for a step it could not stop (`end_abandoned`): why.
        self.abandoned: Optional[str] = None
        self.ended = False  # set once the delivery's outcome is decided (`end`)
        # How long each step attempt of the delivery took (s), from its function's start to its
        # recorded outcome, in the order they ended: its `Done` carries them to the supervisor's
        # `yieldstar_step_seconds`. Appended by the context (from the threads of parallel steps too).
        self.step_seconds: list[float] = []
        self._lock = threading.Lock()

    @property
    def stopped(self) -> bool:
        return self.stopped_because is not None

    def stop(self, why: str) -> None:
        """Shut the door for `why` (the supervisor stopped this delivery); safe from any thread.
        The first reason, this one or a refusal's, is the one the delivery reports."""
        with self._lock:
            if self.stopped_because is None:
                self.stopped_because = why

    def end(self) -> None:
        """The delivery ended: from now on every call raises `DeliveryEnded` (safe from any thread)."""
        self.ended = True

    def ended_error(self) -> DeliveryEnded:
        return DeliveryEnded(self.lease.execution_id, self.lease.token)

    def check(self) -> None:
        """Raise what unwinds the workflow if this delivery may write no more, or `DeliveryEnded`
        if it ended (safe from any thread)."""
        if self.ended:
            raise self.ended_error()
        if self.stopped_because is None and not self._may_write():
            self.stopped_because = "the supervisor is no longer heard from"
        if self.stopped_because is not None:
            raise StopDelivery(self.stopped_because)
        if self.storage_failure is not None:
            raise self.retry_later()

    def failed(self, exc: StorageError) -> RetryLater:
        """Shut the door on a storage error met anywhere in the delivery; returns what unwinds
        the workflow. The first failure is the one the delivery reports."""
        with self._lock:  # the steps of one delivery may fail together, on several threads
            if self.storage_failure is None:
                self.storage_failure = RetryLater(str(exc), exc.kind)
        return self.retry_later()

    def retry_later(self) -> RetryLater:
        """A fresh unwinding for the recorded storage failure (each raise gets its own traceback)."""
        return RetryLater(self.storage_failure.reason, self.storage_failure.storage_error)

    def _lost(self, what: str) -> StopDelivery:
        with self._lock:  # the first refusal is the one the delivery reports
            if self.stopped_because is None:
                self.stopped_because = f"lease lost (token {self.lease.token} is no longer current) at {what}"
        log.warning("execution %s token %d: write of %s refused: the token is no longer current; stopping",
                    self.lease.execution_id, self.lease.token, what,
                    extra={"event": "write_refused", "execution_id": self.lease.execution_id,
                           "token": self.lease.token})
        return StopDelivery(self.stopped_because)

    def write_step(self, step_key: str, attempt: int, done: bool, response_json: str) -> HeapRecord:
        """Record a step attempt; returns the recorded record (which may predate this call)."""
        if self._commits is None:
            reply = self.call(self.backend.heap.write_step, self.lease, step_key=step_key, step_attempt=attempt,
                              done=done, step_response_json=response_json)
        else:
            future = self._submit(step_key, attempt, done, response_json)
            try:
                reply = future.result()
            except StorageError as exc:
                raise self.failed(exc) from exc
        return self._recorded(reply, step_key)

    async def write_step_async(self, step_key: str, attempt: int, done: bool, response_json: str) -> HeapRecord:
        """`write_step`, awaited: with the worker's group commit, the event loop runs the
        worker's other deliveries while this write waits for its batch's commit."""
        if self._commits is None:
            return self.write_step(step_key, attempt, done, response_json)
        import asyncio

        future = self._submit(step_key, attempt, done, response_json)
        try:
            reply = await asyncio.wrap_future(future)
        except StorageError as exc:
            raise self.failed(exc) from exc
        return self._recorded(reply, step_key)

    def _submit(self, step_key: str, attempt: int, done: bool, response_json: str):
        self.check()
        return self._commits.submit(StepWrite(self.lease, step_key, attempt, done, response_json), self._may_send)

    def _may_send(self) -> bool:
        """Asked by the writer thread just before a queued write goes: a delivery stopped (or
        no longer heard from) while its write waited for a batch sends nothing."""
        return self.stopped_because is None and not self.ended and self._may_write()

    def _recorded(self, reply, step_key: str) -> HeapRecord:
        if isinstance(reply, HeapRecord):
            return reply
        if isinstance(reply, LeaseLost):
            raise self._lost(f"step {step_key!r}")
        # `step_commits.NOT_SENT`: stopped, or the parent watch said no, just before the batch went.
        self.check()
        raise StopDelivery(self.stopped_because or "the supervisor is no longer heard from")

    def call(self, method: Callable, *args, **kwargs):
        """An idempotent or unfenced ledger call (a start, an effect, a store change, a waiter):
        harmless from a stale holder, but a stopped delivery makes none."""
        self.check()
        try:
            return method(*args, **kwargs)
        except StorageError as exc:
            raise self.failed(exc) from exc

    def fenced_call(self, what: str, method: Callable, *args, **kwargs):
        """A fenced ledger call other than a step write (a message taken, an event set): as
        `call`, and a `LeaseLost` reply stops the delivery as a refused step write does."""
        reply = self.call(method, self.lease, *args, **kwargs)
        if isinstance(reply, LeaseLost):
            raise self._lost(what)
        return reply

    def end_abandoned(self, why: str, step_key: str, attempt: int, done: bool, response_json: str,
                      wake_at: int) -> HeapRecord:
        """End the delivery for a step thread it could not stop (`worker.timeouts`): shut the door
        for good first, so that nothing the abandoned thread does from now on is written, then make
        the delivery's last two calls past it, from the delivery's own thread: record the step's
        failed attempt, fenced by the token, and ask for a wake at `wake_at`. Sets `abandoned`
        once both are made.

        Raises:
            StopDelivery: the door was shut already, or the write was refused (the lease is lost).
            RetryLater: a storage error.
        """
        with self._lock:
            shut = self.stopped_because is None and self.storage_failure is None and self._may_write()
            if shut:
                self.stopped_because = why
        if not shut:  # the delivery ends as it already had to
            self.check()
            raise StopDelivery(self.stopped_because or "the supervisor is no longer heard from")
        try:
            reply = self.backend.heap.write_step(self.lease, step_key=step_key, step_attempt=attempt, done=done,
                                                 step_response_json=response_json)
            if isinstance(reply, LeaseLost):
                self.stopped_because = f"lease lost (token {self.lease.token} is no longer current) at {step_key!r}"
                raise StopDelivery(self.stopped_because)
            self.backend.executions.request_wake(self.lease.execution_id, wake_at)
        except StorageError as exc:
            raise self.failed(exc) from exc
        self.abandoned = why
        return reply

    def request_wake(self, at: int) -> None:
        """Unfenced in the ledger, but a stopped delivery asks for nothing more."""
        self.call(self.backend.executions.request_wake, self.lease.execution_id, at)
