"""A worker that runs several deliveries at once (`supervise --workers`).

    main thread (reads the pipe)          event loop thread            delivery threads
    Run  --> prepare ----------+-- async --> task: run_async --+
             (a first delivery)+-- sync  ------------------------------> run --+
         `-- a later one: prepare (reads its steps) on a delivery thread, then the same
    Stop --> stop(): writes refused; the task cancelled                         |
    Beat --> Alive (ParentWatch)              Done(execution_id, token, ...) <---+  (any thread)

The main thread does nothing but read the supervisor's messages (`ParentWatch.next_task`), so
heartbeats are answered whatever the deliveries do. It prepares each first delivery handed over
(nothing to read: the claim sent the input) and hands each later one, which reads its recorded
steps, to a delivery thread to prepare. An async workflow then runs as a task of the worker's
one event loop, started at the first async delivery and run for the life of the worker on a
thread of its own; a sync workflow runs on a thread of a pool sized to the worker's slots (a
delivery holds at most one thread at a time, so one is always free for it). Each delivery has
its own `FencedWriter` (its own token); its step writes go through the worker's one writer
thread (`step_commits.StepCommits`), which sends those that are ready together in one
transaction. The deliveries share the worker's ledger connection, which is safe across threads
(each backend holds a lock around each transaction), and the parent watch: once the supervisor
is no longer heard, no delivery of the worker writes (`may_write`), and the worker exits.

`Stop` ends one delivery and leaves the others running: its writes are refused from then on,
and an async one's task is cancelled at its next await. It reports `Done` with `LeaseLost`. A
sync delivery inside a long step stops only at its next write; the supervisor replaces a
worker whose delivery has not stopped within the heartbeat tolerance.
A sync step that runs past its `timeout=` cannot be stopped either: its delivery records the
attempt and ends, and every `Done` from then on asks the supervisor to replace the worker
(`worker.timeouts`, `abandoned`).

Each delivery's `Done` is sent by the thread that ended it, under the watch's send lock. A
delivery that raised outside the workflow (a bug, a storage error outside its steps) is reported
as `Retry`, as the one-at-a-time worker reports it (`child.py`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from dataclasses import dataclass, field

from supervisor.ledger.values import DeliveryOutcome, LeaseLost, Retry

from . import tracing
from .abandoned import replace_reason
from .driver import WorkflowRun, raised_outside
from .parent_watch import ParentWatch
from .protocol import EXIT_OK, Done, Run, Stop
from .step_commits import StepCommits

log = logging.getLogger("yieldstar.worker")

# The exit code of a worker whose event loop ended under it (a workflow raised SystemExit or
# KeyboardInterrupt in a task): its deliveries could no longer end, so it ends them all at once,
# and the supervisor releases them (it reads the code as "exited", with the number).
EXIT_LOOP_DIED = 70


@dataclass
class Running:
    """One delivery in this worker, from its `Run` to its `Done`."""

    run: WorkflowRun
    started: float = field(default_factory=time.monotonic)
    task: object = None  # the asyncio task of an async delivery, once made


class Deliveries:
    """The deliveries a worker runs at once, up to `slots` of them."""

    def __init__(self, backend, registry, watch: ParentWatch, slots: int):
        self._backend = backend
        self._registry = registry
        self._watch = watch
        # Imported here: a worker of one delivery at a time (the default) never needs it, and
        # starts faster without it (tests/worker/test_imports.py).
        from concurrent.futures import ThreadPoolExecutor

        self._threads = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="yieldstar-delivery")
        self._lock = threading.Lock()
        self._ended = threading.Condition(self._lock)  # notified as each delivery ends
        self._running: dict[tuple[str, int], Running] = {}
        self._loop = None  # the event loop, once an async delivery came
        self._closing = False
        # The deliveries' step writes that are ready together share a transaction.
        self._commits = StepCommits(backend)

    def serve(self) -> None:
        """Take the supervisor's messages until it says `Exit`, then let the deliveries in hand
        finish and return."""
        while True:
            task = self._watch.next_task()
            match task:
                case None:
                    break
                case Run():
                    self.begin(task)
                case Stop():
                    self.stop(task)
        with self._lock:
            while self._running:
                self._ended.wait()
            self._closing = True
        self._threads.shutdown(wait=True)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._commits.close()

    def begin(self, task: Run) -> None:
        lease = task.lease
        run = WorkflowRun(self._backend, lease, self._registry, may_write=self._watch.may_write,
                          claimed_at=task.claimed_at, start=task.start, commits=self._commits,
                          trace_context=task.trace_context)
        entry = Running(run)
        with self._lock:
            self._running[(lease.execution_id, lease.token)] = entry
        if task.start is None:
            # A later delivery reads its recorded steps: on a delivery thread, so that this one
            # goes on reading the pipe (the supervisor may be sending thousands of `Run`s).
            self._threads.submit(self._prepare_and_run, entry)
        elif self._prepare(entry):  # a first delivery: nothing to read
            if run.asynchronous:
                self.event_loop().call_soon_threadsafe(self._make_task, entry)
            else:
                self._threads.submit(self._run_sync, entry)

    def _prepare(self, entry: Running) -> bool:
        """Prepare the delivery; False if it ended there (and is reported)."""
        try:
            outcome = entry.run.prepare()
        except Exception as exc:
            outcome = raised_outside(exc)
        if outcome is not None:
            self.finish(entry, outcome)
        return outcome is None

    def _prepare_and_run(self, entry: Running) -> None:
        """On a delivery thread: prepare, then run a sync workflow here, or hand an async one to
        the event loop (and free the thread)."""
        if self._prepare(entry):
            if entry.run.asynchronous:
                self.event_loop().call_soon_threadsafe(self._make_task, entry)
            else:
                self._run_sync(entry)

    def stop(self, message: Stop) -> None:
        with self._lock:
            entry = self._running.get((message.execution_id, message.token))
        if entry is None:
            return  # it ended meanwhile: its `Done` is on its way
        entry.run.stop(f"stopped by the supervisor (token {message.token}: lease lost or execution ended)")
        task = entry.task
        if task is not None:
            self._loop.call_soon_threadsafe(task.cancel)
        # Else: a sync delivery, refused at its next write; or an async one whose task is not
        # made yet, which `_make_task` cancels as it makes it.

    def finish(self, entry: Running, outcome: DeliveryOutcome) -> None:
        lease = entry.run.lease
        entry.run.end(outcome)
        with self._lock:
            self._running.pop((lease.execution_id, lease.token), None)
            self._ended.notify_all()
        self._watch.send(Done(lease.execution_id, lease.token, outcome,
                              int((time.monotonic() - entry.started) * 1000), replace_reason(),
                              tuple(entry.run.writer.step_seconds)))

    # -- sync deliveries: a thread each ------------------------------------------------------

    def _run_sync(self, entry: Running) -> None:
        try:
            outcome = entry.run.run()
        except Exception as exc:
            outcome = raised_outside(exc)
        self.finish(entry, outcome)

    # -- async deliveries: tasks of the one event loop ---------------------------------------

    def event_loop(self):
        with self._lock:
            if self._loop is None:
                # asyncio is imported by the first async delivery, as in `run_to_end`.
                import asyncio

                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._serve_loop, args=(self._loop,), name="yieldstar-event-loop",
                                 daemon=True).start()
            return self._loop

    def _serve_loop(self, loop) -> None:
        try:
            loop.run_forever()
        except BaseException:
            log.error("the worker's event loop ended with an error; ending every delivery of this worker:\n%s",
                      traceback.format_exc(), extra={"event": "worker_loop_failed"})
            os._exit(EXIT_LOOP_DIED)
        if not self._closing:  # pragma: no cover - only `serve` stops the loop
            os._exit(EXIT_LOOP_DIED)

    def _make_task(self, entry: Running) -> None:
        entry.task = task = self._loop.create_task(entry.run.run_async())
        task.add_done_callback(lambda ended: self._task_done(entry, ended))
        if entry.run.writer.stopped:
            task.cancel()

    def _task_done(self, entry: Running, task) -> None:
        if task.cancelled():
            outcome = LeaseLost() if entry.run.writer.stopped else Retry("the delivery's task was cancelled")
        else:
            exc = task.exception()
            outcome = task.result() if exc is None else raised_outside(exc)
        self.finish(entry, outcome)


def serve_many(backend, registry, watch: ParentWatch, slots: int) -> None:
    """Serve deliveries, up to `slots` at once, until told to exit; never returns."""
    Deliveries(backend, registry, watch, slots).serve()
    backend.close()
    tracing.flush()  # os._exit runs no atexit hook: the spans a batch still holds go now
    os._exit(EXIT_OK)
