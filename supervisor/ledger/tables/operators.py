"""The operators' queries of the executions client (SPEC sections 8 and 11): list, stats, why an
execution waits, its lease history, and cancel, resume, unpark (`parking`) and purge.

`ExecutionOperators` is one half of `executions.ExecutionTable`; the lease state machine is the
other (`leases`). The lease history they read and end is `lease_history`'s.
"""

from __future__ import annotations

import json
from typing import Callable, Optional

from .. import arguments
from ..connection import Transaction
from ..dialect import Rendered
from ..errors import ExecutionConflict
from ..values import (
    DeliveryEnd,
    ExecutionRecord,
    ExecutionStatus,
    LeaseRecord,
    LedgerStats,
    LiveLease,
    WaitReason,
)
from . import parking, queues, waiters
from .epochs import FLOOR
from .execution_rows import (
    ADMITTED,
    CANCELLED,
    COLUMNS,
    RESUMABLE,
    RUNNING,
    SKIP_LOCKED,
    SUSPENDED,
    TERMINAL,
    ExecutionRows,
    Row,
)
from .lease_history import DELIVERIES, HISTORY, HISTORY_CLOSE

# How many executions one purge transaction deletes: small enough that each holds the write lock
# for a few ms, so supervisors sharing the file barely notice a purge of millions.
PURGE_BATCH = 100
LIST_PAGE = 500  # rows `list` reads at a time, as a stored status may not be the status as of now

# An unfinished execution made terminal from outside its delivery: cancelled, or failed as timed
# out (`deadlines`).
TERMINATE = """
UPDATE executions SET status = $p, result_json = NULL, error_json = $p, lease_expires_at = NULL,
    due_at = NULL, ready_at = NULL, wake_during_lease = NULL, updated_at = $p
WHERE execution_id = $p"""

# A resumed execution's token moves up to the current epoch's floor, if a restore or a failover
# raised the epoch while it was terminal (see `epochs`). Its workflow timeout, if it has one, runs
# again from the resume (else one that timed out would time out again at once).
RESUME = f"""
UPDATE executions SET status = 'admitted', ever_suspended = 0, result_json = NULL, error_json = NULL,
    lease_expires_at = NULL, unacknowledged_deliveries = 0, delivery_ended_at = NULL, wake_during_lease = NULL,
    due_at = $p, ready_at = $p, updated_at = $p, token = $yieldstar_max(token, {FLOOR}), deadline_at = $p + timeout_ms
WHERE execution_id = $p"""
# The step a failed run ended on: the last one written. If it recorded a final error, resume
# opens it again (done = 0, no retry time), so the replay runs that step once more instead of
# raising the old error: fix the bug, then resume.
LAST_STEP = "SELECT $row_order, done, step_response_json FROM steps WHERE execution_id = $p ORDER BY $row_order DESC LIMIT 1"
REOPEN_STEP = "UPDATE steps SET done = 0 WHERE $row_order = $p"

# The next batch after (updated_at, rowid), in the index's own order: kept rows are stepped over.
PURGEABLE = """
SELECT execution_id, updated_at, $row_order FROM executions $by_executions_by_update
WHERE status = $p AND updated_at < $p AND (updated_at, $row_order) > ($p, $p) ORDER BY updated_at, $row_order LIMIT $p"""
PURGEABLE_LOCKED = PURGEABLE + SKIP_LOCKED
PURGE = (
    "DELETE FROM steps WHERE execution_id = $p",
    "DELETE FROM lease_history WHERE execution_id = $p",
    "DELETE FROM store_receipts WHERE execution_id = $p",
    "DELETE FROM waiters WHERE waiter = $p",
    "DELETE FROM waiters WHERE kind = 'execution' AND target = $p",
    "DELETE FROM starts WHERE execution_id = $p",
    "DELETE FROM messages WHERE execution_id = $p",
    "DELETE FROM events WHERE execution_id = $p",
    "DELETE FROM executions WHERE execution_id = $p",
)
# The steps a due time may be for, latest first (`waiting_for`).
RECENT_STEPS = """
SELECT step_key, done, step_response_json FROM steps WHERE execution_id = $p ORDER BY $row_order DESC LIMIT 50"""
# A child execution whose parent is not terminal: the parent may still wait for its outcome.
AWAITED = """
SELECT 1 FROM starts s JOIN executions p ON p.execution_id = s.parent
WHERE s.execution_id = $p AND p.status NOT IN ($terminal) LIMIT 1"""

# The due execution that has waited longest, whichever its priority and whether or not its
# queue's limits hold it back now (what `stats`' oldest due and the metric of its age report: how
# long work waits, not what the next claim takes). Read by the index of ready times: its cost
# grows with the due backlog, as the counts beside it do.
OLDEST_DUE = f"""
SELECT {COLUMNS} FROM executions $by_executions_ready
WHERE ready_at IS NOT NULL AND ready_at <= $p AND due_at <= $p ORDER BY due_at LIMIT 1"""

# Stored statuses read as of now: a running row whose lease ran out reads admitted or suspended.
STATUS_AS_OF = """CASE WHEN status = 'running' AND lease_expires_at <= $p
    THEN CASE ever_suspended WHEN 1 THEN 'suspended' ELSE 'admitted' END ELSE status END"""
COUNTS = f"SELECT workflow, {STATUS_AS_OF} AS st, count(*) FROM executions GROUP BY workflow, st"
UNACKNOWLEDGED = f"""
SELECT {COLUMNS} FROM executions
WHERE status NOT IN ($terminal)
    AND (unacknowledged_deliveries > 0 OR (status = 'running' AND lease_expires_at <= $p))"""
LIVE = """
SELECT e.execution_id, e.workflow, e.token, h.holder, h.claimed_at, e.lease_expires_at, h.renewals
FROM executions e $by_executions_expiring
JOIN lease_history h ON h.execution_id = e.execution_id AND h.token = e.token
WHERE e.status = 'running' AND e.lease_expires_at > $p ORDER BY e.lease_expires_at"""


class ExecutionOperators(ExecutionRows):
    """The operators' queries (see the module docstring)."""

    def history(self, execution_id, *, now=None) -> list[LeaseRecord]:
        """Every delivery of one execution, oldest first."""
        arguments.identifier("execution_id", execution_id)
        now = self._now(now)
        records = []
        for row in self._conn.execute(self._sql[HISTORY], (execution_id,)).fetchall():
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
                arguments.time_ms(name, value)
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
            where.append(f"status IN ({', '.join(['$p'] * len(stored))})")
            params += stored
        if workflow is not None:
            where.append("workflow = $p")
            params.append(workflow)
        if since is not None:
            where.append("created_at >= $p")
            params.append(since)
        if until is not None:
            where.append("created_at < $p")
            params.append(until)
        if id_prefix is not None:
            where.append("substr(execution_id, 1, $p) = $p")
            params += [len(id_prefix), id_prefix]
        sql = (f"SELECT {COLUMNS} FROM executions" + (f" WHERE {' AND '.join(where)}" if where else "")
               + " ORDER BY created_at DESC, $row_order DESC LIMIT $p OFFSET $p")
        records, skipped, read = [], 0, 0
        with self._conn.read() as db:  # one snapshot, read a page at a time until enough match
            while limit is None or len(records) < limit:
                page = db.execute(self._sql[sql], (*params, LIST_PAGE, read)).fetchall()
                read += len(page)
                for found in page:
                    record = self._as_of(Row(found), now)
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
        error_json = arguments.to_json("reason", {"type": "Cancelled", "message": reason}, limit=self._max_payload)
        given, now = now, self._now(now)
        with self._conn.write() as db:
            now = self._now_locked(given, now)
            row = self._row(db, execution_id)
            if row.status in TERMINAL:
                return self._as_of(row, now)
            woke = terminate(self, db, row, now, CANCELLED, error_json, DeliveryEnd.CANCELLED)
            row = self._row(db, execution_id)
        if woke:
            self._on_due()
        self._on_ended([execution_id])
        return self._as_of(row, now)

    def resume(self, execution_id, *, now=None) -> ExecutionRecord:
        """A failed or cancelled execution becomes admitted and due now, its workflow timeout (if
        any) counted again from now; its steps are kept, and the step its run ended on is tried
        again if that step failed. A parked one (`parking`) stays suspended and becomes due now,
        parked no more."""
        arguments.identifier("execution_id", execution_id)
        given, now = now, self._now(now)
        with self._conn.write() as db:
            now = self._now_locked(given, now)
            row = self._row(db, execution_id)
            if row.status in RESUMABLE:
                self._resume_ended(db, row, now)
            elif _parked(db, self._sql, row):
                self.wake_in(db, execution_id, now, now)  # due now; a wake forgets the parking
            else:
                status = self._as_of(row, now).status
                raise ExecutionConflict(f"execution {execution_id!r} is {status}: only a failed, cancelled or parked"
                                        f" execution can be resumed")
            row = self._row(db, execution_id)
        self._on_due()
        return self._as_of(row, now)

    def _resume_ended(self, db: Transaction, row: Row, now: int) -> None:
        """`resume` of a failed or cancelled row, in the caller's transaction."""
        execution_id = row.execution_id
        db.execute(self._sql[RESUME], (now, now, self._stamp(row, now), now, execution_id))
        last = db.execute(self._sql[LAST_STEP], (execution_id,)).fetchone()
        if last is not None and last[1] and '"error"' in last[2]:
            if json.loads(last[2]).get("error") is not None:
                db.execute(self._sql[REOPEN_STEP], (last[0],))

    def unpark(self, workflows, *, now=None) -> int:
        """Every parked execution of `workflows` becomes due at `now`, parked no more (see
        `parking`), in one transaction; returns how many."""
        if workflows is None:
            raise arguments.InvalidArgument("workflows must be a collection of workflow names, not None")
        names = sorted(arguments.workflows("workflows", workflows))
        given, now = now, self._now(now)
        if not names:
            return 0
        unparked = 0
        with self._conn.write() as db:
            now = self._now_locked(given, now)
            for start in range(0, len(names), parking.UNPARK_WORKFLOWS):
                some = names[start:start + parking.UNPARK_WORKFLOWS]
                rows, registrations = parking.unpark(len(some), self._one_clock)
                unparked += db.execute(self._sql[rows], (now, now, now, *some)).rowcount
                db.execute(self._sql[registrations], some)
        if unparked:
            self._on_due()
        return unparked

    def purge(self, *, before, statuses=TERMINAL, now=None, dry_run=False) -> int:
        """Delete terminal executions whose `updated_at < before`, with their steps, lease
        history, store receipts, waiter registrations, start receipts, messages and events, `PURGE_BATCH` at a
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
                    batch = db.execute(self._sql[PURGEABLE if dry_run else PURGEABLE_LOCKED],
                                       (status, before, *after, PURGE_BATCH)).fetchall()
                    for eid, _, _ in batch:
                        if db.execute(self._sql[AWAITED], (eid,)).fetchone() is not None:
                            continue
                        if not dry_run:
                            for statement in PURGE:
                                db.execute(self._sql[statement], (eid,))
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
                       for kind, target, detail in db.execute(self._sql[waiters.OF_WAITER], (execution_id,)).fetchall()]
            if record.due_at is not None and record.due_at > now:
                reasons.append(_timed_reason(db, self._sql, execution_id, record.due_at))
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
        whose deliveries go unacknowledged, every live lease, the parked executions by
        workflow, and the queues, read in one transaction."""
        arguments.integer("limit", limit, minimum=0)
        now = self._now(now)
        by_status = {s.value: 0 for s in ExecutionStatus}
        by_workflow: dict[str, dict[str, int]] = {}
        with self._conn.read() as db:
            for workflow, status, count in db.execute(self._sql[COUNTS], (now,)).fetchall():
                by_status[status] = by_status.get(status, 0) + count
                by_workflow.setdefault(workflow, {})[status] = count
            due = db.execute(self._sql[OLDEST_DUE], (now, now)).fetchall()
            unacked = [self._as_of(Row(found), now) for found in db.execute(self._sql[UNACKNOWLEDGED], (now,)).fetchall()]
            unacked.sort(key=lambda r: (-r.unacknowledged_deliveries, r.execution_id))
            live = [LiveLease(*found) for found in db.execute(self._sql[LIVE], (now,)).fetchall()]
            deliveries = db.execute(self._sql[DELIVERIES]).fetchone()[0]
            parked = dict(db.execute(self._sql[parking.PARKED_BY_WORKFLOW]).fetchall())
            by_queue = tuple(queues.queue_records(db, self._sql, now))
        # Workflows and each one's statuses by name, whatever order the backend's grouping gave.
        by_workflow = {workflow: dict(sorted(counts.items())) for workflow, counts in sorted(by_workflow.items())}
        return LedgerStats(now=now, by_status=by_status, by_workflow=by_workflow,
                           oldest_due=self._as_of(Row(due[0]), now) if due else None, unacknowledged=unacked[:limit],
                           live_leases=live, deliveries=deliveries, parked=parked, queues=by_queue)


def terminate(client: ExecutionRows, db: Transaction, row: Row, now: int, status: str, error_json: str,
              how: DeliveryEnd) -> bool:
    """End a locked, unfinished row as `status` with `error_json`, inside the caller's transaction,
    from outside its delivery: an open delivery ends as `how` (at its expiry if it already ran out,
    else now), so its holder's fenced calls return `LeaseLost`; its waits are forgotten and its
    waiters woken. Whether any waiter was woken (the caller tells `on_due` after its commit)."""
    if row.status == RUNNING:
        if row.lease_expires_at <= now:
            ended, how = row.lease_expires_at, DeliveryEnd.EXPIRED
        else:
            ended = now
        db.execute(client._sql[HISTORY_CLOSE], (ended, how.value, None, row.lease_expires_at, row.execution_id,
                                                row.token))
    db.execute(client._sql[TERMINATE], (status, error_json, now, row.execution_id))
    db.execute(client._sql[waiters.FORGET_WAITER], (row.execution_id,))  # it waits for nothing any more
    return bool(waiters.wake(db, client._sql, waiters.EXECUTION, row.execution_id, now, client.wake_in))


def _status(status: Optional[str]) -> Optional[str]:
    if status is not None and status not in {s.value for s in ExecutionStatus}:
        raise arguments.InvalidArgument(
            f"status must be one of {', '.join(s.value for s in ExecutionStatus)}; got {status!r}"
        )
    return status


def _parked(db: Transaction, sql: Rendered, row: Row) -> bool:
    """Whether the (locked) row is parked: suspended, not due, and registered as waiting for code."""
    return (row.status == SUSPENDED and row.due_at is None
            and db.execute(sql[parking.PARKED], (row.workflow, row.execution_id)).fetchone() is not None)


def _ready(row: Row, delay: Callable[[int], int]) -> Optional[int]:
    """When a waiting row may next be claimed, with its redelivery delay (as of the row)."""
    if row.status == RUNNING:  # expired, not yet claimed again
        return max(row.due_at, row.lease_expires_at + delay(row.unacknowledged_deliveries + 1))
    if row.unacknowledged_deliveries == 0 or row.delivery_ended_at is None:
        return row.due_at
    return max(row.due_at, row.delivery_ended_at + delay(row.unacknowledged_deliveries))


def _timed_reason(db: Transaction, sql: Rendered, execution_id: str, due_at: int) -> WaitReason:
    """What a future due time is for: the timer or retry backoff of the step that asked for
    it, or a wake requested from outside."""
    for key, done, response_json in db.execute(sql[RECENT_STEPS], (execution_id,)):
        response = json.loads(response_json)
        if "until" in response and response["until"] == due_at:
            return WaitReason("timer", key, due_at)
        if not done and response.get("retry_at") == due_at:
            error = response.get("error") or {}
            return WaitReason("retry", key, due_at, f"{error.get('type', 'Error')}: {error.get('message', '')}")
    return WaitReason("wake", None, due_at)
