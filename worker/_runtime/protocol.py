"""The messages a supervisor and its child exchange over the child's pipe.

Each message is a small frozen dataclass, read by its type (`match` or `isinstance`), never by
position, as CPython's `concurrent.futures.process` passes `_CallItem` and `_ResultItem`. They
are pickled on every delivery and every heartbeat, so they stay small: plain fields, and no
method but a `__reduce__` that pickles a message as its class and its fields in order (`message`):
the one a frozen dataclass with slots gets pickles by way of `copyreg` and a Python
`__setstate__`, and took about as long as the delivery's own work in a worker's loop; the lease a
`Run` carries goes as its three fields for the same reason.

parent -> child                               child -> parent
Run(lease, claimed_at, start, trace_context)  Ready(pid, workflows,         once, after loading the
                                                schedules)
Stop(execution_id, token)                     AppNotLoaded(pid, error)      app and opening the
Beat(expires_at or None)                      LedgerNotOpened(pid, error,   ledger: one of these
Exit()    finish and exit                       storage_error)
                                              Alive()                       answers every Beat
                                              Done(execution_id, token, outcome, ms,
                                                replace, steps)

A worker runs up to `slots` deliveries at once (its start settings say how many: 1 unless the
supervisor runs with `--workers`), so several `Run`s may be in flight before their `Done`s,
which come back in the order the deliveries end, each naming its execution and token.

A `Done`'s `steps` are how long each step attempt of the delivery took, in seconds: the
supervisor learns of step writes only this way, and its `--metrics` histogram counts them.

A `Done` whose `replace` says why asks the supervisor to replace the worker once it has handled
the delivery: a step that ran past its timeout left a thread in it that cannot be stopped
(`worker.timeouts`).

A `Done`'s outcome goes whole, fields included: a replay that diverged from its records comes
back as `Suspended(diverged=detail)`, and the detail reaches the acknowledgement that parks it.

`Ready.workflows` names the workflows the app registers, sorted: what the supervisor claims
(routing, SPEC section 11); `Ready.schedules` the schedules it declares, which the supervisor
admits the ticks of (SPEC section 12). `AppNotLoaded.error` is "cannot load app APP: CAUSE", then the child's traceback. A
`LedgerNotOpened` says the ledger could not be opened for a lasting reason (a corrupt or unsafe
file; `storage_error` is the `StorageError.kind`), not that the app is broken.

`claimed_at` is the ledger time (ms) of the claim that made the delivery: the child never reads
a time earlier than that one when it decides whether a timer is due, so a child whose clock
lags the one that decided the execution was claimable does not find the timer early and spin.
`start` is (workflow, input JSON) on an execution's first delivery, which the child then need not
read from the ledger, and None on every later one (see `Claimed`). `trace_context` is the trace
context the execution's start stored (`Claimed.trace_context`), on every delivery: the worker's
delivery span is its child (`worker._runtime.tracing`); None: none stored.
A supervisor that finds a lease lost (or the execution cancelled) kills a worker that runs one
delivery at a time: it may be inside a step calling the outside world, and a message it would
read only after that step is no way to stop it. A worker that runs several is sent `Stop` for that
one delivery instead, so that the others run on: an async delivery's task is cancelled at its next
await, a sync one has its writes refused from then on (`StopDelivery`), and either reports `Done`
(`LeaseLost`). One that has not reported within the heartbeat tolerance gets its worker killed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Optional, Union

from supervisor.ledger.ticks import Schedule
from supervisor.ledger.values import DeliveryOutcome, ExecutionLease


def message(cls: type) -> type:
    """A frozen dataclass with slots, pickled as its class and its fields in order (see the
    module doc)."""
    cls = dataclass(frozen=True, slots=True)(cls)
    names = tuple(field.name for field in fields(cls))

    def __reduce__(self: Any) -> tuple:
        return cls, tuple([getattr(self, name) for name in names])

    if "__reduce__" not in cls.__dict__:  # `Run` says its own
        cls.__reduce__ = __reduce__  # type: ignore[method-assign]
    return cls


def _run(execution_id: str, token: int, expires_at: int, claimed_at: int, start: Optional[tuple[str, str]],
         trace_context: Optional[str] = None) -> Run:
    return Run(ExecutionLease(execution_id, token, expires_at), claimed_at, start, trace_context)

# -- parent -> child -------------------------------------------------------------------------


@message
class Run:
    """Run one delivery of `lease`, then report it with `Done`."""

    lease: ExecutionLease
    claimed_at: int  # the ledger time (ms) of the claim
    start: Optional[tuple[str, str]] = None  # (workflow, input JSON) on a first delivery
    trace_context: Optional[str] = None  # the start's stored trace context (JSON), if any

    def __reduce__(self) -> tuple:
        lease = self.lease
        return _run, (lease.execution_id, lease.token, lease.expires_at, self.claimed_at, self.start,
                      self.trace_context)


@message
class Stop:
    """Stop the delivery of `execution_id` under `token` (its lease is lost, or its execution
    ended in the ledger), leaving the worker's other deliveries running; it reports `Done`. A
    delivery already ended is not found: its `Done` is on its way."""

    execution_id: str
    token: int


@message
class Beat:
    """A heartbeat; the child answers `Alive`."""

    expires_at: Optional[int]  # the earliest lease expiry (ms) of the running deliveries, None while idle


@message
class Exit:
    """Finish the deliveries in hand, if any, and exit."""


ToChild = Union[Run, Stop, Beat, Exit]

# -- child -> parent -------------------------------------------------------------------------


@message
class Ready:
    """The child loaded the app and opened the ledger: it may take deliveries."""

    pid: int
    workflows: tuple[str, ...] = ()  # the names its app registers, sorted
    schedules: tuple[Schedule, ...] = ()  # the schedules its app declares, by workflow name
    # The queues its app declares, (name, concurrency, per_key, rate_count, rate_seconds), by name,
    # and each workflow's default (workflow, queue, priority, timeout_ms): the supervisor records them.
    queues: tuple[tuple, ...] = ()
    defaults: tuple[tuple, ...] = ()


@message
class AppNotLoaded:
    """The child could not import the user's app, and exits."""

    pid: int
    error: str  # "cannot load app APP: CAUSE", then the traceback


@message
class LedgerNotOpened:
    """The child could not open the ledger for a lasting reason, and exits."""

    pid: int
    error: str
    storage_error: str  # the `StorageError.kind`


@message
class Alive:
    """The answer to a `Beat`."""


@message
class Done:
    """The child finished the delivery it was handed."""

    execution_id: str
    token: int
    outcome: DeliveryOutcome
    ms: int  # how long it ran
    # Why the worker must be replaced, or None: a step's thread it could not stop runs on in it
    # (`worker._runtime.abandoned`). The supervisor kills it and releases its other deliveries.
    replace: Optional[str] = None
    # How long each step attempt of the delivery took (s), for the supervisor's metrics
    # (`yieldstar_step_seconds`): a few floats, so no message of its own.
    steps: tuple[float, ...] = ()


FromChild = Union[Ready, AppNotLoaded, LedgerNotOpened, Alive, Done]
StartReport = Union[Ready, AppNotLoaded, LedgerNotOpened]  # a child's first message

# Exit codes of a child process, so the supervisor's log can tell why a child went away.
EXIT_OK = 0
EXIT_APP_FAILED = 3  # the user's app could not be imported
EXIT_PARENT_GONE = 4  # the supervisor died, froze or closed the pipe: stopped writing and left
EXIT_LEDGER_UNUSABLE = 5  # the ledger cannot be opened until an operator acts (corrupt, unsafe, ...)
EXIT_CODES = {EXIT_OK: "exited", EXIT_APP_FAILED: "could not load the app", EXIT_PARENT_GONE: "lost its supervisor",
              EXIT_LEDGER_UNUSABLE: "could not open the ledger"}
