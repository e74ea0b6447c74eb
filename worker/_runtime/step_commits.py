"""Group commit of a worker's step writes: the deliveries' writes that are ready together go to
the ledger in one transaction (`HeapClient.write_steps`), each fenced by its own token.

    delivery (task or thread)                writer thread                      ledger
    FencedWriter.write_step(_async) --submit(StepWrite)--> queue
          waits on its Future                 takes all that queued  --write_steps(batch)-->
          <--- its HeapRecord | LeaseLost <-- one reply per write   <-- one transaction --

One writer thread per worker of several deliveries (`Deliveries`): while it commits a batch, the
writes that arrive wait, and go together in the next one, so a worker of a thousand waiting
deliveries commits once for the many steps that end at about the same time, and an idle one
never waits to fill a batch (the first write of a quiet spell goes at once). An async delivery
awaits its write's future (`asyncio.wrap_future`): the event loop runs the worker's other
deliveries meanwhile, instead of blocking for the commit. A sync one blocks on it.

The rules of a single write hold for each write of a batch:

- each write's `may_write` is asked just before the batch is sent (its delivery's: not stopped,
  and the parent watch still hears the supervisor): a write of a delivery stopped meanwhile, or
  whose supervisor is no longer heard, is not sent (its reply is `NOT_SENT`, and its writer
  stops the delivery);
- a write whose delivery has given up on it (its task cancelled: its future is cancelled) is not
  sent;
- a storage error is every write's of the batch (each writer shuts its own door on it);
- a batch the ledger refuses as bad input (`InvalidArgument`, nothing written) is written again
  one write at a time, so that only the bad write gets the error.

A worker of one delivery (no `--workers`) writes directly, one transaction per write, as before:
it has nothing to group, and a hop to a thread would cost it time.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Union

from supervisor.ledger.errors import InvalidArgument
from supervisor.ledger.values import HeapRecord, LeaseLost, StepWrite

log = logging.getLogger("yieldstar.worker")


class NotSent:
    """The reply to a write that was not sent: its delivery may no longer write."""

    def __repr__(self) -> str:
        return "NOT_SENT"


NOT_SENT = NotSent()

Reply = Union[HeapRecord, LeaseLost, NotSent]


@dataclass(frozen=True)
class Queued:
    """A write waiting for the next batch, with what the writer thread needs to send it."""

    write: StepWrite
    may_write: Callable[[], bool]
    reply: Future


class StepCommits:
    """The worker's writer thread and the queue it batches (see the module docstring)."""

    def __init__(self, backend):
        self._backend = backend
        self._queue: list[Queued] = []
        self._ready = threading.Condition(threading.Lock())
        self._closed = False
        self.transactions = 0  # batches sent, and the writes in them: for the log and the tests
        self.writes = 0
        self._thread = threading.Thread(target=self._run, name="yieldstar-step-commits", daemon=True)
        self._thread.start()

    def submit(self, write: StepWrite, may_write: Callable[[], bool]) -> Future:
        """Queue `write` for the next batch; its future's result is its `Reply`, or the storage
        error its batch met."""
        queued = Queued(write, may_write, Future())
        with self._ready:
            if self._closed:
                raise RuntimeError("the worker's step writer is closed")
            self._queue.append(queued)
            self._ready.notify()
        return queued.reply

    def close(self) -> None:
        """Send what is queued, stop the thread, and log how many writes went in how many
        transactions."""
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._thread.join()
        if self.writes:
            log.info("step writes: %d in %d transactions", self.writes, self.transactions,
                     extra={"event": "step_commits", "writes": self.writes, "transactions": self.transactions})

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._ready.wait()
                if not self._queue:
                    return
                taken, self._queue = self._queue, []
            self._send(taken)

    def _send(self, taken: list[Queued]) -> None:
        batch: list[Queued] = []
        for queued in taken:
            if not queued.reply.set_running_or_notify_cancel():
                continue  # its delivery stopped waiting for it (a cancelled task)
            if queued.may_write():
                batch.append(queued)
            else:
                queued.reply.set_result(NOT_SENT)
        if not batch:
            return
        try:
            replies = self._write([queued.write for queued in batch])
        except BaseException as exc:  # noqa: BLE001 - every waiting delivery gets what its batch met
            for queued in batch:
                queued.reply.set_exception(exc)
            return
        for queued, reply in zip(batch, replies):
            if isinstance(reply, BaseException):
                queued.reply.set_exception(reply)
            else:
                queued.reply.set_result(reply)

    def _write(self, writes: list[StepWrite]) -> list:
        heap = self._backend.heap
        try:
            replies = heap.write_steps(writes)
        except InvalidArgument:
            # One bad write must not fail its neighbours: each alone, the bad one with its error.
            replies = []
            for w in writes:
                try:
                    replies.append(heap.write_step(w.lease, step_key=w.step_key, step_attempt=w.step_attempt,
                                                   done=w.done, step_response_json=w.step_response_json))
                except InvalidArgument as exc:
                    replies.append(exc)
            self.transactions += len(writes)
        else:
            self.transactions += 1
        self.writes += len(writes)
        return replies
