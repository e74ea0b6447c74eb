"""Ledger calls off the dispatcher's thread: a thread that makes them, and a wake-up in `wait()`.

The dispatcher loop beats its children, watches their pipes and decides what to claim; it must
never stop to wait for the database, because a write lock held by another process, a full disk
or a slow file system would then silence every heartbeat and make healthy children give up
their deliveries. So every ledger call the loop wants made is put on a queue, a thread of its own
(with a connection of its own) makes the calls in order, and each reply comes back as a value —
the result, or the storage error that the call raised — through a wake-up descriptor that the
loop waits on with its pipes (the shape of CPython's `concurrent.futures.process`, whose manager
thread is woken by a `_ThreadWakeup`). The loop stays the only owner of delivery state: the thread
touches nothing but its own queue and connection.

    dispatcher loop --submit(Call)--> queue --> ledger thread --> make(call, backend.executions)
          ^                                           |
          +--- wait() sees the wake-up fd <-- Reply --+

Each call is a value of its own type (`Claim`, `Acknowledge`, `Release`, `Renew`, `Ended`,
`NextReadyAt`; `Register`, `Seen`, `Deregister` for the supervisor's own row in the live
supervisors; `AdmitTicks` for the app's schedules; `TimeOut` for the workflow timeouts), matched by type: `make` makes each kind's one ledger method, the thread batches
by type, and the loop takes each reply to the handler registered for its call's type, so no
call is named by a string.

Made on the spot. The hop to the thread and back costs two wake-ups and a hand-over of the
interpreter lock per transaction: a tenth to a fifth of the supervisor's throughput on short
workflows. So a `LedgerCalls` may be given a second backend, `inline`, on which `flush()` makes
the calls itself, in the caller's thread, whenever that cannot keep it waiting: the thread has
nothing in hand (so the calls stay in order), the connection gives up at once if the write lock
is taken (its busy timeout is 0: a held lock sends the calls to the thread, which waits it
out), and no call made so has been slow lately. A commit can still take long where SQLite
checkpoints (it syncs the disk); a flush that took longer than `inline_slow_s` (`INLINE_SLOW_S`,
or a tenth of the heartbeat tolerance when that is shorter: see `dispatcher.Supervisor`) sends
every call to the thread for the next `INLINE_PAUSE_S`, so a disk that has become slow costs
the loop one wait, not one per call. Only a local backend whose commits do not sync is given one
(`dispatcher.Supervisor`): a PostgreSQL call waits for the network, and a commit with `durability="full"`
for the disk.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from .ledger.contract import Backend
from .ledger.errors import StorageBusy, StorageError
from .ledger.values import ExecutionLease, Outcome

log = logging.getLogger("yieldstar.supervisor")

# A flush made on the spot that took longer than this (s) makes the next ones go to the thread
# for a while (see "Made on the spot" above): a healthy commit takes well under a millisecond, a
# checkpoint a few.
INLINE_SLOW_S = 0.1
INLINE_PAUSE_S = 10.0


class Wakeup:
    """A pipe whose read end joins a `wait()` call; `wake()` may be called from any thread (and
    from a signal handler, through `signal.set_wakeup_fd(wakeup.write_fd)`)."""

    def __init__(self) -> None:
        self._read, self.write_fd = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self.write_fd, False)

    def fileno(self) -> int:
        return self._read

    def wake(self) -> None:
        try:
            os.write(self.write_fd, b"!")
        except BlockingIOError:
            pass  # the pipe is full of wake-ups already: the reader will look anyway

    def drain(self) -> None:
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        for fd in (self._read, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass


@dataclass(frozen=True, kw_only=True)
class Call:
    """One ledger call (`make` says which method of `backend.executions` each kind makes).
    `about` is what the caller needs to act on the reply (a delivery, a claim's time). `timed`:
    the reply carries the ledger's time read just before the call, for a caller that needs "how
    long from now" (on PostgreSQL that time is the server's: reading it is a ledger call too,
    made here)."""

    name: ClassVar[str]  # the ledger method, for the log
    about: Any = None
    timed: bool = False

    def __init_subclass__(cls, *, name: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.name = name or cls.name


# Acknowledgements and claims are what several children's endings and the claims for their
# replacements share one transaction in (group commit, see `_joins`): what is queued when the
# thread comes back from the database (or was flushed together) goes in one transaction, so a
# busy supervisor commits once for many, and an idle one never waits to fill a batch.


@dataclass(frozen=True)
class Claim(Call, name="claim_deliveries"):
    """Up to `limit` leases of `duration` ms of executions of `workflows` (None: any; routing);
    as of the ledger's clock unless `now` is given."""

    limit: int
    duration: int
    now: Optional[int] = None
    workflows: Optional[frozenset[str]] = None


@dataclass(frozen=True)
class Acknowledge(Call, name="acknowledge"):
    """End a delivery with its outcome; shares a transaction with others and with claims."""

    lease: ExecutionLease
    outcome: Outcome


@dataclass(frozen=True)
class Release(Call, name="release"):
    """End a delivery without an outcome."""

    lease: ExecutionLease


@dataclass(frozen=True)
class Renew(Call, name="renew_many"):
    """Extend every lease of `leases` by `duration` ms, each fenced by its own token, a few
    transactions for all of them (`renew_many`); the reply is a list, one item per lease in
    order (`Renewed`, `LeaseLost`, or `StorageBusy` for a row another transaction held), and
    `about` the list of the leases' deliveries. Made by the renewal thread, apart from claims and
    settlements, so that a renewal never waits behind them."""

    leases: list[ExecutionLease]
    duration: int


@dataclass(frozen=True)
class Ended(Call, name="ended"):
    """Which of `leases` have ended in the ledger (an operator cancelled the execution, or it
    was claimed again after its lease expired): a read, asked once a heartbeat."""

    leases: list[ExecutionLease]


@dataclass(frozen=True)
class NextReadyAt(Call, name="next_ready_at"):
    """When the next execution (of `workflows`, None: any) becomes claimable."""

    workflows: Optional[frozenset[str]] = None


@dataclass(frozen=True)
class Register(Call, name="register"):
    """Record this supervisor among the live ones (`backend.supervisors.register`): `row` holds
    register's keyword arguments."""

    supervisor_id: str
    row: tuple  # ((name, value), ...): register's keyword arguments, hashable


@dataclass(frozen=True)
class Seen(Call, name="seen"):
    """This supervisor is still running: one small statement, made at each renewal round; the
    reply is False when its row was dropped (it was not seen for too long): register again."""

    supervisor_id: str


@dataclass(frozen=True)
class Deregister(Call, name="remove"):
    """This supervisor exits cleanly: its row goes."""

    supervisor_id: str


@dataclass(frozen=True)
class Unpark(Call, name="unpark"):
    """The workflows this supervisor serves became known (or changed): their parked executions
    (parked by a replay that diverged, SPEC section 11) are due again (`executions.unpark`)."""

    workflows: frozenset[str]


@dataclass(frozen=True)
class AdmitTicks(Call, name="admit_due"):
    """Admit the due ticks of `schedules` (the app's schedules, SPEC section 12), each once across
    every supervisor (`backend.schedules.admit_due`); the reply is their records, whose next ticks
    say when to call again. Made timed, for that "when"."""

    schedules: tuple


@dataclass(frozen=True)
class RecordQueues(Call, name="record_queues"):
    """The app's queue limits and its workflows' defaults (queue, priority, timeout), recorded
    when the supervisor starts serving (SPEC section 12: the latest start wins), before its first
    claim."""

    queues: tuple[tuple, ...]  # (name, concurrency, per_key, rate_count, rate_seconds)
    defaults: tuple[tuple, ...]  # (workflow, queue, priority, timeout_ms)
    unscheduled: tuple[str, ...] = ()  # the served workflows the app does not schedule


@dataclass(frozen=True)
class TimeOut(Call, name="time_out_due"):
    """Fail every execution past its workflow timeout (SPEC section 12), of any workflow: made once
    a renewal round by every supervisor (`timeouts`); one index read when none is. The reply is the
    ids it failed."""


def record_queues(backend: Backend, call: RecordQueues) -> int:
    """Declare each queue's limits, record the defaults, and forget the schedules the app no
    longer has; how many queues."""
    for name, concurrency, per_key, rate_count, rate_seconds in call.queues:
        backend.queues.declare(name, concurrency=concurrency, per_key=per_key,
                               rate=None if rate_count is None else (rate_count, rate_seconds))
    backend.queues.record_defaults({workflow: tuple(default) for workflow, *default in call.defaults})
    if call.unscheduled:
        backend.schedules.forget(call.unscheduled)
    return len(call.queues)


def make(call: Call, backend: Backend) -> Any:
    """Make `call` on `backend`: its reply's value."""
    executions = backend.executions
    match call:
        case Claim():
            return executions.claim_deliveries(limit=call.limit, duration=call.duration, now=call.now,
                                               workflows=call.workflows)
        case Acknowledge():
            return executions.acknowledge(call.lease, call.outcome)
        case Release():
            return executions.release(call.lease)
        case Renew():
            return executions.renew_many(call.leases, duration=call.duration)
        case Ended():
            return executions.ended(call.leases)
        case NextReadyAt():
            return executions.next_ready_at(workflows=call.workflows)
        case Register():
            return backend.supervisors.register(call.supervisor_id, **dict(call.row))
        case Seen():
            return backend.supervisors.seen(call.supervisor_id)
        case Deregister():
            return backend.supervisors.remove(call.supervisor_id)
        case Unpark():
            return executions.unpark(call.workflows)
        case AdmitTicks():
            return backend.schedules.admit_due(call.schedules)
        case RecordQueues():
            return record_queues(backend, call)
        case TimeOut():
            return executions.time_out_due()
    raise TypeError(f"not a ledger call: {call!r}")


CALLS: tuple[type[Call], ...] = (Claim, Acknowledge, Release, Renew, Ended, NextReadyAt, Register, Seen, Deregister,
                                 Unpark, AdmitTicks, RecordQueues, TimeOut)


@dataclass
class Reply:
    call: Call
    value: Any = None
    error: Optional[StorageError] = None
    clock_ms: Optional[int] = None  # the ledger's time before a timed call


def _joins(call: Call, batch: Optional[list[Call]] = None) -> bool:
    """Whether `call` may share one transaction with `batch` (or start a batch when None):
    acknowledgements, and claims of one lease duration and one set of workflows, made as of the
    backend's clock."""
    match call:
        case Acknowledge():
            return True
        case Claim(now=None):
            return all(other.duration == call.duration and other.workflows == call.workflows
                       for other in batch or () if isinstance(other, Claim))
        case _:
            return False


def _next_batch(queued: collections.deque) -> list[Call]:
    """Take from `queued` its first call and those after it that may share its transaction."""
    call = queued.popleft()
    batch = [call]
    while _joins(call) and queued and queued[0] is not None and _joins(queued[0], batch):
        batch.append(queued.popleft())
    return batch


class LedgerCalls:
    """Makes ledger calls in submission order on a thread of its own; replies come back through
    `replies()` once `fileno()` is readable.

    With `gathering` set, submitted calls wait in an outbox until `flush()` (the loop flushes
    before it blocks), so that what one turn of the loop decides (a child's acknowledgement, the
    claim for its freed slot) reaches the thread at once and can share a transaction. With
    `inline` too, `flush()` may make them itself (see the module docstring); their replies are
    then ready at once (`has_replies()`), with no wake-up.

    Only storage errors become replies: any other exception is a bug in the caller (a bad
    argument), and is raised again by `replies()` in the loop, where it ends the supervisor with
    its traceback instead of being retried forever.
    """

    def __init__(self, backend: Backend, name: str, *, gathering: bool = False, inline=None,
                 inline_slow_s: float = INLINE_SLOW_S):
        """
        Args:
            backend: a backend of its own, used only by this thread from now on.
            name: the thread's name, for stack dumps.
            gathering: hold submitted calls until `flush()`.
            inline: a backend of its own for the calls `flush()` makes itself, used only by
                the thread that flushes; its connection must give up at once on a busy file.
            inline_slow_s: a flush made on the spot that took longer than this (s) sends the
                calls to the thread for the next `INLINE_PAUSE_S`.
        """
        self.backend = backend
        self.inline = inline
        self.inline_slow_s = inline_slow_s
        self.inline_paused_until = 0.0  # monotonic s: till then every call goes to the thread
        self.gathering = gathering
        self._outbox: list[Call] = []
        self._requests: "queue.SimpleQueue[list[Optional[Call]]]" = queue.SimpleQueue()
        self._replies: collections.deque = collections.deque()
        self._wakeup = Wakeup()
        self.pending = 0  # submitted and not yet replied to; touched by the loop only
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def fileno(self) -> int:
        return self._wakeup.fileno()

    def submit(self, call: Call) -> None:
        self.pending += 1
        self._outbox.append(call)
        if not self.gathering:
            self.flush()

    def flush(self) -> None:
        """Make the calls in the outbox on the spot where they cannot wait, and hand the rest
        to the thread, all at once."""
        if not self._outbox:
            return
        calls, self._outbox = self._outbox, []
        if self.inline is not None and self.pending == len(calls):
            now = time.monotonic()
            if now >= self.inline_paused_until:
                calls = self._make_inline(calls)
                if time.monotonic() - now > self.inline_slow_s:
                    log.warning("a ledger call took %.1f s: the next ones go to the ledger thread for %.0f s",
                                time.monotonic() - now, INLINE_PAUSE_S, extra={"event": "ledger_call_slow"})
                    self.inline_paused_until = time.monotonic() + INLINE_PAUSE_S
        if calls:
            self._requests.put(calls)

    def _make_inline(self, calls: list[Call]) -> list[Call]:
        """Make `calls` on the `inline` backend, batch by batch, until one meets a busy file;
        returns that one and those after it, for the thread."""
        queued = collections.deque(calls)
        while queued:
            batch = _next_batch(queued)
            try:
                self._replies.extend(self._make(batch, self.inline))
            except StorageBusy:  # it changed nothing: the thread makes it, and waits for the lock
                queued.extendleft(reversed(batch))
                break
            except StorageError as exc:
                self._replies.extend(Reply(each, error=exc) for each in batch)
        return list(queued)

    def has_replies(self) -> bool:
        """Whether replies are waiting to be taken (those of calls made on the spot are not
        announced by the wake-up)."""
        return bool(self._replies)

    def drain(self) -> None:
        """Empty the wake-up, once `fileno()` was found readable (`replies()` does not look)."""
        self._wakeup.drain()

    def replies(self) -> list[Reply]:
        out = []
        while self._replies:
            reply = self._replies.popleft()
            self.pending -= 1
            if isinstance(reply, BaseException):
                raise reply
            out.append(reply)
        return out

    def _run(self) -> None:
        queued: collections.deque[Optional[Call]] = collections.deque()
        while True:
            if not queued:
                queued.extend(self._requests.get())
            while True:  # whatever else has come in since may join the batch
                try:
                    queued.extend(self._requests.get_nowait())
                except queue.Empty:
                    break
            if queued[0] is None:
                return
            batch = _next_batch(queued)
            try:
                self._replies.extend(self._make(batch))
            except StorageError as exc:
                self._replies.extend(Reply(each, error=exc) for each in batch)
            except BaseException as exc:  # a bug: hand it to the loop, which raises it
                self._replies.append(exc)
            self._wakeup.wake()

    def _make(self, batch: list[Call], backend=None) -> list[Reply]:
        """The replies to a batch, made on `backend` (the thread's by default): one call as
        itself, several in one `acknowledge_and_claim_deliveries`."""
        backend = backend or self.backend
        executions = backend.executions
        if len(batch) == 1:
            call = batch[0]
            clock_ms = backend.clock() if call.timed else None
            return [Reply(call, make(call, backend), clock_ms=clock_ms)]
        acks = [call for call in batch if isinstance(call, Acknowledge)]
        claims = [call for call in batch if isinstance(call, Claim)]
        replies, claimed = executions.acknowledge_and_claim_deliveries(
            [(call.lease, call.outcome) for call in acks], limit=sum(call.limit for call in claims),
            duration=claims[0].duration if claims else 1, workflows=claims[0].workflows if claims else None)
        out = [Reply(call, reply) for call, reply in zip(acks, replies)]
        for call in claims:  # each claim gets deliveries up to its own limit, in the order claimed
            out.append(Reply(call, claimed[:call.limit]))
            claimed = claimed[call.limit:]
        return out

    def close(self, timeout: float = 5.0) -> bool:
        """Stop the thread once the calls already submitted are made, waiting at most `timeout`
        seconds; True if it stopped (and its connection was closed). A thread still blocked in
        the database is left behind (it is a daemon) with its connection open: closing a
        connection under a running statement is not safe."""
        self.flush()
        self._requests.put([None])  # after whatever the flush left to the thread
        if self.inline is not None:
            self.inline.close()  # used by this thread alone: no statement of it is running
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("%s is still waiting for the database; leaving it", self._thread.name,
                        extra={"event": "ledger_thread_left"})
            return False
        self.backend.close()
        self._wakeup.close()
        return True
