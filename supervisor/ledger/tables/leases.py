"""The lease state machine of the executions client: admission, wakes, claims, renewals,
releases and acknowledgements (one at a time, or a batch with a claim in one transaction), each
fenced by the current token in the statement that writes (SPEC sections 3 and 7).

`ExecutionLeases` is one half of `executions.ExecutionTable`; the operators' queries are the
other (`operators`). The lease history it writes is `lease_history`'s.
"""

from __future__ import annotations

import functools
import time
from typing import Optional

from .. import arguments
from ..connection import Transaction
from ..errors import ExecutionConflict, StorageBusy
from ..values import (
    Claimed,
    DeliveryEnd,
    ExecutionLease,
    ExecutionRecord,
    HeapRecord,
    LeaseLost,
    Outcome,
    Released,
    Renewed,
    WORKFLOWS_TIMEOUT,
)
from . import parking, queues, waiters
from .acknowledgements import Acknowledgement, ended_executions
from .execution_rows import COLUMNS, RUNNING, SELECT_ONE, TERMINAL, ExecutionRows, Row, insert
from .lease_history import (
    HISTORY_CLOSE,
    HISTORY_END_ROWS,
    HISTORY_OPEN_ROWS,
    HISTORY_RENEWED,
    history_end,
    history_renewed_many,
    history_open,
)

NEXT_READY = "SELECT min(ready_at) FROM executions WHERE ready_at IS NOT NULL"
# The same for one workflow, in two parts (`next_ready_of`): the waiting rows, a seek in the index of
# (workflow, ready_at), which a renewal never touches (it holds no running row: a renewal moves a
# running row's ready_at at every round); and the running ones (each lease's expiry, plus the
# redelivery delay), by the expiring index, whose rows of other workflows are stepped over.
_NEXT_WAITING_OF = """
SELECT min(ready_at) AS ready FROM executions $by_executions_ready_by_workflow
WHERE workflow = $p AND ready_at IS NOT NULL AND status <> 'running'"""
_NEXT_RUNNING_OF = """
SELECT * FROM (
    SELECT ready_at AS ready FROM executions $by_executions_expiring
    WHERE status = 'running' AND workflow IN ({names}) ORDER BY ready_at LIMIT 1) AS running"""
# An execution's row, then its recorded steps in write order, in one statement (one round trip,
# one snapshot): each part's columns are NULL in the other's rows, so the row's input is sent
# once, not once per step.
_NO_EXECUTION = ", ".join(["NULL"] * len(COLUMNS.split(",")))
WITH_STEPS = f"""
SELECT * FROM (
    SELECT 0 AS part, 0 AS seq, {COLUMNS}, NULL AS step_key, NULL AS attempt, NULL AS done,
        NULL AS step_response_json
    FROM executions WHERE execution_id = $p
    UNION ALL
    SELECT 1, $row_order, {_NO_EXECUTION}, step_key, attempt, done, step_response_json
    FROM steps WHERE execution_id = $p) AS delivery
ORDER BY part, seq"""

CLAIM = """
UPDATE executions SET token = token + 1, status = 'running', lease_expires_at = $p,
    unacknowledged_deliveries = $p, delivery_ended_at = $p, wake_during_lease = NULL,
    ready_at = $p, updated_at = $p
WHERE execution_id = $p"""

# An expired lease of a queue whose limits count live leases is not renewed: a claim may have
# given its slot to another since it expired (SPEC section 12), so reviving it could exceed them.
# `$p`: now. (Of any other queue, an expired lease nobody claimed since is still current.)
NOT_REVIVED = """(lease_expires_at > $p OR NOT EXISTS (
        SELECT 1 FROM queues WHERE queues.name = executions.queue
            AND (queues.concurrency IS NOT NULL OR queues.per_key IS NOT NULL)))"""
# The fence is the WHERE clause: current token, delivery not ended.
RENEW = f"""
UPDATE executions SET lease_expires_at = $p, ready_at = $p + $yieldstar_delay(unacknowledged_deliveries + 1),
    updated_at = $p
WHERE execution_id = $p AND token = $p AND status = 'running' AND {NOT_REVIVED}"""

# A claim that takes a slot of a queue whose limits count live leases ends, in its transaction,
# every delivery of that queue whose lease had run out by the claim's clock (`$p`: now), as if
# the lease had expired and been released then: it counted those leases free, so they must never
# be renewed again. NOT_REVIVED refuses that too, but by the renewer's clock: on SQLite each
# process reads its own, and one behind the claimer's still sees the lease unexpired. The end is
# a fence, by the delivery's status, whatever either clock says (`_fence_lapsed`).
END_LAPSED = """
UPDATE executions SET status = CASE ever_suspended WHEN 1 THEN 'suspended' ELSE 'admitted' END,
    lease_expires_at = NULL, unacknowledged_deliveries = unacknowledged_deliveries + 1,
    delivery_ended_at = lease_expires_at, wake_during_lease = NULL,
    ready_at = $yieldstar_max(due_at, lease_expires_at + $yieldstar_delay(unacknowledged_deliveries + 1)),
    updated_at = $p
WHERE queue = $p AND status = 'running' AND lease_expires_at <= $p
RETURNING execution_id, token, delivery_ended_at"""

# A batch of renewals (`renew_many`), each fenced by its own token as RENEW is: `{leases}` is
# "($p, $p)" (execution id, token) once per lease (`renew_many_statement`), at most
# RENEW_MANY_LEASES. The inner SELECT locks the rows it renews, skipping (on PostgreSQL) those
# another transaction holds, so that one busy row does not stall the batch; the skipped ones are
# renewed one by one afterwards, with `renew`'s bounded wait. What it returns is what it renewed.
RENEW_MANY = f"""
UPDATE executions SET lease_expires_at = $p, ready_at = $p + $yieldstar_delay(unacknowledged_deliveries + 1),
    updated_at = $p
WHERE execution_id IN (
    SELECT execution_id FROM executions
    WHERE (execution_id, token) IN (VALUES {{leases}}) AND status = 'running' AND {NOT_REVIVED} $skip_locked)
RETURNING execution_id, token"""
RENEW_MANY_LEASES = 1000

RELEASE = """
UPDATE executions SET status = CASE ever_suspended WHEN 1 THEN 'suspended' ELSE 'admitted' END,
    lease_expires_at = NULL, unacknowledged_deliveries = unacknowledged_deliveries + 1,
    delivery_ended_at = $p, wake_during_lease = NULL,
    ready_at = $yieldstar_max(due_at, $p + $yieldstar_delay(unacknowledged_deliveries + 1)),
    updated_at = $p
WHERE execution_id = $p AND token = $p AND status = 'running'"""

# `{ids}`: a "$p" per execution, at most CURRENT_TOKENS_IDS (`current_tokens`).
CURRENT_TOKENS = "SELECT execution_id, token, status FROM executions WHERE execution_id IN ({ids})"
CURRENT_TOKENS_IDS = 500


def renewal_lock_wait_ms(duration: int) -> int:
    """How long a renewal waits for its execution's row lock (on PostgreSQL) before failing as
    busy: a tenth of the lease, between 50 ms and a second. A row held longer is held by a
    transaction that is stuck (a host cut off mid-transaction holds its locks until the link
    heals), and a supervisor renews its leases one after another: every other lease must not
    wait behind the one stuck row, and lose its lease for it. The stuck one is renewed again at
    the next round."""
    return max(50, min(1000, duration // 10))


class ExecutionLeases(ExecutionRows):
    """The lease state machine (see the module docstring)."""

    def admit(self, execution_id, workflow, input_json="null", *, queue="default", key=None, priority=0,
              timeout_ms=None, trace_context=None, now=None) -> ExecutionRecord:
        arguments.identifier("execution_id", execution_id)
        arguments.identifier("workflow", workflow)
        arguments.json_text("input_json", input_json, limit=self._max_payload)
        if queue is not None:
            arguments.identifier("queue", queue)
        if key is not None:
            arguments.identifier("key", key)
        if priority is not None:
            queues.priority("priority", priority)
        if timeout_ms is not WORKFLOWS_TIMEOUT:
            arguments.timeout_ms("timeout_ms", timeout_ms)
        arguments.trace_context("trace_context", trace_context)
        now = self._now(now)
        with self._conn.write() as db:
            created = insert(db, self._sql, execution_id, workflow, input_json, now, queue=queue, key=key,
                             priority=priority, take_turns=not self._conn.whole_database_write_lock,
                             timeout_ms=timeout_ms, trace_context=trace_context)
            found = db.execute(self._sql[SELECT_ONE], (execution_id,)).fetchone()
        if created:
            self._on_due()
        row = Row(found)
        if row.workflow != workflow or arguments.canonical_json(row.input_json) != arguments.canonical_json(
            input_json
        ):
            raise ExecutionConflict(
                f"execution_id {execution_id!r} was already admitted with workflow {row.workflow!r} and"
                f" input {row.input_json}; refusing workflow {workflow!r} with input {input_json}"
            )
        # A start that leaves the queue or the priority to the workflow's defaults accepts the
        # execution's own.
        named = (row.queue if queue is None else queue, key, row.priority if priority is None else priority)
        if (row.queue, row.queue_key, row.priority) != named:
            raise ExecutionConflict(
                f"execution_id {execution_id!r} was already admitted in queue {row.queue!r} with key"
                f" {row.queue_key!r} and priority {row.priority}; refusing queue {queue!r}, key {key!r},"
                f" priority {priority}")
        if timeout_ms is not WORKFLOWS_TIMEOUT and row.timeout_ms != timeout_ms:
            raise ExecutionConflict(
                f"execution_id {execution_id!r} was already admitted with timeout_ms {row.timeout_ms};"
                f" refusing timeout_ms {timeout_ms}")
        return self._as_of(row, now)

    def get(self, execution_id, *, now=None) -> Optional[ExecutionRecord]:
        arguments.identifier("execution_id", execution_id)
        now = self._now(now)
        found = self._conn.execute(self._sql[SELECT_ONE], (execution_id,)).fetchone()
        return None if found is None else self._as_of(Row(found), now)

    def get_with_steps(self, execution_id, *, now=None) -> Optional[tuple[ExecutionRecord, list[HeapRecord]]]:
        arguments.identifier("execution_id", execution_id)
        now = self._now(now)
        found = self._conn.execute(self._sql[WITH_STEPS], (execution_id, execution_id)).fetchall()
        if not found or found[0][0] != 0:
            return None
        steps = [HeapRecord(execution_id, key, attempt, bool(done), response)
                 for key, attempt, done, response in (row[-4:] for row in found[1:])]
        return self._as_of(Row(found[0][2:-4]), now), steps

    def request_wake(self, execution_id, at, *, now=None) -> None:
        arguments.identifier("execution_id", execution_id)
        arguments.time_ms("at", at)
        now = self._now(now)
        with self._conn.write() as db:
            woken = self.wake_in(db, execution_id, at, now)
        if woken:
            self._on_due()

    def await_outcome(self, execution_id, waiter) -> ExecutionRecord:
        """Unfenced: the record of `execution_id`; unless it is terminal, `waiter` is registered
        to be woken when it becomes so (in the same transaction, so no outcome slips between)."""
        arguments.identifier("execution_id", execution_id)
        arguments.identifier("waiter", waiter)
        now = self._clock()
        with self._conn.write() as db:
            row = self._row(db, execution_id)
            if row.status not in TERMINAL:
                waiters.register(db, self._sql, waiters.EXECUTION, execution_id, waiter, now)
        return self._as_of(row, now)

    def claim_due(self, *, limit, duration, now=None, workflows=None) -> list[ExecutionLease]:
        return [claimed.lease for claimed in self.claim_deliveries(limit=limit, duration=duration, now=now,
                                                                   workflows=workflows)]

    def claim_deliveries(self, *, limit, duration, now=None, workflows=None) -> list[Claimed]:
        arguments.integer("limit", limit, minimum=0)
        arguments.integer("duration", duration, minimum=1)
        workflows = arguments.workflows("workflows", workflows)
        given, now = now, self._now(now)
        if limit == 0 or workflows is not None and not workflows:
            return []
        # Look before taking the write lock: an idle supervisor's empty poll then costs a read,
        # and does not queue behind (or hold up) other processes' writes. A backend with row
        # locks (PostgreSQL) has no such lock to spare: its claim skips the rows others hold.
        # Right after a claim that found work, more is likely: the look would only cost a read.
        if self._conn.whole_database_write_lock and not self._last_claim_found:
            with self._conn.read() as db:
                if not self._claimable(db, now, limit, workflows=workflows):
                    return []
        return self._acknowledge_and_claim([], given, limit=limit, duration=duration, workflows=workflows)[1]

    def _claim_in(self, db: Transaction, now: int, limit: int, duration: int,
                  workflows: Optional[frozenset[str]] = None) -> list[Claimed]:
        claimed, opened = [], []
        rows, capacity = self._pick(db, now, limit, lock=True, workflows=workflows)
        for row in rows:
            at = self._stamp(row, now)
            unacked, ended_at = row.unacknowledged_deliveries, row.delivery_ended_at
            if row.status == RUNNING:
                # The previous delivery's lease expired; this claim supersedes it.
                unacked += 1
                ended_at = row.lease_expires_at
                db.execute(
                    self._sql[HISTORY_CLOSE],
                    (ended_at, DeliveryEnd.SUPERSEDED.value, None, ended_at, row.execution_id, row.token),
                )
            token = row.token + 1
            expires = at + duration
            # A running row is always due (claimed when due; wakes only move due_at earlier),
            # so while the lease lasts its expiry plus the redelivery delay decides.
            ready = max(row.due_at, expires + self._delay(unacked + 1))
            db.execute(self._sql[CLAIM], (expires, unacked, ended_at, ready, at, row.execution_id))
            opened.append((row.execution_id, token, self._holder, at, expires))
            due = max(row.due_at, row.lease_expires_at) if row.status == RUNNING else row.due_at
            claimed.append(Claimed(ExecutionLease(row.execution_id, token, expires), row.workflow,
                                   row.input_json if token == 1 else None, trace_context=row.trace_context,
                                   queue=row.queue, due_at=due))
            if row.queue in capacity and capacity[row.queue].rate_limited:
                db.execute(self._sql[queues.RATE_CLAIMED], (row.queue, now))
        self._fence_lapsed(db, now, {row.queue for row in rows if row.queue in capacity
                                     and capacity[row.queue].counts_live})
        for start in range(0, len(opened), HISTORY_OPEN_ROWS):
            rows = opened[start:start + HISTORY_OPEN_ROWS]
            db.execute(self._sql[history_open(len(rows))], [value for row in rows for value in row])
        return claimed

    def _fence_lapsed(self, db: Transaction, now: int, limited: set[str]) -> None:
        """End the run-out deliveries of the `limited` queues this claim took slots of (END_LAPSED):
        each ends expired, at its lease's expiry, and its holder's later writes are refused. (The
        claim's own rows hold fresh leases by now.)"""
        for queue in sorted(limited):
            for eid, token, ended_at in db.execute(self._sql[END_LAPSED], (now, queue, now)).fetchall():
                db.execute(self._sql[HISTORY_CLOSE],
                           (ended_at, DeliveryEnd.EXPIRED.value, None, ended_at, eid, token))

    def renew(self, lease, *, duration, now=None) -> Renewed | LeaseLost:
        lease = self._lease(lease)
        arguments.integer("duration", duration, minimum=1)
        return self._renew(lease, duration, now, renewal_lock_wait_ms(duration))

    def _renew(self, lease: ExecutionLease, duration: int, given: Optional[int], lock_wait_ms: int
               ) -> Renewed | LeaseLost:
        """`renew` of checked arguments, waiting at most `lock_wait_ms` for the row's lock."""
        now = self._now(given)
        with self._conn.write(lock_wait_ms=lock_wait_ms) as db:
            now = self._now_locked(given, now)
            expires = now + duration
            cursor = db.execute(self._sql[RENEW], (expires, expires, now, lease.execution_id, lease.token, now))
            if cursor.rowcount != 1:
                return LeaseLost()
            db.execute(self._sql[HISTORY_RENEWED], (expires, lease.execution_id, lease.token))
        return Renewed(ExecutionLease(lease.execution_id, lease.token, expires))

    def renew_many(self, leases, *, duration, now=None) -> list[Renewed | LeaseLost | StorageBusy]:
        if isinstance(leases, (str, bytes)) or not hasattr(leases, "__iter__"):
            raise arguments.InvalidArgument(f"leases must be a sequence of ExecutionLease, not {type(leases).__name__}")
        leases = [self._lease(lease) for lease in leases]
        arguments.integer("duration", duration, minimum=1)
        given = now
        self._now(now)
        renewed: dict[tuple[str, int], ExecutionLease] = {}
        maybe_held: list[ExecutionLease] = []  # current, but skipped: another transaction holds the row
        for start in range(0, len(leases), RENEW_MANY_LEASES):
            some = leases[start:start + RENEW_MANY_LEASES]
            chunk, held = self._renew_chunk(some, duration, given)
            renewed.update(chunk)
            maybe_held += held
        # The skipped rows are renewed one by one, all of them within one lock wait: rows held by
        # one stuck transaction (a cut-off host's batch of step writes holds many) must not cost a
        # lock wait each, and the round's next renewals with them. Once the wait is spent, each
        # row gets a try of a millisecond (`lock_timeout` 0 would be no bound at all).
        busy: dict[tuple[str, int], StorageBusy] = {}
        deadline = time.monotonic() + renewal_lock_wait_ms(duration) / 1000
        for lease in maybe_held:
            try:
                reply = self._renew(lease, duration, given, max(1, round((deadline - time.monotonic()) * 1000)))
            except StorageBusy as error:
                busy[lease.execution_id, lease.token] = error
                continue
            if isinstance(reply, Renewed):
                renewed[lease.execution_id, lease.token] = reply.lease
        replies: list[Renewed | LeaseLost | StorageBusy] = []
        for lease in leases:
            key = (lease.execution_id, lease.token)
            replies.append(Renewed(renewed[key]) if key in renewed else busy.get(key) or LeaseLost())
        return replies

    def _renew_chunk(self, leases: list[ExecutionLease], duration: int, given: Optional[int]
                     ) -> tuple[dict[tuple[str, int], ExecutionLease], list[ExecutionLease]]:
        """One transaction of `renew_many`: the leases it renewed, and the current ones it
        skipped because another transaction held their rows (never any on SQLite, whose write
        lock is the whole database's)."""
        pairs = [value for lease in leases for value in (lease.execution_id, lease.token)]
        with self._conn.write(lock_wait_ms=renewal_lock_wait_ms(duration)) as db:
            now = self._now_locked(given, self._now(given))
            expires = now + duration
            done = {(eid, token) for eid, token in
                    db.execute(self._sql[renew_many_statement(len(leases))], (expires, expires, now, *pairs, now))}
            if done:
                ids = [value for key in done for value in key]
                db.execute(self._sql[history_renewed_many(len(done))], (expires, *ids))
            missed = [lease for lease in leases if (lease.execution_id, lease.token) not in done]
            current: dict[str, tuple[int, str]] = {}
            if missed:
                ids = [lease.execution_id for lease in missed]
                for start in range(0, len(ids), CURRENT_TOKENS_IDS):
                    part = ids[start:start + CURRENT_TOKENS_IDS]
                    for eid, token, status in db.execute(self._sql[current_tokens(len(part))], part):
                        current[eid] = (token, status)
        held = [lease for lease in missed if current.get(lease.execution_id) == (lease.token, RUNNING)]
        return {key: ExecutionLease(key[0], key[1], expires) for key in done}, held

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

    def acknowledge_and_claim(self, acknowledgements, *, limit, duration, now=None, workflows=None):
        replies, claimed = self.acknowledge_and_claim_deliveries(acknowledgements, limit=limit, duration=duration,
                                                                  now=now, workflows=workflows)
        return replies, [each.lease for each in claimed]

    def acknowledge_and_claim_deliveries(self, acknowledgements, *, limit, duration, now=None, workflows=None):
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
        workflows = arguments.workflows("workflows", workflows)
        if workflows is not None and not workflows:
            limit = 0  # serving no workflow claims nothing
        return self._acknowledge_and_claim(checked, now, limit=limit, duration=duration, workflows=workflows)

    def _acknowledge_and_claim(self, checked: list[Acknowledgement], now: Optional[int], *, limit: int = 0,
                               duration: int = 0, workflows: Optional[frozenset[str]] = None):
        """Checked acknowledgements, then a claim of up to `limit` leases of
        `duration` (of `workflows`, a non-empty set, or any when None), in one transaction; the
        announcements after its commit."""
        given, now = now, self._now(now)
        with self._conn.write(flush=limit > 0) as db:  # claims are durable before they are handed out
            now = self._now_locked(given, now)
            replies = [self._acknowledge_in(db, acknowledgement, now) for acknowledgement in checked]
            by_outcome: dict[str, list[ExecutionLease]] = {}  # the deliveries acknowledged, by outcome
            for acknowledgement, reply in zip(checked, replies):
                if not isinstance(reply, LeaseLost):
                    by_outcome.setdefault(acknowledgement.status, []).append(acknowledgement.lease)
            for status, acknowledged in by_outcome.items():
                self._history_end(db, now, DeliveryEnd.ACKNOWLEDGED, status, acknowledged)
            ended = ended_executions(checked, replies)
            # Executions waiting for these to finish (ctx.wait_for) are woken with them, all at once.
            woke = waiters.wake_all(db, self._sql, waiters.EXECUTION, ended, now, self.wake_in)
            claimed = self._claim_in(db, now, limit, duration, workflows) if limit else []
        if limit:
            self._last_claim_found = bool(claimed)
        self._announce_acknowledged(ended, woke)
        return replies, claimed

    def _acknowledgement(self, lease, outcome) -> Acknowledgement:
        return Acknowledgement.of(self._lease(lease), outcome, max_payload_bytes=self._max_payload)

    def _acknowledge_in(self, db: Transaction, acknowledgement: Acknowledgement, now: int) -> Outcome | LeaseLost:
        """Acknowledge in the open transaction, fenced as `_end` is; the lease history and the
        waiters are the caller's, for the whole batch at once."""
        sql, params = acknowledgement.statement(now)
        if db.execute(self._sql[sql], params).rowcount != 1:
            return LeaseLost()
        if acknowledgement.diverged is not None:  # parked: say why, for waiting_for and unpark
            db.execute(self._sql[parking.PARK], (now, acknowledgement.diverged, acknowledgement.lease.execution_id))
        return acknowledgement.outcome

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
        if db.execute(self._sql[sql], params + (lease.execution_id, lease.token)).rowcount != 1:
            return False
        self._history_end(db, now, how, outcome, [lease])
        return True

    def _history_end(self, db: Transaction, now: int, how: DeliveryEnd, outcome: Optional[str],
                     leases: list[ExecutionLease]) -> None:
        """Record in the lease history that the deliveries of `leases` ended `how` at `now`."""
        for start in range(0, len(leases), HISTORY_END_ROWS):
            some = leases[start:start + HISTORY_END_ROWS]
            db.execute(self._sql[history_end(len(some))],
                       (now, how.value, outcome, *(value for lease in some for value in (lease.execution_id, lease.token))))

    def next_ready_at(self, *, workflows=None) -> Optional[int]:
        """The earliest time any execution (of `workflows`, when given) may be claimed (it may be
        past), or None if none ever will be without a new admission or wake. Running executions
        count at their lease's expiry plus the redelivery delay."""
        workflows = arguments.workflows("workflows", workflows)
        if workflows is None:
            return self._conn.execute(self._sql[NEXT_READY]).fetchone()[0]
        if not workflows:
            return None
        names, times = sorted(workflows), []
        for start in range(0, len(names), NEXT_READY_WORKFLOWS):
            some = names[start:start + NEXT_READY_WORKFLOWS]
            times.append(self._conn.execute(self._sql[next_ready_of(len(some))], some + some).fetchone()[0])
        return min((at for at in times if at is not None), default=None)

    def ended(self, leases, *, now=None) -> list[ExecutionLease]:
        """The leases among `leases` whose delivery has ended: cancelled, acknowledged,
        released, or claimed again after it expired. A supervisor asks every heartbeat, so that
        a child whose execution was cancelled is stopped at once, not at the next renewal."""
        leases = [self._lease(lease) for lease in leases]
        self._now(now)
        current: dict[str, tuple[int, str]] = {}
        with self._conn.read() as db:
            for start in range(0, len(leases), CURRENT_TOKENS_IDS):
                ids = [lease.execution_id for lease in leases[start:start + CURRENT_TOKENS_IDS]]
                for eid, token, status in db.execute(self._sql[current_tokens(len(ids))], ids):
                    current[eid] = (token, status)
        return [lease for lease in leases if current.get(lease.execution_id) != (lease.token, RUNNING)]


@functools.lru_cache(maxsize=64)
def renew_many_statement(count: int) -> str:
    """RENEW_MANY for `count` leases."""
    return RENEW_MANY.format(leases=", ".join(["($p, $p)"] * count))


NEXT_READY_WORKFLOWS = 200  # workflows per statement, as `execution_rows.CLAIM_WORKFLOWS`


@functools.lru_cache(maxsize=64)
def next_ready_of(count: int) -> str:
    """The earliest ready time of `count` named workflows (their names are its parameters, twice:
    once for the waiting rows, a seek each, once for the running ones)."""
    arms = [_NEXT_WAITING_OF] * count + [_NEXT_RUNNING_OF.format(names=", ".join(["$p"] * count))]
    return f"SELECT min(ready) FROM ({' UNION ALL '.join(arms)}) AS each_workflow"


@functools.lru_cache(maxsize=64)
def current_tokens(count: int) -> str:
    """CURRENT_TOKENS for `count` executions."""
    return CURRENT_TOKENS.format(ids=", ".join(["$p"] * count))
