"""Every write a delivery makes, through one door that knows whether it may still write.

A delivery writes with its lease's fencing token; the ledger refuses a stale token. Before
asking the ledger at all, the door checks `may_write()`: in a child process that is the parent
watch, which turns false the moment the supervisor stops being heard, so an orphaned or frozen
child stops writing at once instead of waiting to be refused. After the first refusal the door
stays shut: a holder whose lease is lost makes no further writes (RFC 002). A call that fails in
the ledger's storage (a busy database, a full disk, a corrupt file) shuts it too, and the
delivery ends as `Retry` naming the kind of failure: a storage error is never a workflow's
outcome.

Parallel steps write through the same door from several threads at once: the backend serialises
its calls, and the first refusal or storage failure is the one the delivery reports.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

from supervisor.ledger.errors import StorageError
from supervisor.ledger.values import ExecutionLease, HeapRecord, LeaseLost

from .unwinding import RetryLater, StopDelivery

log = logging.getLogger("yieldstar.worker")


def always() -> bool:
    return True


class FencedWriter:
    def __init__(self, backend, lease: ExecutionLease, may_write: Callable[[], bool] = always):
        self.backend = backend
        self.lease = lease
        self._may_write = may_write
        self.stopped_because: Optional[str] = None
        self.storage_failure: Optional[RetryLater] = None  # set by the first storage error
        self._lock = threading.Lock()

    @property
    def stopped(self) -> bool:
        return self.stopped_because is not None

    def check(self) -> None:
        """Raise what unwinds the workflow if this delivery may write no more (safe from any thread)."""
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
                    self.lease.execution_id, self.lease.token, what)
        return StopDelivery(self.stopped_because)

    def write_step(self, step_key: str, attempt: int, done: bool, response_json: str) -> HeapRecord:
        """Record a step attempt; returns the recorded record (which may predate this call)."""
        reply = self.call(self.backend.heap.write_step, self.lease, step_key=step_key, step_attempt=attempt,
                          done=done, step_response_json=response_json)
        if isinstance(reply, LeaseLost):
            raise self._lost(f"step {step_key!r}")
        return reply

    def call(self, method: Callable, *args, **kwargs):
        """An idempotent or unfenced ledger call (a start, an effect, a store change, a waiter):
        harmless from a stale holder, but a stopped delivery makes none."""
        self.check()
        try:
            return method(*args, **kwargs)
        except StorageError as exc:
            raise self.failed(exc) from exc

    def request_wake(self, at: int) -> None:
        """Unfenced in the ledger, but a stopped delivery asks for nothing more."""
        self.call(self.backend.executions.request_wake, self.lease.execution_id, at)
