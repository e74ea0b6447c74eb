"""The ledger's contract: the narrow interfaces every storage backend implements.

The SQLite implementation lives in `supervisor.ledger.sqlite`; the contract tests in
`tests/ledger/test_ledger_contract.py` are written against these interfaces.

Two rules run through every method:

- **Clocks decide when, tokens decide whose.** A time (`now`, integer ms; `None` = the backend's
  clock) only decides when an execution may be claimed. Whether a write counts is decided by the
  fencing token alone, checked atomically with the write.
- **A lost lease is a reply, not an error.** A fenced call from a stale holder returns
  `LeaseLost` and changes nothing. Bad arguments raise `ValueError` and change nothing.

What every call raises. Besides the `ValueError`s (`InvalidArgument` and its branches) a call
documents under `Raises:`, any call may raise one of the `StorageError` branches of
`supervisor.ledger.errors`, and never a database driver's own exception; its transaction was rolled
back:

- `StorageBusy` (the database stayed locked past the busy timeout) and `StorageUnavailable`
  (disk full, an I/O error, out of memory) are transient: the same call may succeed later, and
  a fenced or idempotent call may simply be repeated.
- `LedgerUnusable` is lasting, until an operator acts on its message: `StorageCorrupt` (the
  message names the file and how to check and restore it), `LedgerGone` (the file was deleted
  or replaced, or may no longer be written), and, when a backend is opened, `NotALedger`,
  `SchemaTooNew`, `UnsafeLedgerFile` and `NoLedger`.

Calling a backend after `close()` is a programming error, not a storage failure, and raises
what the driver raises for it.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Collection, Optional, Protocol, Sequence

from .errors import StorageBusy
from .values import (
    TERMINAL_STATUSES,
    Claimed,
    EffectState,
    ExecutionLease,
    ExecutionRecord,
    QueueRecord,
    HeapRecord,
    LeaseLost,
    LeaseRecord,
    LedgerStats,
    Outcome,
    Released,
    Renewed,
    SettleConflict,
    StepWrite,
    StoreReceipt,
    Message,
    Event,
    StoreState,
    ScheduleRecord,
    SupervisorRecord,
    WaitReason,
)
from .ticks import Schedule


class DueListener(Protocol):
    """What a backend's `listen_for_due()` returns: told when work becomes due, by any process
    (SQLite: a Unix socket of this host; PostgreSQL: LISTEN, on any host). A hint only: polling
    stays the path that is always right."""

    def fileno(self) -> int:
        """A descriptor that reads ready when work may have become due (to join a `select`)."""

    def drain(self) -> None:
        """Consume what came, so that the descriptor reads ready again only for what comes next."""

    def close(self) -> None: ...


class OutcomeListener(Protocol):
    """What a backend's `listen_for_outcomes()` returns: told the ids of executions that ended,
    by any process (SQLite: a Unix socket of this host; PostgreSQL: LISTEN). A hint only, as for
    `DueListener`: a waiting client polls too."""

    def fileno(self) -> int:
        """A descriptor that reads ready when executions may have ended."""

    def read(self) -> Optional[set[str]]:
        """The ids announced since the last read; None when the announcement did not say which
        (every waiter then looks again)."""

    def close(self) -> None: ...


class NoMatch(Exception):
    """Raised by a `StoreClient.change` function to commit nothing (a `take` that found no
    matching item). A signal between caller and store, not an error."""


class ExecutionClient(abc.ABC):
    @abc.abstractmethod
    def admit(self, execution_id: str, workflow: str, input_json: str = "null", *, queue: Optional[str] = "default",
              key: Optional[str] = None, priority: Optional[int] = 0, timeout_ms: Optional[int] = None,
              trace_context: Optional[str] = None, now: Optional[int] = None) -> ExecutionRecord:
        """Create the execution: status `admitted`, due at `now`, token 0, in `queue` (whose limits
        its claims obey: `QueueClient`), with `key` (counted by the queue's `per_key`; None: not
        limited by it) and `priority` (higher first, a 32-bit int). With `timeout_ms` (an int
        >= 1), its `deadline_at` is `now + timeout_ms`: not terminal by then, it is failed as
        `WorkflowTimedOut` (`time_out_due`); None: no timeout; `values.WORKFLOWS_TIMEOUT`: the
        workflow's default as recorded, or before any record the first record's (its deadline
        still counted from the admission). `trace_context` (the JSON text of
        an OpenTelemetry propagator's carrier, such as `{"traceparent": "00-..."}`; None: none) is
        stored with a new execution and handed with each of its deliveries (`Claimed`), whose
        spans join that trace (SPEC section 13); it is not part of the execution's identity: an
        existing id keeps the context it was admitted with.

        A `queue` or `priority` of None is the workflow's default as recorded
        (`QueueClient.record_defaults`); before any record, "default" and 0, replaced by the
        defaults when the first record of them is made (unless a live lease holds the execution
        then), so that a start made before any supervisor ran still obeys its workflow's queue.

        Admitting an existing id with the same workflow, input (compared as JSON values), queue,
        key, priority (a None accepting the execution's own) and timeout (WORKFLOWS_TIMEOUT
        accepting the execution's own) returns the stored record unchanged.

        Raises:
            ExecutionConflict: the id was admitted with a different workflow, input, queue, key,
                priority or timeout.
        """

    @abc.abstractmethod
    def time_out_due(self, *, now: Optional[int] = None) -> list[str]:
        """The workflow timeout (SPEC section 12): in one transaction, every execution not
        terminal whose `deadline_at <= now` (due, running, sleeping, waiting or parked) becomes
        `failed` with the error `{"type": "WorkflowTimedOut", "message": ...}`, as a cancel ends
        one: a live delivery ends (its holder's fenced calls return `LeaseLost`), its waits are
        forgotten and its waiters woken. Returns their ids, by deadline. When none is past its
        deadline it is one read of an index of the deadlines, and writes nothing."""

    @abc.abstractmethod
    def get(self, execution_id: str, *, now: Optional[int] = None) -> Optional[ExecutionRecord]:
        """The record as of `now`, or None when unknown.

        A lease with `expires_at <= now` is not live: the status reads `suspended` if an earlier
        delivery was acknowledged suspended, else `admitted`, and `unacknowledged_deliveries`
        already counts the expiry.
        """

    @abc.abstractmethod
    def get_with_steps(self, execution_id: str, *, now: Optional[int] = None
                       ) -> Optional[tuple[ExecutionRecord, list[HeapRecord]]]:
        """The record as of `now` (as `get` gives it) and its recorded steps (as
        `HeapClient.steps` gives them), read together in one snapshot; None when unknown.
        What a delivery reads before it replays."""

    @abc.abstractmethod
    def request_wake(self, execution_id: str, at: int, *, now: Optional[int] = None) -> None:
        """Ask for a delivery at `at`. Unfenced: a stale wake costs at most one extra delivery.

        Terminal executions ignore it. With no live lease, `due_at = min(due_at, at)`. During a
        live lease the wake is kept for after that delivery and makes nothing claimable now.

        Raises:
            UnknownExecution: the id was never admitted.
        """

    @abc.abstractmethod
    def claim_due(self, *, limit: int, duration: int, now: Optional[int] = None,
                  workflows: Optional[Collection[str]] = None) -> list[ExecutionLease]:
        """Atomically, across every process sharing the backend, lease up to `limit` executions.

        Claimable: non-terminal, `due_at <= now`, no live lease, and past the redelivery delay
        of its unacknowledged deliveries. Each gets `token + 1`, status `running` and
        `lease_expires_at = now + duration`; earliest `due_at` first.

        Routing (SPEC section 11): with `workflows`, a collection of workflow names, only
        executions whose workflow is one of them are claimed; None claims any workflow. An empty
        collection claims nothing (a supervisor that serves no workflow). The cost of a claim
        does not grow with the due executions of other workflows: each named workflow is one
        index seek.

        Raises:
            InvalidArgument: `workflows` is not None nor a collection of workflow names (a bare
                str is refused, not read as its characters), or one of them is not a valid
                name (empty, not a str, too long); nothing is claimed then.
        """

    @abc.abstractmethod
    def claim_deliveries(self, *, limit: int, duration: int, now: Optional[int] = None,
                         workflows: Optional[Collection[str]] = None) -> list[Claimed]:
        """`claim_due`, with what a worker needs to start each lease's delivery: the workflow,
        and for a first delivery (token 1, nothing recorded yet) the input; and the trace context
        its start stored, if any (see `Claimed`)."""

    @abc.abstractmethod
    def renew(self, lease: ExecutionLease, *, duration: int, now: Optional[int] = None) -> Renewed | LeaseLost:
        """Fenced: extend the lease to `now + duration` if its token is current and its delivery
        has not ended by a release, an acknowledgement or a later claim. (An expired lease that
        nobody claimed since is still current, except in a queue with a `concurrency` or
        `per_key` limit: its slot may have gone to another claim since it expired. A claim that
        takes a slot of such a queue ends the deliveries of the queue whose leases it counted run
        out, recorded `expired`, whatever the holder's clock says.)"""

    @abc.abstractmethod
    def renew_many(self, leases: Sequence[ExecutionLease], *, duration: int, now: Optional[int] = None
                   ) -> list[Renewed | LeaseLost | StorageBusy]:
        """Fenced, each lease by its own token: `renew` for every lease of `leases`, a few
        transactions for all of them (one per 1,000 leases), the replies in the order of
        `leases`. A lease given twice is renewed once, both replies the same. A stale lease gets
        `LeaseLost` and changes nothing; the others are renewed all the same.

        A batch never waits behind one busy row: where the database locks rows (PostgreSQL), the
        batch skips the rows another transaction holds, and each of those is then renewed on
        its own, all of them within one of `renew`'s bounded lock waits (not one wait each: one
        stuck transaction may hold many of the rows). A row still held after that wait is neither
        renewed nor lost: its reply is the `StorageBusy` error as a value, and the caller
        renews it again at its next round (its lease has slack for that).

        Raises:
            InvalidArgument: a lease that is not an `ExecutionLease`, or a bad `duration` or
                `now`; nothing is renewed then.
        """

    @abc.abstractmethod
    def release(self, lease: ExecutionLease, *, now: Optional[int] = None) -> Released | LeaseLost:
        """Fenced: end the delivery without an outcome. It counts as unacknowledged, and the
        execution is not claimable before `now + redelivery_delay(n)`."""

    @abc.abstractmethod
    def acknowledge(self, lease: ExecutionLease, outcome: Outcome, *, now: Optional[int] = None
                    ) -> Outcome | LeaseLost:
        """Fenced: end the delivery with `outcome` and reset `unacknowledged_deliveries` to 0.

        `Suspended()`: due at the earliest wake requested during the delivery, or not due.
        `Suspended(diverged=detail)`: the replay diverged from the recorded steps (SPEC section
        11); the execution is **parked** in the same transaction: suspended, not due (a wake
        requested during the delivery is dropped), and `waiting_for` gives
        `WaitReason("code", workflow, None, detail)` until `unpark`, `resume` or any wake makes
        it due again. `Completed`/`Failed`: terminal; later wakes are ignored.

        Raises:
            InvalidArgument: `outcome` is not an outcome, its JSON is not JSON, or `diverged` is
                not a non-empty str of at most `arguments.MAX_DETAIL_LENGTH` characters.
        """

    @abc.abstractmethod
    def acknowledge_and_claim(self, acknowledgements: Sequence[tuple[ExecutionLease, Outcome]], *, limit: int,
                              duration: int, now: Optional[int] = None,
                              workflows: Optional[Collection[str]] = None
                              ) -> tuple[list[Outcome | LeaseLost], list[ExecutionLease]]:
        """Group commit: every `(lease, outcome)` acknowledged as by `acknowledge`, then up to
        `limit` executions (of `workflows`, as `claim_due` filters them) claimed as by
        `claim_due`, in one transaction with one commit.

        Each acknowledgement is fenced by its own token: a stale one is `LeaseLost` in its place
        in the replies and changes nothing, while the others are applied. Returns the replies, in
        the order given, and the new leases. Bad input raises before anything is written.
        """

    @abc.abstractmethod
    def acknowledge_and_claim_deliveries(self, acknowledgements: Sequence[tuple[ExecutionLease, Outcome]], *,
                                         limit: int, duration: int, now: Optional[int] = None,
                                         workflows: Optional[Collection[str]] = None
                                         ) -> tuple[list[Outcome | LeaseLost], list[Claimed]]:
        """`acknowledge_and_claim`, with each new lease as `claim_deliveries` gives it."""

    @abc.abstractmethod
    def next_ready_at(self, *, workflows: Optional[Collection[str]] = None) -> Optional[int]:
        """The earliest time any execution (of `workflows`, when given, as `claim_due` filters
        them) may become claimable, or None."""

    @abc.abstractmethod
    def history(self, execution_id: str, *, now: Optional[int] = None) -> list[LeaseRecord]:
        """Every delivery of the execution, oldest first, as of `now`."""

    @abc.abstractmethod
    def list(self, *, status: Optional[str] = None, workflow: Optional[str] = None, since: Optional[int] = None,
             until: Optional[int] = None, id_prefix: Optional[str] = None, limit: Optional[int] = None,
             offset: int = 0, now: Optional[int] = None) -> list[ExecutionRecord]:
        """Executions newest first (by `created_at`), optionally only those whose status as of
        `now` is `status`, of one workflow, created in `[since, until)`, whose id starts with
        `id_prefix`; the first `offset` matches skipped, at most `limit` returned."""

    @abc.abstractmethod
    def await_outcome(self, execution_id: str, waiter: str) -> ExecutionRecord:
        """Unfenced: the record of `execution_id`; unless it is terminal, `waiter` is registered
        (in the same transaction) to be woken when it becomes so.

        Raises:
            UnknownExecution: either id was never admitted.
        """

    @abc.abstractmethod
    def ended(self, leases: list[ExecutionLease], *, now: Optional[int] = None) -> list[ExecutionLease]:
        """Of `leases`, those whose delivery has ended (acknowledged, released, cancelled, or
        claimed again after expiry): their holders should stop. A read; nothing changes."""

    # -- operators (SPEC section 8) ----------------------------------------------------------

    @abc.abstractmethod
    def cancel(self, execution_id: str, *, reason: Optional[str] = None, now: Optional[int] = None
               ) -> ExecutionRecord:
        """Make the execution terminal as `cancelled`, `error_json` = `{"type": "Cancelled",
        "message": reason}`. A live delivery ends in the same transaction: its holder's later
        fenced writes, renewals and acknowledgement return `LeaseLost`. Its waiters are woken.
        A terminal execution (cancelled, completed or failed) is returned unchanged.

        Raises:
            UnknownExecution: the id was never admitted.
        """

    @abc.abstractmethod
    def resume(self, execution_id: str, *, now: Optional[int] = None) -> ExecutionRecord:
        """A failed or cancelled execution becomes `admitted`, due at `now`, with no result or
        error and no unacknowledged deliveries; one admitted with a timeout has its deadline at
        `now` + that timeout. Its recorded steps are kept, so a replay goes on after the last one;
        if that step recorded a final error, it is tried again.

        A parked execution (see `acknowledge`) stays `suspended` and becomes due at `now`, parked
        no more, as `unpark` would make it.

        Raises:
            UnknownExecution: the id was never admitted.
            ExecutionConflict: the execution is neither failed, cancelled nor parked (names its
                status): an admitted, running, completed or suspended but not parked one.
        """

    @abc.abstractmethod
    def fork(self, execution_id: str, new_id: str, *, from_step: str, trace_context: Optional[str] = None,
             now: Optional[int] = None) -> ExecutionRecord:
        """SPEC section 14: admit `new_id`, an execution of the same workflow and input, in the same
        queue, with the same key, priority and timeout (its deadline `now` + that timeout), due at
        `now`, whose recorded steps are copies of the original's up to, not including, step
        `from_step`: every step row recorded before the first row of `from_step`, in recording
        order, each attempt as stored. Its first delivery replays them and runs on from there.
        The original, whatever its status, is unchanged. The original's events that no step from
        `from_step` on set are copied too; its messages, lease history and waits are not
        (`tables.forks` says why). `trace_context`: as `admit`'s. All in one transaction.

        Not idempotent by `new_id`: a fork is a new execution, and an id already taken is refused,
        even one an earlier fork of the same step took. A refused fork writes nothing.

        Raises:
            UnknownExecution: `execution_id` was never admitted.
            UnknownStep: `from_step` is not a recorded step of it (the message lists its steps).
            ExecutionConflict: `new_id` is taken.
        """

    @abc.abstractmethod
    def unpark(self, workflows: Collection[str], *, now: Optional[int] = None) -> int:
        """Every parked execution of `workflows` becomes due at `now` and parked no more (its
        `code` registration removed), in one transaction; returns how many. A supervisor calls it
        when it starts, for the workflows it serves: its code may be the fix. Executions of other
        workflows are left as they are.

        Raises:
            InvalidArgument: `workflows` is a str or not a collection, or a name in it is not a
                valid workflow name; nothing is changed then.
        """

    @abc.abstractmethod
    def purge(self, *, before: int, statuses=TERMINAL_STATUSES, now: Optional[int] = None,
              dry_run: bool = False) -> int:
        """Delete terminal executions in `statuses` whose `updated_at < before`, with everything
        that is only theirs, in short batches; returns how many (with `dry_run`: how many would
        be). Never a non-terminal execution, nor one a waiting execution waits for; effects and
        stores, shared by identity, are kept.

        Raises:
            InvalidArgument: a status in `statuses` is not terminal.
        """

    @abc.abstractmethod
    def waiting_for(self, execution_id: str, *, now: Optional[int] = None) -> list[WaitReason]:
        """Why an admitted or suspended execution is not running (see `WaitReason`); empty for
        a running or terminal one.

        Raises:
            UnknownExecution: the id was never admitted.
        """

    @abc.abstractmethod
    def stats(self, *, now: Optional[int] = None, limit: int = 20) -> LedgerStats:
        """A summary for operators, read in one transaction (see `LedgerStats`)."""


class HeapClient(abc.ABC):
    @abc.abstractmethod
    def read_step(self, execution_id: str, step_key: str) -> Optional[HeapRecord]:
        """The highest attempt recorded for the step, or None."""

    @abc.abstractmethod
    def write_step(self, lease: ExecutionLease, *, step_key: str, step_attempt: int, done: bool,
                   step_response_json: str) -> HeapRecord | LeaseLost:
        """Fenced: record one attempt of a step, in one transaction with the token check.

        Accepted only if the lease's token is current and its delivery has not ended; a
        rejected write changes nothing and returns `LeaseLost`. Idempotent for the current
        holder: an attempt already recorded is returned unchanged, and the caller must continue
        with the recorded value.
        """

    @abc.abstractmethod
    def write_steps(self, writes: Sequence[StepWrite]) -> list[HeapRecord | LeaseLost]:
        """Fenced, each write by its own lease's token: `write_step` for every write of `writes`
        (of any executions), all in one transaction with one commit; the replies in the order of
        `writes`. A write whose token is stale, or whose delivery has ended, is refused alone
        (`LeaseLost`, nothing of it written); the others are written all the same. Idempotent
        as `write_step`: an attempt already recorded (before, or by an earlier write of the same
        batch) is returned as recorded.

        On PostgreSQL the fence share-locks the executions' rows, as `write_step` does (a claim or
        an acknowledgement that moves a token waits for the batch, or the batch for it; two
        batches never wait for each other on them), in the order of their ids; the batch is one
        statement when every write is new (up to 500 writes): a round trip for it, with the
        transaction's begin and commit.

        Raises:
            InvalidArgument: a write that is not a `StepWrite`, or any of its fields as
                `write_step` would refuse it; nothing is written then.
        """

    @abc.abstractmethod
    def steps(self, execution_id: str) -> list[HeapRecord]:
        """Every recorded attempt of every step of one execution, in the order written."""


class WorkflowStartClient(abc.ABC):
    @abc.abstractmethod
    def start(self, start_request_id: str, workflow: str, input_json: str = "null", *,
              parent: Optional[str] = None, trace_context: Optional[str] = None) -> str:
        """Idempotent by receipt: admit an execution for this start request and return its id.

        Repeating the same start-request id starts nothing and returns the first target.
        `parent`, the starting execution, is recorded so that `purge` keeps a child while its
        parent may still wait for it. `trace_context`: as `ExecutionClient.admit`'s (the
        starting delivery's span, so that the child's deliveries join the parent's trace)."""


class EffectClient(abc.ABC):
    @abc.abstractmethod
    def get(self, effect_id: str) -> Optional[EffectState]:
        """The effect's state, or None if nobody began or settled it."""

    @abc.abstractmethod
    def begin(self, effect_id: str) -> EffectState:
        """Idempotent by identity: create the effect as pending, or return its current state."""

    @abc.abstractmethod
    def settle(self, effect_id: str, result_json: str) -> EffectState | SettleConflict:
        """Keep the first result; wake the executions waiting on the effect. A different later
        result returns `SettleConflict` and is not applied; the same one returns the state."""

    @abc.abstractmethod
    def wait(self, effect_id: str, execution_id: str) -> EffectState:
        """Unfenced: register `execution_id` to be woken when the effect settles (unless it
        already has), and return the effect's state."""


class StoreClient(abc.ABC):
    @abc.abstractmethod
    def get(self, name: str) -> Optional[StoreState]:
        """The store's state and version, or None."""

    @abc.abstractmethod
    def list(self) -> list[StoreState]:
        """Every store, by name."""

    @abc.abstractmethod
    def get_or_create(self, name: str, initial_json: str) -> StoreState:
        """Idempotent by identity: one initial state per store name; later calls find the store."""

    @abc.abstractmethod
    def change(self, name: str, *, execution_id: str, step_key: str,
               change: Callable[[Any], tuple[Any, Any]]) -> Optional[StoreReceipt]:
        """Idempotent by receipt: apply `change(state) -> (new_state, result)` and record the
        result under (store, execution, step key), in one transaction. If the receipt exists,
        nothing is applied and the recorded result is returned (`applied=False`). A change that
        raises `NoMatch` commits nothing and returns None. Wakes the store's waiters.

        Raises:
            InvalidArgument: the store does not exist (create it with `get_or_create` first).
            Anything else `change` raises, unchanged; nothing was committed.
        """

    @abc.abstractmethod
    def put(self, name: str, item_json: str) -> StoreState:
        """From outside: append an item to a list store, creating it empty when missing."""

    @abc.abstractmethod
    def set(self, name: str, state_json: str) -> StoreState:
        """From outside: replace the store's state, creating it when missing."""

    @abc.abstractmethod
    def wait(self, name: str, execution_id: str, seen_version: int, *, match_json: Optional[str] = None) -> bool:
        """Unfenced: register to be woken by the store's next change; True (and nothing
        registered) if the store already changed after `seen_version`. `match_json`, the JSON
        of what a `take` looks for, is kept for operators (`waiting_for`)."""


class MessageClient(abc.ABC):
    """Messages sent to an execution from outside (SPEC section 14): kept in the order they were
    sent per (execution, topic), each taken by exactly one `recv` step."""

    @abc.abstractmethod
    def send(self, execution_id: str, message_json: str, *, topic: str = "default",
             message_id: str) -> tuple[Message, bool]:
        """Append a message to the execution's topic and wake the execution if it waits for one,
        in one transaction. Idempotent by (execution, `message_id`): a repeat adds nothing and
        returns the message first sent. Returns the message and whether this call added it.

        Raises:
            UnknownExecution: no execution has that id.
            ExecutionConflict: the execution is terminal: nothing will ever take the message.
            InvalidArgument: a topic or id empty or too long, a text that is not JSON.
            PayloadTooLarge: the message is above the payload limit.
        """

    @abc.abstractmethod
    def take(self, lease: ExecutionLease, topic: str, *, step_key: str) -> Optional[Message] | LeaseLost:
        """Fenced: take the topic's oldest pending message for the lease's step `step_key`, in one
        transaction with the fencing check. Idempotent by step: if `step_key` took a message
        already, that one is returned again (to a replay, or to a later holder), and no other.
        None if the topic holds no pending message."""

    @abc.abstractmethod
    def wait(self, execution_id: str, topic: str) -> bool:
        """Unfenced: register `execution_id` to be woken by the next message sent to it; True
        (and nothing registered) if the topic holds a pending message already."""

    @abc.abstractmethod
    def pending(self, execution_id: str) -> dict[str, int]:
        """How many messages wait to be taken, by topic."""

    @abc.abstractmethod
    def list(self, execution_id: str) -> list[Message]:
        """Every message of the execution, taken or pending, in the order they were sent."""


class EventClient(abc.ABC):
    """Values an execution publishes under keys (SPEC section 14); the last one set is kept."""

    @abc.abstractmethod
    def set(self, lease: ExecutionLease, key: str, value_json: str) -> Event | LeaseLost:
        """Fenced: set the event `key` of the lease's execution to `value_json`, and tell the
        clients waiting for it (the announcement an outcome makes) once committed."""

    @abc.abstractmethod
    def get(self, execution_id: str, key: str) -> Optional[Event]:
        """The event's latest value, or None if it was never set."""

    @abc.abstractmethod
    def list(self, execution_id: str) -> list[Event]:
        """Every event of the execution, by key."""


class SupervisorClient(abc.ABC):
    """The live supervisors (SPEC section 11): a registration each running supervisor keeps
    fresh. Unfenced: a hint for operators and for "is this workflow served", which nothing that
    decides whose writes count reads."""

    @abc.abstractmethod
    def register(self, supervisor_id: str, *, host: str, pid: int, workflows: Collection[str], concurrency: int,
                 workers: int, renew_ms: int, started_at: Optional[int] = None, now: Optional[int] = None
                 ) -> SupervisorRecord:
        """Record (or update) the supervisor `supervisor_id`, seen at `now`, serving `workflows`
        (an empty collection: none), renewing every `renew_ms`; `started_at` defaults to `now`
        and is kept when the row exists. In the same transaction, drops the rows of supervisors
        no longer live.

        Raises:
            InvalidArgument: a bad id, host, pid, workflow name or count.
        """

    @abc.abstractmethod
    def seen(self, supervisor_id: str, *, now: Optional[int] = None) -> bool:
        """One statement: `last_seen_at = now`. False when the row is gone (dropped once it was no
        longer live, e.g. after a pause): the supervisor registers again."""

    @abc.abstractmethod
    def remove(self, supervisor_id: str) -> None:
        """Remove the registration (a clean exit); nothing when there is none."""

    @abc.abstractmethod
    def live(self, *, now: Optional[int] = None) -> list[SupervisorRecord]:
        """The supervisors live at `now` (seen within `LIVE_INTERVALS` of their own renewal
        intervals), oldest first."""

    @abc.abstractmethod
    def served(self, *, now: Optional[int] = None) -> set[str]:
        """The workflows some live supervisor serves at `now`."""


class ScheduleClient(abc.ABC):
    """The workflows' schedules (SPEC section 12): per schedule the last tick admitted and the next
    one, kept by every supervisor that serves it. Each tick is admitted once across them all, and
    never again once admitted, even after its execution was purged."""

    @abc.abstractmethod
    def admit_due(self, schedules: Collection[Schedule], *, now: Optional[int] = None) -> list[ScheduleRecord]:
        """For each schedule (in order): record it when new (its first tick is the first at or after
        `now`: a new schedule has missed nothing), and when its next tick is due (`<= now`), admit
        the **latest** tick at or before `now` (the ticks missed meanwhile are skipped) as the
        execution `tick_id(workflow, tick)` with input `{"scheduled_at": tick_text(tick)}`, and
        advance `last_tick`/`next_tick`, in one transaction with a compare-and-set on the next
        tick: of several callers that race, one admits it and the others find it admitted. A
        changed spec (the app's schedule was edited) replaces the stored one and its next tick.
        Returns each schedule's record as of the call (`admitted` set where this call admitted).

        Raises:
            InvalidArgument: not a collection of `Schedule` values.
        """

    @abc.abstractmethod
    def forget(self, workflows: Collection[str]) -> int:
        """Remove the schedules of `workflows` (those their app no longer schedules: a supervisor
        that starts serving them says so, the latest start winning, as for queue limits); how
        many there were. A supervisor still running an app that schedules one records it again,
        as new, at its next tick. Raises `InvalidArgument` for what is not a collection of names."""

    @abc.abstractmethod
    def list(self) -> list[ScheduleRecord]:
        """Every recorded schedule, by name."""


class QueueClient(abc.ABC):
    """Queue limits (SPEC section 12), which every claim checks in its own transaction, and each
    workflow's default queue, priority and timeout, as the app that serves it declares them."""

    @abc.abstractmethod
    def declare(self, name: str, *, concurrency: Optional[int] = None, per_key: Optional[int] = None,
                rate: Optional[tuple[int, float]] = None, now: Optional[int] = None) -> None:
        """Set the limits of queue `name` (replacing any it had; none at all: unlimited).
        `concurrency`: live leases of the queue at most; `per_key`: live leases per key at most;
        `rate`: (count, seconds), claims in any window of `seconds` at most.

        Raises:
            InvalidArgument: a bad name, a limit not an int >= 1, a rate not (count >= 1, seconds > 0).
        """

    @abc.abstractmethod
    def record_defaults(self, defaults: dict[str, tuple], *, now: Optional[int] = None) -> None:
        """Record each workflow's default (queue, priority) or (queue, priority, timeout_ms)
        (timeout_ms None, or left out: no timeout), the latest record winning; the executions
        admitted before any record, that left their queue or priority to the defaults, take them
        now (those a live lease holds at the next record). Child starts and schedule ticks take
        the timeout; a client's start takes it when it names none."""

    @abc.abstractmethod
    def defaults_of(self, workflow: str) -> tuple[str, int]:
        """The workflow's recorded default (queue, priority); ("default", 0) when none was recorded."""

    @abc.abstractmethod
    def timeout_of(self, workflow: str) -> Optional[int]:
        """The workflow's recorded default timeout in ms; None when it has none, or none was recorded."""

    @abc.abstractmethod
    def list(self, *, now: Optional[int] = None) -> list[QueueRecord]:
        """Every queue with limits or executions (and `default`), by name, with its limits and its
        due, running and waiting counts at `now`."""


class Backend(abc.ABC):
    """The ledger as a backend opens it (`open_backend`): what everything above the ledger calls,
    and all it may know of the database it runs on. Nothing above the ledger asks which database
    that is; where the two differ, a backend answers one of the questions below.

    Attributes:
        executions, heap, starts, effects, stores, messages, events, supervisors, schedules: the table clients (the
            interfaces above).
        clock: `() -> int` ms, the time the backend's calls take when given no `now`.
        path: what the ledger was opened from, as given (a file's path, or a URI).
        max_payload_bytes: the size limit, in bytes of UTF-8 JSON, of each payload this backend
            writes (an input, a step's response, a result or error, a store's value, an effect's
            result, a match, a cancel's reason): a larger one raises `PayloadTooLarge`, and
            nothing is written. The SDK checks against it before writing, to name what a
            workflow made too large (`worker.context`, `worker._runtime.driver`).

    Usable as a context manager; `close()` closes it.
    """

    executions: ExecutionClient
    heap: HeapClient
    starts: WorkflowStartClient
    effects: EffectClient
    stores: StoreClient
    messages: MessageClient
    events: EventClient
    supervisors: SupervisorClient
    schedules: ScheduleClient
    queues: QueueClient
    clock: Callable[[], int]
    path: str
    max_payload_bytes: int

    @abc.abstractmethod
    def listen_for_due(self) -> DueListener:
        """A listener told when work becomes due, by any process; the caller closes it."""

    @abc.abstractmethod
    def listen_for_outcomes(self) -> OutcomeListener:
        """A listener told which executions ended, by any process; the caller closes it."""

    @abc.abstractmethod
    def spot_twin(self) -> Optional["Backend"]:
        """Another backend on the same ledger for calls made on the spot, by a loop that must not
        wait (`supervisor.ledger_calls`): one that gives up at once instead of waiting for the
        database, and whose commits neither cross a network nor sync the disk. None where no such
        backend can be had (on a database server every commit is a round trip). The caller
        closes it."""

    @abc.abstractmethod
    def check_files(self) -> None:
        """The still-mine check: raise `LedgerGone` if what this backend opened is no longer the
        ledger there (SQLite: the file, its -wal or its -shm was deleted or replaced); the message
        names what and says what to do. It takes no lock, never waits for the database, and may
        be called from any thread (a supervisor's loop calls it once a second). A backend on a
        database server checks which server it reached on each new session instead, and does
        nothing here."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
