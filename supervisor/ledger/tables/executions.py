"""Executions and their leases on SQLite: every statement for `executions` and `lease_history`.

How a row is stored versus how it reads:

- `status = 'running'` means a delivery with the current `token` has not ended by a release,
  an acknowledgement or a later claim. Its lease is *live* only while `lease_expires_at > now`.
  Expiry is never written when it happens (nothing runs then); every reader works out the row
  "as of now" instead (`_as_of`), and the next claim records it in the lease history.
- `ready_at` is the earliest time the row may be claimed, kept up to date by every write:
  due time, redelivery delay and, for a running row, lease expiry folded into one column so
  that `claim_due` is a single index range scan. NULL means never (terminal or not due).
"""

from __future__ import annotations

import functools
import json
import os
import socket
from typing import Callable, Optional

from .. import arguments
from ..connection import Connection, Transaction
from ..contract import ExecutionClient
from ..errors import ExecutionConflict, UnknownExecution
from ..values import (
    Claimed,
    Completed,
    DeliveryEnd,
    ExecutionLease,
    ExecutionRecord,
    ExecutionStatus,
    Failed,
    HeapRecord,
    LeaseLost,
    LeaseRecord,
    LedgerStats,
    LiveLease,
    Outcome,
    Released,
    Renewed,
    Suspended,
    WaitReason,
)
from . import waiters
from .epochs import FLOOR
from .execution_rows import COLUMNS, INSERT, SELECT_ONE, SELECT_ONE_LOCKED

RUNNING = ExecutionStatus.RUNNING.value
ADMITTED = ExecutionStatus.ADMITTED.value
SUSPENDED = ExecutionStatus.SUSPENDED.value
CANCELLED = ExecutionStatus.CANCELLED.value
FAILED = ExecutionStatus.FAILED.value
TERMINAL = (ExecutionStatus.COMPLETED.value, FAILED, CANCELLED)
RESUMABLE = (FAILED, CANCELLED)
# How many executions one purge transaction deletes: small enough that each holds the write lock
# for a few ms, so supervisors sharing the file barely notice a purge of millions.
PURGE_BATCH = 100
LIST_PAGE = 500  # rows `list` reads at a time, as a stored status may not be the status as of now

# Waiting executions that are due, earliest first; ties come out in rowid (admission) order, as
# the index stores them. Those still in their redelivery delay are stepped over.
# Claimable rows: due executions not running, earliest due first, and running ones whose lease
# expired and whose redelivery delay has passed (all of them: as many as the leases dead holders
# left behind), to be ordered by due_at with the others. One statement, one round trip; `{lock}`
# is where each half takes its row locks (`claimable`).
_CLAIMABLE = f"""
SELECT * FROM (
    SELECT {COLUMNS} FROM executions INDEXED BY executions_claimable
    WHERE ready_at IS NOT NULL AND status <> 'running' AND due_at <= ? AND ready_at <= ?
    ORDER BY due_at LIMIT ?{{lock}}) AS due
UNION ALL
SELECT * FROM (
    SELECT {COLUMNS} FROM executions INDEXED BY executions_expiring
    WHERE status = 'running' AND ready_at <= ?{{lock}}) AS expired"""
NEXT_READY = "SELECT min(ready_at) FROM executions WHERE ready_at IS NOT NULL"
# An execution's row, then its recorded steps in write order, in one statement (one round trip,
# one snapshot): each part's columns are NULL in the other's rows, so the row's input is sent
# once, not once per step.
_NO_EXECUTION = ", ".join(["NULL"] * len(COLUMNS.split(",")))
WITH_STEPS = f"""
SELECT * FROM (
    SELECT 0 AS part, 0 AS seq, {COLUMNS}, NULL AS step_key, NULL AS attempt, NULL AS done,
        NULL AS step_response_json
    FROM executions WHERE execution_id = ?
    UNION ALL
    SELECT 1, rowid, {_NO_EXECUTION}, step_key, attempt, done, step_response_json
    FROM steps WHERE execution_id = ?) AS delivery
ORDER BY part, seq"""
SKIP_LOCKED = " /*FOR UPDATE SKIP LOCKED*/"
CLAIMABLE = _CLAIMABLE.format(lock="")
CLAIMABLE_LOCKED = _CLAIMABLE.format(lock=SKIP_LOCKED)

CLAIM = """
UPDATE executions SET token = token + 1, status = 'running', lease_expires_at = ?,
    unacknowledged_deliveries = ?, delivery_ended_at = ?, wake_during_lease = NULL,
    ready_at = ?, updated_at = ?
WHERE execution_id = ?"""

# The fence is the WHERE clause: current token, delivery not ended.
RENEW = """
UPDATE executions SET lease_expires_at = ?, ready_at = ? + yieldstar_delay(unacknowledged_deliveries + 1),
    updated_at = ?
WHERE execution_id = ? AND token = ? AND status = 'running'"""

RELEASE = """
UPDATE executions SET status = CASE ever_suspended WHEN 1 THEN 'suspended' ELSE 'admitted' END,
    lease_expires_at = NULL, unacknowledged_deliveries = unacknowledged_deliveries + 1,
    delivery_ended_at = ?, wake_during_lease = NULL,
    ready_at = yieldstar_max(due_at, ? + yieldstar_delay(unacknowledged_deliveries + 1)),
    updated_at = ?
WHERE execution_id = ? AND token = ? AND status = 'running'"""

ACKNOWLEDGE_SUSPENDED = """
UPDATE executions SET status = 'suspended', ever_suspended = 1, lease_expires_at = NULL,
    unacknowledged_deliveries = 0, delivery_ended_at = NULL, due_at = wake_during_lease,
    ready_at = wake_during_lease, wake_during_lease = NULL, updated_at = ?
WHERE execution_id = ? AND token = ? AND status = 'running'"""

ACKNOWLEDGE_TERMINAL = """
UPDATE executions SET status = ?, result_json = ?, error_json = ?, lease_expires_at = NULL,
    unacknowledged_deliveries = 0, delivery_ended_at = NULL, due_at = NULL, ready_at = NULL,
    wake_during_lease = NULL, updated_at = ?
WHERE execution_id = ? AND token = ? AND status = 'running'"""

WAKE = """
UPDATE executions SET due_at = ?, wake_during_lease = ?, ready_at = ?, updated_at = ?
WHERE execution_id = ?"""

# The deliveries a claim opened, one row each, in one statement (a round trip for all of them):
# `{rows}` is "(?, ?, ?, ?, ?)" once per lease (`history_open`), at most HISTORY_OPEN_ROWS, well
# within either database's limit on parameters.
HISTORY_OPEN = """
INSERT INTO lease_history (execution_id, token, holder, claimed_at, expires_at)
VALUES {rows}"""
HISTORY_OPEN_ROWS = 64

HISTORY_CLOSE = """
UPDATE lease_history SET ended_at = ?, ended_by = ?, outcome = ?, expires_at = ?
WHERE execution_id = ? AND token = ?"""

# The history keeps the lease's expiry as the lease moves, so ending a delivery needs no look
# at the execution row first (HISTORY_END).
HISTORY_RENEWED = """
UPDATE lease_history SET renewals = renewals + 1, expires_at = ? WHERE execution_id = ? AND token = ?"""

# `{deliveries}`: "(execution_id = ? AND token = ?)" once per delivery ended the same way, joined
# by OR, at most HISTORY_END_ROWS (`history_end`): a batch of acknowledgements ends its
# deliveries in one statement.
HISTORY_END = "UPDATE lease_history SET ended_at = ?, ended_by = ?, outcome = ? WHERE {deliveries}"
HISTORY_END_ROWS = 64

HISTORY = """
SELECT h.execution_id, h.token, h.holder, h.claimed_at,
    CASE WHEN h.ended_by IS NULL AND e.token = h.token THEN e.lease_expires_at ELSE h.expires_at END,
    h.renewals, h.ended_at, h.ended_by, h.outcome
FROM lease_history h JOIN executions e USING (execution_id)
WHERE h.execution_id = ? ORDER BY h.token"""


CANCEL = """
UPDATE executions SET status = 'cancelled', result_json = NULL, error_json = ?, lease_expires_at = NULL,
    due_at = NULL, ready_at = NULL, wake_during_lease = NULL, updated_at = ?
WHERE execution_id = ?"""

# A resumed execution's token moves up to the current epoch's floor, if a restore or a failover
# raised the epoch while it was terminal (see `epochs`).
RESUME = f"""
UPDATE executions SET status = 'admitted', ever_suspended = 0, result_json = NULL, error_json = NULL,
    lease_expires_at = NULL, unacknowledged_deliveries = 0, delivery_ended_at = NULL, wake_during_lease = NULL,
    due_at = ?, ready_at = ?, updated_at = ?, token = yieldstar_max(token, {FLOOR})
WHERE execution_id = ?"""
# The step a failed run ended on: the last one written. If it recorded a final error, resume
# opens it again (done = 0, no retry time), so the replay runs that step once more instead of
# raising the old error: fix the bug, then resume.
LAST_STEP = "SELECT rowid, done, step_response_json FROM steps WHERE execution_id = ? ORDER BY rowid DESC LIMIT 1"
REOPEN_STEP = "UPDATE steps SET done = 0 WHERE rowid = ?"

# The next batch after (updated_at, rowid), in the index's own order: kept rows are stepped over.
PURGEABLE = """
SELECT execution_id, updated_at, rowid FROM executions INDEXED BY executions_by_update
WHERE status = ? AND updated_at < ? AND (updated_at, rowid) > (?, ?) ORDER BY updated_at, rowid LIMIT ?"""
PURGE = (
    "DELETE FROM steps WHERE execution_id = ?",
    "DELETE FROM lease_history WHERE execution_id = ?",
    "DELETE FROM store_receipts WHERE execution_id = ?",
    "DELETE FROM waiters WHERE waiter = ?",
    "DELETE FROM waiters WHERE kind = 'execution' AND target = ?",
    "DELETE FROM starts WHERE execution_id = ?",
    "DELETE FROM executions WHERE execution_id = ?",
)
# A child execution whose parent is not terminal: the parent may still wait for its outcome.
AWAITED = """
SELECT 1 FROM starts s JOIN executions p ON p.execution_id = s.parent
WHERE s.execution_id = ? AND p.status NOT IN ('completed', 'failed', 'cancelled') LIMIT 1"""

# Stored statuses read as of now: a running row whose lease ran out reads admitted or suspended.
STATUS_AS_OF = """CASE WHEN status = 'running' AND lease_expires_at <= :now
    THEN CASE ever_suspended WHEN 1 THEN 'suspended' ELSE 'admitted' END ELSE status END"""
COUNTS = f"SELECT workflow, {STATUS_AS_OF} AS st, count(*) FROM executions GROUP BY workflow, st"
UNACKNOWLEDGED = f"""
SELECT {COLUMNS} FROM executions
WHERE status NOT IN ('completed', 'failed', 'cancelled')
    AND (unacknowledged_deliveries > 0 OR (status = 'running' AND lease_expires_at <= :now))"""
LIVE = """
SELECT e.execution_id, e.workflow, e.token, h.holder, h.claimed_at, e.lease_expires_at, h.renewals
FROM executions e INDEXED BY executions_expiring
JOIN lease_history h ON h.execution_id = e.execution_id AND h.token = e.token
WHERE e.status = 'running' AND e.lease_expires_at > :now ORDER BY e.lease_expires_at"""
DELIVERIES = "SELECT count(*) FROM lease_history"

CURRENT_TOKENS = "SELECT execution_id, token, status FROM executions WHERE execution_id IN ({})"


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class _Row:
    """A stored executions row, by column name."""

    __slots__ = COLUMNS.replace(",", " ").split()

    def __init__(self, row: tuple):
        for name, value in zip(self.__slots__, row):
            setattr(self, name, value)


def renewal_lock_wait_ms(duration: int) -> int:
    """How long a renewal waits for its execution's row lock (on PostgreSQL) before failing as
    busy: a tenth of the lease, between 50 ms and a second. A row held longer is held by a
    transaction that is stuck (a host cut off mid-transaction holds its locks until the link
    heals), and a supervisor renews its leases one after another: every other lease must not
    wait behind the one stuck row, and lose its lease for it. The stuck one is renewed again at
    the next round."""
    return max(50, min(1000, duration // 10))


class ExecutionTable(ExecutionClient):
    def __init__(self, conn: Connection, clock: Callable[[], int], delay: Callable[[int], int],
                 on_due: Callable[[], None] = lambda: None, on_ended: Callable[[list[str]], None] = lambda ids: None,
                 one_clock: bool = False):
        """`one_clock`: the processes' clocks are estimates of one clock, each a little behind it
        (by its own amount). A claim, a wake and a resume then stamp no time before the row's last
        change (which another process may have stamped a millisecond ahead of this one's
        estimate: `_stamp`), so that an execution's lease history reads in the order of its
        commits: a delivery that ended, then the claim that followed it, even with a wake from a
        process behind between them."""
        self._conn = conn
        self._one_clock = one_clock
        self._on_due = on_due  # told after a commit that may have made an execution due
        self._on_ended = on_ended  # told the ids after a commit that made executions terminal
        self._clock = clock
        self._delay = delay
        self._holder = _holder()
        self._last_claim_found = False  # whether the last claim made here claimed anything

    # -- helpers -----------------------------------------------------------------------------

    def _now(self, now: Optional[int]) -> int:
        if now is None:
            return self._clock()
        return arguments.integer("now", now)

    def _now_locked(self, now: Optional[int], checked: int) -> int:
        """The time of a write, read again once the write lock is held when the caller gave
        none: a call that waited for the lock must not record a time from before it got it
        (the lease history's order would then disagree with the commit order)."""
        return checked if now is not None else self._clock()

    def _stamp(self, row: _Row, now: int) -> int:
        """The time a change of `row` made at `now` records: with `one_clock`, never before the
        row's last change, so that `updated_at` never moves back."""
        return max(now, row.updated_at) if self._one_clock else now

    def _lease(self, lease: object) -> ExecutionLease:
        if not isinstance(lease, ExecutionLease):
            raise arguments.InvalidArgument(f"lease must be an ExecutionLease, not {type(lease).__name__}")
        token = lease.token
        if not isinstance(lease.execution_id, str) or type(token) is not int or not -2**63 <= token < 2**63:
            raise arguments.InvalidArgument(f"lease must hold a str execution_id and a 64-bit int token, not {lease!r}")
        return lease

    def _as_of(self, row: _Row, now: int) -> ExecutionRecord:
        status, unacked, expires = row.status, row.unacknowledged_deliveries, row.lease_expires_at
        if status == RUNNING and expires <= now:
            # The lease ran out: the delivery counts as unacknowledged. The wakes it covered are
            # still owed: request_wake already folded them into due_at.
            status = SUSPENDED if row.ever_suspended else ADMITTED
            unacked += 1
        return ExecutionRecord(
            execution_id=row.execution_id,
            workflow=row.workflow,
            input_json=row.input_json,
            status=status,
            token=row.token,
            due_at=row.due_at,
            lease_expires_at=expires if status == RUNNING else None,
            unacknowledged_deliveries=unacked,
            result_json=row.result_json,
            error_json=row.error_json,
            created_at=row.created_at,
            updated_at=row.updated_at,
        )

    def _ready_at(self, due: Optional[int], unacked: int, ended_at: Optional[int]) -> Optional[int]:
        """When a row with no open delivery becomes claimable."""
        if due is None:
            return None
        if unacked == 0:
            return due
        return max(due, ended_at + self._delay(unacked))

    # -- ExecutionClient ---------------------------------------------------------------------

    def admit(self, execution_id, workflow, input_json="null", *, now=None) -> ExecutionRecord:
        arguments.identifier("execution_id", execution_id)
        arguments.identifier("workflow", workflow)
        arguments.json_text("input_json", input_json)
        now = self._now(now)
        with self._conn.write() as db:
            created = db.execute(INSERT, (execution_id, workflow, input_json, now, now, now, now)).rowcount == 1
            found = db.execute(SELECT_ONE, (execution_id,)).fetchone()
        if created:
            self._on_due()
        row = _Row(found)
        if row.workflow != workflow or arguments.canonical_json(row.input_json) != arguments.canonical_json(
            input_json
        ):
            raise ExecutionConflict(
                f"execution_id {execution_id!r} was already admitted with workflow {row.workflow!r} and"
                f" input {row.input_json}; refusing workflow {workflow!r} with input {input_json}"
            )
        return self._as_of(row, now)

    def get(self, execution_id, *, now=None) -> Optional[ExecutionRecord]:
        arguments.identifier("execution_id", execution_id)
        now = self._now(now)
        found = self._conn.execute(SELECT_ONE, (execution_id,)).fetchone()
        return None if found is None else self._as_of(_Row(found), now)

    def get_with_steps(self, execution_id, *, now=None) -> Optional[tuple[ExecutionRecord, list[HeapRecord]]]:
        arguments.identifier("execution_id", execution_id)
        now = self._now(now)
        found = self._conn.execute(WITH_STEPS, (execution_id, execution_id)).fetchall()
        if not found or found[0][0] != 0:
            return None
        steps = [HeapRecord(execution_id, key, attempt, bool(done), response)
                 for key, attempt, done, response in (row[-4:] for row in found[1:])]
        return self._as_of(_Row(found[0][2:-4]), now), steps

    def request_wake(self, execution_id, at, *, now=None) -> None:
        arguments.identifier("execution_id", execution_id)
        arguments.integer("at", at)
        now = self._now(now)
        with self._conn.write() as db:
            woken = self.wake_in(db, execution_id, at, now)
        if woken:
            self._on_due()

    def wake_in(self, db: Transaction, execution_id: str, at: int, now: int) -> bool:
        """`request_wake` inside a write transaction the caller holds; False for a terminal one."""
        found = db.execute(SELECT_ONE_LOCKED, (execution_id,)).fetchone()
        if found is None:
            raise UnknownExecution(f"execution_id {execution_id!r} is not admitted")
        row = _Row(found)
        if row.status in TERMINAL:
            return False
        due = at if row.due_at is None else min(row.due_at, at)
        if row.status == RUNNING:
            # Remembered for after this delivery: an acknowledged suspension makes it the due
            # time; a release or expiry leaves it owed in due_at. The lease (live, or expired
            # and waiting out its redelivery delay) still decides ready_at.
            wake = at if row.wake_during_lease is None else min(row.wake_during_lease, at)
            ready = row.lease_expires_at + self._delay(row.unacknowledged_deliveries + 1)
            db.execute(WAKE, (due, wake, max(due, ready), self._stamp(row, now), execution_id))
        else:
            ready = self._ready_at(due, row.unacknowledged_deliveries, row.delivery_ended_at)
            db.execute(WAKE, (due, None, ready, self._stamp(row, now), execution_id))
        return True

    def await_outcome(self, execution_id, waiter) -> ExecutionRecord:
        """Unfenced: the record of `execution_id`; unless it is terminal, `waiter` is registered
        to be woken when it becomes so (in the same transaction, so no outcome slips between)."""
        arguments.identifier("execution_id", execution_id)
        arguments.identifier("waiter", waiter)
        now = self._clock()
        with self._conn.write() as db:
            found = db.execute(SELECT_ONE_LOCKED, (execution_id,)).fetchone()
            if found is None:
                raise UnknownExecution(f"execution_id {execution_id!r} is not admitted")
            row = _Row(found)
            if row.status not in TERMINAL:
                waiters.register(db, waiters.EXECUTION, execution_id, waiter, now)
        return self._as_of(row, now)

    def _claimable(self, db, now: int, limit: int, *, lock: bool = False) -> list[_Row]:
        """Up to `limit` claimable rows, earliest due first; with `lock`, rows no other claimer
        holds (on PostgreSQL, each claimer skips the rows another has locked)."""
        found = db.execute(CLAIMABLE_LOCKED if lock else CLAIMABLE, (now, now, limit, now)).fetchall()
        return sorted((_Row(row) for row in found), key=lambda row: row.due_at)[:limit]

    def claim_due(self, *, limit, duration, now=None) -> list[ExecutionLease]:
        return [claimed.lease for claimed in self.claim_deliveries(limit=limit, duration=duration, now=now)]

    def claim_deliveries(self, *, limit, duration, now=None) -> list[Claimed]:
        arguments.integer("limit", limit, minimum=0)
        arguments.integer("duration", duration, minimum=1)
        given, now = now, self._now(now)
        if limit == 0:
            return []
        # Look before taking the write lock: an idle supervisor's empty poll then costs a read,
        # and does not queue behind (or hold up) other processes' writes. A backend with row
        # locks (PostgreSQL) has no such lock to spare: its claim skips the rows others hold.
        # Right after a claim that found work, more is likely: the look would only cost a read.
        if self._conn.whole_database_write_lock and not self._last_claim_found:
            with self._conn.read() as db:
                if not self._claimable(db, now, limit):
                    return []
        return self._acknowledge_and_claim([], given, limit=limit, duration=duration)[1]

    def _claim_in(self, db: Transaction, now: int, limit: int, duration: int) -> list[Claimed]:
        claimed, opened = [], []
        for row in self._claimable(db, now, limit, lock=True):
            at = self._stamp(row, now)
            unacked, ended_at = row.unacknowledged_deliveries, row.delivery_ended_at
            if row.status == RUNNING:
                # The previous delivery's lease expired; this claim supersedes it.
                unacked += 1
                ended_at = row.lease_expires_at
                db.execute(
                    HISTORY_CLOSE,
                    (ended_at, DeliveryEnd.SUPERSEDED.value, None, ended_at, row.execution_id, row.token),
                )
            token = row.token + 1
            expires = at + duration
            # A running row is always due (claimed when due; wakes only move due_at earlier),
            # so while the lease lasts its expiry plus the redelivery delay decides.
            ready = max(row.due_at, expires + self._delay(unacked + 1))
            db.execute(CLAIM, (expires, unacked, ended_at, ready, at, row.execution_id))
            opened.append((row.execution_id, token, self._holder, at, expires))
            claimed.append(Claimed(ExecutionLease(row.execution_id, token, expires), row.workflow,
                                   row.input_json if token == 1 else None))
        for start in range(0, len(opened), HISTORY_OPEN_ROWS):
            rows = opened[start:start + HISTORY_OPEN_ROWS]
            db.execute(history_open(len(rows)), [value for row in rows for value in row])
        return claimed

    def renew(self, lease, *, duration, now=None) -> Renewed | LeaseLost:
        lease = self._lease(lease)
        arguments.integer("duration", duration, minimum=1)
        given, now = now, self._now(now)
        with self._conn.write(lock_wait_ms=renewal_lock_wait_ms(duration)) as db:
            now = self._now_locked(given, now)
            expires = now + duration
            cursor = db.execute(RENEW, (expires, expires, now, lease.execution_id, lease.token))
            if cursor.rowcount != 1:
                return LeaseLost()
            db.execute(HISTORY_RENEWED, (expires, lease.execution_id, lease.token))
        return Renewed(ExecutionLease(lease.execution_id, lease.token, expires))

    def release(self, lease, *, now=None) -> Released | LeaseLost:
        lease = self._lease(lease)
        given, now = now, self._now(now)
        with self._conn.write() as db:
            now = self._now_locked(given, now)
            if not self._end(db, lease, now, DeliveryEnd.RELEASED, None, RELEASE, (now, now, now)):
                return LeaseLost()
        return Released()

    def acknowledge(self, lease, outcome: Outcome, *, now=None) -> Outcome | LeaseLost:
        (reply,), _ = self._acknowledge_and_claim([self._acknowledgement(lease, outcome)], now)
        return reply

    def acknowledge_and_claim(self, acknowledgements, *, limit, duration, now=None):
        replies, claimed = self.acknowledge_and_claim_deliveries(acknowledgements, limit=limit, duration=duration,
                                                                  now=now)
        return replies, [each.lease for each in claimed]

    def acknowledge_and_claim_deliveries(self, acknowledgements, *, limit, duration, now=None):
        if isinstance(acknowledgements, (str, bytes)) or not hasattr(acknowledgements, "__iter__"):
            raise arguments.InvalidArgument(
                f"acknowledgements must be a sequence of (lease, outcome) pairs, not {type(acknowledgements).__name__}")
        checked = []
        for i, pair in enumerate(acknowledgements):
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise arguments.InvalidArgument(f"acknowledgements[{i}] must be a (lease, outcome) pair, got {pair!r}")
            checked.append(self._acknowledgement(*pair))
        arguments.integer("limit", limit, minimum=0)
        arguments.integer("duration", duration, minimum=1)
        return self._acknowledge_and_claim(checked, now, limit=limit, duration=duration)

    def _acknowledge_and_claim(self, checked: list[tuple], now: Optional[int], *, limit: int = 0,
                               duration: int = 0):
        """Checked acknowledgements (`_acknowledgement`), then a claim of up to `limit` leases of
        `duration`, in one transaction; the announcements after its commit."""
        given, now = now, self._now(now)
        with self._conn.write(flush=limit > 0) as db:  # claims are durable before they are handed out
            now = self._now_locked(given, now)
            replies = [self._acknowledge_in(db, acknowledgement, now) for acknowledgement in checked]
            by_outcome: dict[str, list[ExecutionLease]] = {}  # the deliveries acknowledged, by outcome
            for (lease, outcome, _, _), reply in zip(checked, replies):
                if not isinstance(reply, LeaseLost):
                    by_outcome.setdefault(outcome.status, []).append(lease)
            for status, acknowledged in by_outcome.items():
                self._history_end(db, now, DeliveryEnd.ACKNOWLEDGED, status, acknowledged)
            ended = _ended(checked, replies)
            # Executions waiting for these to finish (ctx.wait_for) are woken with them, all at once.
            woke = waiters.wake_all(db, waiters.EXECUTION, ended, now, self.wake_in)
            claimed = self._claim_in(db, now, limit, duration) if limit else []
        if limit:
            self._last_claim_found = bool(claimed)
        self._announce_acknowledged(ended, woke)
        return replies, claimed

    def _acknowledgement(self, lease, outcome) -> tuple:
        """(lease, outcome, statement, its outcome parameters): the checked form of one."""
        lease = self._lease(lease)
        if isinstance(outcome, Suspended):
            return lease, outcome, ACKNOWLEDGE_SUSPENDED, ()
        if isinstance(outcome, Completed):
            arguments.json_text("outcome.result_json", outcome.result_json)
            return lease, outcome, ACKNOWLEDGE_TERMINAL, (outcome.status, outcome.result_json, None)
        if isinstance(outcome, Failed):
            arguments.json_text("outcome.error_json", outcome.error_json)
            return lease, outcome, ACKNOWLEDGE_TERMINAL, (outcome.status, None, outcome.error_json)
        raise arguments.InvalidArgument(
            f"outcome must be Suspended(), Completed(result_json) or Failed(error_json), not {outcome!r}"
        )

    def _acknowledge_in(self, db: Transaction, acknowledgement: tuple, now: int) -> Outcome | LeaseLost:
        """Acknowledge in the open transaction, fenced as `_end` is; the lease history and the
        waiters are the caller's, for the whole batch at once."""
        lease, outcome, sql, params = acknowledgement
        if db.execute(sql, params + (now, lease.execution_id, lease.token)).rowcount != 1:
            return LeaseLost()
        return outcome

    def _announce_acknowledged(self, ended: list[str], woke: bool) -> None:
        """After the commit: nudge if waiters became due, and name the executions that ended."""
        if woke:
            self._on_due()
        if ended:
            self._on_ended(ended)

    def _end(self, db: Transaction, lease, now, how: DeliveryEnd, outcome, sql, params) -> bool:
        """End the lease's delivery with `sql` if it is current; record how in the history.

        The fence is `sql`'s WHERE clause (current token, delivery not ended): on PostgreSQL the
        UPDATE locks the row, waits for a claim that holds it, and then finds the token moved."""
        if db.execute(sql, params + (lease.execution_id, lease.token)).rowcount != 1:
            return False
        self._history_end(db, now, how, outcome, [lease])
        return True

    def _history_end(self, db: Transaction, now: int, how: DeliveryEnd, outcome: Optional[str],
                     leases: list[ExecutionLease]) -> None:
        """Record in the lease history that the deliveries of `leases` ended `how` at `now`."""
        for start in range(0, len(leases), HISTORY_END_ROWS):
            some = leases[start:start + HISTORY_END_ROWS]
            db.execute(history_end(len(some)),
                       (now, how.value, outcome, *(value for lease in some for value in (lease.execution_id, lease.token))))

    def next_ready_at(self) -> Optional[int]:
        """The earliest time any execution may be claimed (it may be past), or None if none ever
        will be without a new admission or wake. Running executions count at their lease's
        expiry plus the redelivery delay."""
        return self._conn.execute(NEXT_READY).fetchone()[0]

    # -- operators ---------------------------------------------------------------------------

    def history(self, execution_id, *, now=None) -> list[LeaseRecord]:
        """Every delivery of one execution, oldest first."""
        arguments.identifier("execution_id", execution_id)
        now = self._now(now)
        records = []
        for row in self._conn.execute(HISTORY, (execution_id,)).fetchall():
            execution_id_, token, holder, claimed_at, expires_at, renewals, ended_at, ended_by, outcome = row
            if ended_by is None and expires_at <= now:
                ended_at, ended_by = expires_at, DeliveryEnd.EXPIRED.value
            records.append(
                LeaseRecord(execution_id_, token, holder, claimed_at, expires_at, renewals, ended_at, ended_by, outcome)
            )
        return records

    def list(self, *, status=None, workflow=None, since=None, until=None, id_prefix=None, limit=None, offset=0,
             now=None) -> list[ExecutionRecord]:
        """Executions newest first (by `created_at`), filtered by status as of `now`, workflow,
        `since <= created_at < until` (ms) and the start of the id; `offset` skips that many
        matches."""
        status = _status(status)
        if workflow is not None:
            arguments.identifier("workflow", workflow)
        for name, value in (("since", since), ("until", until)):
            if value is not None:
                arguments.integer(name, value)
        if id_prefix is not None:
            arguments.identifier("id_prefix", id_prefix)
        if limit is not None:
            arguments.integer("limit", limit, minimum=0)
        arguments.integer("offset", offset, minimum=0)
        now = self._now(now)
        if limit == 0:
            return []
        # A stored 'running' row may read admitted or suspended as of now (its lease expired),
        # so those statuses also look at running rows; the rest match as stored.
        stored = {None: None, RUNNING: [RUNNING], ADMITTED: [ADMITTED, RUNNING],
                  SUSPENDED: [SUSPENDED, RUNNING]}.get(status, [status])
        where, params = [], []
        if stored is not None:
            where.append(f"status IN ({', '.join('?' * len(stored))})")
            params += stored
        if workflow is not None:
            where.append("workflow = ?")
            params.append(workflow)
        if since is not None:
            where.append("created_at >= ?")
            params.append(since)
        if until is not None:
            where.append("created_at < ?")
            params.append(until)
        if id_prefix is not None:
            where.append("substr(execution_id, 1, ?) = ?")
            params += [len(id_prefix), id_prefix]
        sql = (f"SELECT {COLUMNS} FROM executions" + (f" WHERE {' AND '.join(where)}" if where else "")
               + " ORDER BY created_at DESC, rowid DESC LIMIT ? OFFSET ?")
        records, skipped, read = [], 0, 0
        with self._conn.read() as db:  # one snapshot, read a page at a time until enough match
            while limit is None or len(records) < limit:
                page = db.execute(sql, (*params, LIST_PAGE, read)).fetchall()
                read += len(page)
                for found in page:
                    record = self._as_of(_Row(found), now)
                    if status is not None and record.status != status:
                        continue
                    if skipped < offset:
                        skipped += 1
                        continue
                    records.append(record)
                    if limit is not None and len(records) >= limit:
                        break
                if len(page) < LIST_PAGE:
                    break
        return records

    def cancel(self, execution_id, *, reason=None, now=None) -> ExecutionRecord:
        """Make the execution terminal as `cancelled`, ending a live delivery in the same
        transaction (its holder's fenced calls then return `LeaseLost`) and waking its waiters.
        A terminal execution is returned unchanged."""
        arguments.identifier("execution_id", execution_id)
        if reason is not None and not isinstance(reason, str):
            raise arguments.InvalidArgument(f"reason must be a str or None, not {type(reason).__name__}")
        error_json = arguments.to_json("reason", {"type": "Cancelled", "message": reason})
        given, now = now, self._now(now)
        with self._conn.write() as db:
            now = self._now_locked(given, now)
            row = self._row(db, execution_id)
            if row.status in TERMINAL:
                return self._as_of(row, now)
            if row.status == RUNNING:
                # The open delivery ends here: at its expiry if it already ran out, else now.
                if row.lease_expires_at <= now:
                    ended, how = row.lease_expires_at, DeliveryEnd.EXPIRED
                else:
                    ended, how = now, DeliveryEnd.CANCELLED
                db.execute(HISTORY_CLOSE, (ended, how.value, None, row.lease_expires_at, execution_id, row.token))
            db.execute(CANCEL, (error_json, now, execution_id))
            db.execute(waiters.FORGET_WAITER, (execution_id,))  # it waits for nothing any more
            woke = waiters.wake(db, waiters.EXECUTION, execution_id, now, self.wake_in)
            row = self._row(db, execution_id)
        if woke:
            self._on_due()
        self._on_ended([execution_id])
        return self._as_of(row, now)

    def resume(self, execution_id, *, now=None) -> ExecutionRecord:
        """A failed or cancelled execution becomes admitted and due now; its steps are kept, and
        the step its run ended on is tried again if that step failed."""
        arguments.identifier("execution_id", execution_id)
        given, now = now, self._now(now)
        with self._conn.write() as db:
            now = self._now_locked(given, now)
            row = self._row(db, execution_id)
            if row.status not in RESUMABLE:
                status = self._as_of(row, now).status
                raise ExecutionConflict(f"execution {execution_id!r} is {status}: only a failed or cancelled execution"
                                        f" can be resumed")
            db.execute(RESUME, (now, now, self._stamp(row, now), execution_id))
            last = db.execute(LAST_STEP, (execution_id,)).fetchone()
            if last is not None and last[1] and '"error"' in last[2]:
                if json.loads(last[2]).get("error") is not None:
                    db.execute(REOPEN_STEP, (last[0],))
            row = self._row(db, execution_id)
        self._on_due()
        return self._as_of(row, now)

    def purge(self, *, before, statuses=("completed", "failed", "cancelled"), now=None, dry_run=False) -> int:
        """Delete terminal executions whose `updated_at < before`, with their steps, lease
        history, store receipts, waiter registrations and start receipts, `PURGE_BATCH` at a
        time, each batch its own short transaction. Effects and stores are shared by identity
        and kept. A child whose parent is not terminal is kept: the parent may still wait for it. Returns how many
        were deleted (with `dry_run`, how many would be, deleting nothing)."""
        arguments.integer("before", before)
        if isinstance(statuses, str) or not isinstance(statuses, (tuple, list, set, frozenset)):
            raise arguments.InvalidArgument(f"statuses must be a list of statuses, not {type(statuses).__name__}")
        wrong = [s for s in statuses if s not in TERMINAL]
        if wrong or not statuses:
            raise arguments.InvalidArgument(
                f"statuses must be terminal ({', '.join(TERMINAL)}): purge never deletes a live execution; got"
                f" {', '.join(map(repr, wrong))}" if wrong else "statuses must name at least one terminal status")
        arguments.boolean("dry_run", dry_run)
        self._now(now)
        purged = 0
        for status in sorted(set(statuses)):
            after: tuple[int, int] = (-(2 ** 63), -1)
            while True:
                with (self._conn.read() if dry_run else self._conn.write()) as db:
                    batch = db.execute(PURGEABLE if dry_run else PURGEABLE + SKIP_LOCKED,
                                       (status, before, *after, PURGE_BATCH)).fetchall()
                    for eid, _, _ in batch:
                        if db.execute(AWAITED, (eid,)).fetchone() is not None:
                            continue
                        if not dry_run:
                            for statement in PURGE:
                                db.execute(statement, (eid,))
                        purged += 1
                if len(batch) < PURGE_BATCH:
                    break
                after = batch[-1][1:]
        return purged

    def waiting_for(self, execution_id, *, now=None) -> list[WaitReason]:
        """Why a waiting (admitted or suspended) execution is not running now; empty for a
        running or terminal one."""
        arguments.identifier("execution_id", execution_id)
        now = self._now(now)
        with self._conn.read() as db:
            row = self._row(db, execution_id, lock=False)
            record = self._as_of(row, now)
            if record.status not in (ADMITTED, SUSPENDED):
                return []
            reasons = [WaitReason(kind, target, None, detail)
                       for kind, target, detail in db.execute(waiters.OF_WAITER, (execution_id,)).fetchall()]
            if record.due_at is not None and record.due_at > now:
                reasons.append(_timed_reason(db, execution_id, record.due_at))
            elif record.due_at is None and not reasons:
                reasons.append(WaitReason("wake"))
            ready = _ready(row, self._delay) if record.due_at is not None else None
            if ready is not None and ready > now and record.unacknowledged_deliveries:
                reasons.append(WaitReason("redelivery", None, ready, f"{record.unacknowledged_deliveries} deliveries in"
                                          " a row went unacknowledged"))
            if record.due_at is not None and record.due_at <= now and (ready is None or ready <= now):
                reasons.append(WaitReason("due", None, record.due_at))
        return reasons

    def stats(self, *, now=None, limit=20) -> LedgerStats:
        """Counts by status and workflow, the longest-waiting due execution, the executions
        whose deliveries go unacknowledged, and every live lease, read in one transaction."""
        arguments.integer("limit", limit, minimum=0)
        now = self._now(now)
        by_status = {s.value: 0 for s in ExecutionStatus}
        by_workflow: dict[str, dict[str, int]] = {}
        with self._conn.read() as db:
            for workflow, status, count in db.execute(COUNTS, {"now": now}).fetchall():
                by_status[status] = by_status.get(status, 0) + count
                by_workflow.setdefault(workflow, {})[status] = count
            due = self._claimable(db, now, 1)
            unacked = [self._as_of(_Row(found), now) for found in db.execute(UNACKNOWLEDGED, {"now": now}).fetchall()]
            unacked.sort(key=lambda r: (-r.unacknowledged_deliveries, r.execution_id))
            live = [LiveLease(*found) for found in db.execute(LIVE, {"now": now}).fetchall()]
            deliveries = db.execute(DELIVERIES).fetchone()[0]
        # Workflows and each one's statuses by name, whatever order the backend's grouping gave.
        by_workflow = {workflow: dict(sorted(counts.items())) for workflow, counts in sorted(by_workflow.items())}
        return LedgerStats(now=now, by_status=by_status, by_workflow=by_workflow,
                           oldest_due=self._as_of(due[0], now) if due else None, unacknowledged=unacked[:limit],
                           live_leases=live, deliveries=deliveries)

    def ended(self, leases, *, now=None) -> list[ExecutionLease]:
        """The leases among `leases` whose delivery has ended: cancelled, acknowledged,
        released, or claimed again after it expired. A supervisor asks every heartbeat, so that
        a child whose execution was cancelled is stopped at once, not at the next renewal."""
        leases = [self._lease(lease) for lease in leases]
        self._now(now)
        current: dict[str, tuple[int, str]] = {}
        with self._conn.read() as db:
            for start in range(0, len(leases), 500):
                ids = [lease.execution_id for lease in leases[start:start + 500]]
                for eid, token, status in db.execute(CURRENT_TOKENS.format(", ".join("?" * len(ids))), ids):
                    current[eid] = (token, status)
        return [lease for lease in leases if current.get(lease.execution_id) != (lease.token, RUNNING)]

    def _row(self, db: Transaction, execution_id: str, *, lock: bool = True) -> _Row:
        found = db.execute(SELECT_ONE_LOCKED if lock else SELECT_ONE, (execution_id,)).fetchone()
        if found is None:
            raise UnknownExecution(f"execution_id {execution_id!r} is not admitted")
        return _Row(found)


def _ended(checked: list[tuple], replies: list) -> list[str]:
    """The executions that the acknowledgements `checked` made terminal (`replies`: theirs)."""
    return [lease.execution_id for (lease, outcome, _, _), reply in zip(checked, replies)
            if not isinstance(outcome, Suspended) and not isinstance(reply, LeaseLost)]


@functools.lru_cache(maxsize=HISTORY_END_ROWS)
def history_end(count: int) -> str:
    """HISTORY_END for `count` deliveries."""
    return HISTORY_END.format(deliveries=" OR ".join(["(execution_id = ? AND token = ?)"] * count))


@functools.lru_cache(maxsize=HISTORY_OPEN_ROWS)
def history_open(count: int) -> str:
    """HISTORY_OPEN for `count` leases."""
    return HISTORY_OPEN.format(rows=", ".join(["(?, ?, ?, ?, ?)"] * count))


def _status(status: Optional[str]) -> Optional[str]:
    if status is not None and status not in {s.value for s in ExecutionStatus}:
        raise arguments.InvalidArgument(
            f"status must be one of {', '.join(s.value for s in ExecutionStatus)}; got {status!r}"
        )
    return status


def _ready(row: _Row, delay: Callable[[int], int]) -> Optional[int]:
    """When a waiting row may next be claimed, with its redelivery delay (as of the row)."""
    if row.status == RUNNING:  # expired, not yet claimed again
        return max(row.due_at, row.lease_expires_at + delay(row.unacknowledged_deliveries + 1))
    if row.unacknowledged_deliveries == 0 or row.delivery_ended_at is None:
        return row.due_at
    return max(row.due_at, row.delivery_ended_at + delay(row.unacknowledged_deliveries))


def _timed_reason(db: Transaction, execution_id: str, due_at: int) -> WaitReason:
    """What a future due time is for: the timer or retry backoff of the step that asked for
    it, or a wake requested from outside."""
    for key, done, response_json in db.execute(
            "SELECT step_key, done, step_response_json FROM steps WHERE execution_id = ? ORDER BY rowid DESC LIMIT 50",
            (execution_id,)):
        response = json.loads(response_json)
        if "until" in response and response["until"] == due_at:
            return WaitReason("timer", key, due_at)
        if not done and response.get("retry_at") == due_at:
            error = response.get("error") or {}
            return WaitReason("retry", key, due_at, f"{error.get('type', 'Error')}: {error.get('message', '')}")
    return WaitReason("wake", None, due_at)
