"""The ledger's value types: leases, records and the replies of fenced calls.

Every reply object has a `status` string, so callers can branch on `reply.status` or on the type.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Optional, Union


class _WorkflowsTimeout:
    """The type of WORKFLOWS_TIMEOUT (one value)."""

    def __repr__(self) -> str:
        return "WORKFLOWS_TIMEOUT"


# `admit(timeout_ms=WORKFLOWS_TIMEOUT)`: the execution takes its workflow's default timeout as
# recorded (`QueueClient.record_defaults`), or, before any record, the one the first record
# gives (its deadline still counted from the admission). A start that names no timeout means this.
WORKFLOWS_TIMEOUT = _WorkflowsTimeout()


class ExecutionStatus(str, enum.Enum):
    ADMITTED = "admitted"
    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"  # by an operator (`executions.cancel`); terminal, and resumable

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATUSES

    def __str__(self) -> str:
        return self.value


#: The statuses an execution ends in (and may be purged in), in the order operators read them.
#: Plain strings, so they compare with a record's status and serve as click choices as they are.
TERMINAL_STATUSES: tuple[str, ...] = tuple(
    s.value for s in (ExecutionStatus.COMPLETED, ExecutionStatus.FAILED, ExecutionStatus.CANCELLED))

#: The terminal statuses a workflow's own delivery acknowledges; `cancelled` is an operator's.
OUTCOME_STATUSES: tuple[str, ...] = (ExecutionStatus.COMPLETED.value, ExecutionStatus.FAILED.value)


class DeliveryEnd(str, enum.Enum):
    """How one delivery (one claim, one token) ended, as the lease history records it."""

    ACKNOWLEDGED = "acknowledged"
    RELEASED = "released"
    EXPIRED = "expired"  # the lease ran out and nobody has claimed the execution since
    SUPERSEDED = "superseded"  # the lease ran out and a later claim took the execution over
    CANCELLED = "cancelled"  # an operator cancelled the execution while the delivery was open
    TIMED_OUT = "timed_out"  # the execution's workflow timeout passed while the delivery was open
    FENCED = "fenced"  # the ledger was restored or failed over while it was open (`tables.epochs`)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ExecutionLease:
    execution_id: str
    token: int
    expires_at: int


@dataclass(frozen=True)
class Claimed:
    """A lease `claim_deliveries` took, with what a worker needs to start a first delivery.

    `input_json` is the execution's input when this is its first delivery (token 1: nothing was
    recorded under an earlier one, so the worker need not read its steps from the ledger), and
    None when the execution was delivered before: its worker reads its record and steps. (A fork
    with copied steps is admitted past token 0 for this reason, and is first claimed with token 2:
    `tables.forks`.)
    `trace_context` is the trace context its start stored (`admit(trace_context=)`), on every
    delivery: the worker's delivery span is a child of it (SPEC section 13). None: none stored.
    `queue` and `due_at` label and time the claim for the supervisor's metrics: `due_at` (ms) is
    when the execution became claimable as the claim found it, its due time, or the expiry of
    the lease this claim supersedes when that is later (a delivery again after a lease ran out
    waited from then, not from before its lost delivery). The claim delay is the claim's time
    (the lease's expiry less its length) minus `due_at`.
    """

    lease: ExecutionLease
    workflow: str
    input_json: Optional[str] = None
    trace_context: Optional[str] = None
    queue: Optional[str] = None
    due_at: Optional[int] = None


def _member(enum_type: type[enum.Enum], value: Any) -> Any:
    """`value` as a member of the `str` Enum `enum_type` (which compares equal to the plain
    string); a value the Enum does not know is kept as it is, so that reading never fails on it."""
    return enum_type._value2member_map_.get(value, value)


@dataclass(frozen=True)
class ExecutionRecord:
    """One execution as the ledger holds it (SPEC section 3); `status` is an `ExecutionStatus`,
    equal to its plain string ("completed" == ExecutionStatus.COMPLETED)."""

    execution_id: str
    workflow: str
    input_json: str
    status: ExecutionStatus
    token: int
    due_at: Optional[int]
    lease_expires_at: Optional[int]
    unacknowledged_deliveries: int
    result_json: Optional[str]
    error_json: Optional[str]
    created_at: int
    updated_at: int
    queue: str = "default"  # SPEC section 12: the queue whose limits its claims obey
    key: Optional[str] = None  # the queue's per_key limit counts leases by this
    priority: int = 0  # higher first
    deadline_at: Optional[int] = None  # ms: failed as WorkflowTimedOut if not terminal by then; None: no timeout

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", _member(ExecutionStatus, self.status))


@dataclass(frozen=True)
class QueueRecord:
    """A queue's limits (None: no limit) and its executions now: due (claimable), running (live
    leases) and waiting (neither terminal nor due)."""

    name: str
    concurrency: Optional[int]
    per_key: Optional[int]
    rate: Optional[tuple[int, float]]  # (count, seconds)
    due: int
    running: int
    waiting: int


@dataclass(frozen=True)
class HeapRecord:
    execution_id: str
    step_key: str
    attempt: int
    done: bool
    step_response_json: str
    status: ClassVar[str] = "written"


@dataclass(frozen=True)
class StepWrite:
    """One step attempt to record, fenced by its lease (`HeapClient.write_steps`)."""

    lease: ExecutionLease
    step_key: str
    step_attempt: int
    done: bool
    step_response_json: str


@dataclass(frozen=True)
class LeaseRecord:
    """One delivery of an execution, from the lease history.

    `ended_by` is None while the lease is live. An expired lease reads `expired` until a later
    claim supersedes it; either way `ended_at` is the lease's last expiry. `outcome` is the
    status an acknowledgement recorded (`suspended`, `completed`, `failed`), else None.
    """

    execution_id: str
    token: int
    holder: str
    claimed_at: int
    expires_at: int
    renewals: int
    ended_at: Optional[int]
    ended_by: Optional[DeliveryEnd]
    outcome: Optional[ExecutionStatus]

    def __post_init__(self) -> None:
        object.__setattr__(self, "ended_by", _member(DeliveryEnd, self.ended_by))
        object.__setattr__(self, "outcome", _member(ExecutionStatus, self.outcome))


@dataclass(frozen=True)
class Suspended:
    # Set when the replay diverged from the recorded steps (SPEC section 11): one line naming the
    # recorded step and the step the code reached; the acknowledgement parks the execution.
    diverged: Optional[str] = None
    # Set when it waits to retry a step whose attempt failed: that error as JSON `{"type",
    # "message", "step", "attempt"}`, for the supervisor's log line. Not compared: the ledger
    # records the attempt's error with the step, not with the acknowledgement.
    step_error_json: Optional[str] = field(default=None, compare=False)
    status: ClassVar[str] = "suspended"


@dataclass(frozen=True)
class Completed:
    result_json: str
    status: ClassVar[str] = "completed"


@dataclass(frozen=True)
class Failed:
    error_json: str
    status: ClassVar[str] = "failed"


@dataclass(frozen=True)
class Renewed:
    lease: ExecutionLease
    status: ClassVar[str] = "renewed"


@dataclass(frozen=True)
class Released:
    status: ClassVar[str] = "released"


@dataclass(frozen=True)
class LeaseLost:
    status: ClassVar[str] = "lost"


Outcome = Union[Suspended, Completed, Failed]


@dataclass(frozen=True)
class Retry:
    """A delivery's reply asking to be tried again later (a transient fault such as a busy
    database): the holder releases the lease instead of acknowledging."""

    reason: str
    # The kind of storage error that ended the delivery (`StorageError.kind`: "busy",
    # "unavailable", "corrupt", ...), or None when the delivery asked to retry for another reason.
    storage_error: Optional[str] = None
    status: ClassVar[str] = "retry"


DeliveryOutcome = Union[Suspended, Completed, Failed, Retry, LeaseLost]


@dataclass(frozen=True)
class EffectState:
    """An external operation that must not repeat, identified by its effect id (RFC 004)."""

    effect_id: str
    status: str  # pending | settled
    result_json: Optional[str]
    begun: int  # how many times it was begun: more than one means a replay or a stale holder


@dataclass(frozen=True)
class SettleConflict:
    """A settle whose result differs from the one already kept: reported, not applied."""

    effect_id: str
    kept_result_json: str
    offered_result_json: str
    status: ClassVar[str] = "conflict"


@dataclass(frozen=True)
class StoreState:
    name: str
    state_json: str
    version: int


@dataclass(frozen=True)
class Message:
    """One message sent to an execution (SPEC section 14), in the order of `seq` per execution.

    `taken_step` is the step key of the `recv` that took it; None while it is pending."""
    execution_id: str
    message_id: str
    topic: str
    seq: int
    message_json: str
    sent_at: int
    taken_step: Optional[str] = None
    taken_at: Optional[int] = None


@dataclass(frozen=True)
class Event:
    """The value last set under `key` by an execution (`ctx.set_event`)."""
    execution_id: str
    key: str
    value_json: str
    set_at: int


@dataclass(frozen=True)
class StoreReceipt:
    """The recorded result of one store change, keyed by (store, execution, step key).

    `applied` is True for the call that committed the change, False for every later caller
    (a replay, or a stale holder) who gets the recorded result instead."""

    store: str
    execution_id: str
    step_key: str
    result_json: str
    applied: bool


@dataclass(frozen=True)
class WaitReason:
    """One thing a waiting execution is waiting for (`executions.waiting_for`).

    `kind` is one of:
    - `timer`: a durable timer (`ctx.sleep`); `target` is the step key, `at` when it fires;
    - `retry`: a step's retry backoff; `target` the step key, `at` the next attempt,
      `detail` the last attempt's error as "Type: message";
    - `redelivery`: the backoff after unacknowledged deliveries (crashed or released);
      `at` the earliest next claim, `detail` how many deliveries in a row went unacknowledged;
    - `execution`: another execution to finish (`ctx.wait_for`); `target` its id;
    - `effect`: an effect to be settled (`settle`); `target` the effect id;
    - `store`: a change to a store; `target` the store's name, `detail` the match of a `take`
      as JSON, when there is one;
    - `message`: a message sent to it (`ctx.recv`); `target` its own id, `detail` the topic;
    - `code`: new code: the execution is parked, its replay having diverged from its recorded
      steps (SPEC section 11); `target` its workflow, `detail` how the replay diverged. A
      supervisor that serves the workflow tries it again when it starts (`unpark`), as does
      `resume`;
    - `wake`: a wake requested from outside (`at` set), or, with `at` None, nothing: the
      execution is not due until something wakes it;
    - `due`: nothing: it is due (since `at`) and waits for a supervisor to claim it.
    """

    kind: str
    target: Optional[str] = None
    at: Optional[int] = None
    detail: Optional[str] = None


@dataclass(frozen=True)
class LiveLease:
    """A delivery in progress, for operators: who holds which execution under which token."""

    execution_id: str
    workflow: str
    token: int
    holder: str  # host:pid of the supervisor that claimed it
    claimed_at: int
    expires_at: int
    renewals: int


# A supervisor is live while seen within this many of its renewal intervals (SPEC section 11).
LIVE_INTERVALS = 3


@dataclass(frozen=True)
class ScheduleRecord:
    """A workflow's schedule as the ledger keeps it (`backend.schedules`, SPEC section 12): `spec`
    is its cron expression or "every S s", `timezone` the cron's zone (None: UTC). `last_tick` is
    the latest tick admitted (ms, None before the first), `next_tick` the first not yet due (None:
    a cron expression that matches no time in the next 50 years); both move forward only, in the
    transaction that admits the tick. `admitted`: the call that returned it admitted a tick (the
    execution `tick_id(name, last_tick)`)."""

    name: str
    spec: str
    timezone: Optional[str]
    last_tick: Optional[int]
    next_tick: Optional[int]
    updated_at: int
    admitted: bool = False


@dataclass(frozen=True)
class SupervisorRecord:
    """A running supervisor as the ledger knows it (`backend.supervisors`): registered at its
    start, seen again at every renewal round, removed at its clean exit. `id` is its own, for its
    run; `workflows` the names it serves (claims), sorted; `renew_ms` its renewal interval, which
    says how long it may go unseen: it is live while `now < last_seen_at + LIVE_INTERVALS *
    renew_ms` (`live_until`)."""

    id: str
    host: str
    pid: int
    started_at: int
    last_seen_at: int
    workflows: tuple[str, ...]
    concurrency: int
    workers: int
    renew_ms: int

    @property
    def live_until(self) -> int:
        return self.last_seen_at + LIVE_INTERVALS * self.renew_ms


@dataclass(frozen=True)
class LedgerStats:
    """A summary of a ledger as of `now` (`executions.stats`), for `stats`, `metrics` and `top`.

    `by_status` has every status, zeros included; `by_workflow` maps each workflow to its
    non-zero counts by status. `oldest_due` is the due execution that has waited longest, whatever
    its priority and whether its queue's limits hold it back now (None when nothing is due); `unacknowledged` the executions whose last deliveries went
    unacknowledged, most first (at most `limit`); `live_leases` every live lease, soonest
    expiry first. `deliveries` counts every claim ever made (the lease history's rows), so two
    readings give deliveries per second. `parked` maps each workflow that has parked executions
    (suspended after a diverged replay, waiting for new code) to how many. `served`, when its
    reader asked (`with_served`), is the set of workflows some live supervisor serves
    (`backend.supervisors.served`), read after the rest; None when not read. `queues` is every
    queue with its limits and counts, as `backend.queues.list()` gives them.
    """

    now: int
    by_status: dict
    by_workflow: dict
    oldest_due: Optional[ExecutionRecord]
    unacknowledged: list
    live_leases: list
    deliveries: int
    parked: dict = field(default_factory=dict)
    served: Optional[frozenset] = None
    queues: tuple = ()

    def with_served(self, served) -> "LedgerStats":
        return replace(self, served=frozenset(served))

    def unserved(self) -> dict:
        """The work nobody runs (SPEC section 11): for each workflow that no live supervisor
        serves, its admitted and suspended executions, `{workflow: {status: count}}`, non-zero
        counts only; empty when `served` was not read."""
        if self.served is None:
            return {}
        waiting = (ExecutionStatus.ADMITTED.value, ExecutionStatus.SUSPENDED.value)
        out = {}
        for workflow, counts in self.by_workflow.items():
            if workflow in self.served:
                continue
            counts = {status: counts[status] for status in waiting if counts.get(status)}
            if counts:
                out[workflow] = counts
        return out
