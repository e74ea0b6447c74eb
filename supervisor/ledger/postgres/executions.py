"""The executions table on PostgreSQL: the shared table (`supervisor.ledger.tables.executions`)
with its two hottest steps made one statement each.

The shared statements are written so that SQLite, which has no data-modifying `WITH`, can run
them; a batch of acknowledgements and claims then costs PostgreSQL one round trip per
acknowledgement, per claimed row, per kind of lease history change and for the waiters and the
announcement. Here each half of a batch is one statement, whatever its size:

- `ACKNOWLEDGE`: the fenced updates of every acknowledgement (each by its own token; the
  rows it returns are the ones that were current), the end of their deliveries in the lease
  history, the waiters of the executions they ended (deleted as they are read: the caller wakes
  them), and the `yieldstar_ended` announcement, which PostgreSQL delivers at the commit, as the
  shared table's announcement after the commit would be.
- `CLAIM`: the claimable rows (locked, skipping rows other claimers hold), their new tokens and
  leases, the superseded deliveries closed and the new ones opened in the lease history.

Both compute what the shared table computes in Python, in SQL, with the same rules; the
contract tests run against both backends, and the replies, rows and history they check are the
same. The statements are in the ledger's statement form (`?` parameters), made PostgreSQL's by
the connection like every other (`connection.translate`).
"""

from __future__ import annotations

import functools

from ..connection import Transaction
from ..tables import waiters
from ..tables.executions import ExecutionTable
from ..tables.execution_rows import COLUMNS
from ..values import Claimed, DeliveryEnd, ExecutionLease, LeaseLost
from . import notify

# `{rows}`: one "(?, ?, ?, ?, ?)" per acknowledgement, typed by the first (`acknowledge`).
# Each acknowledgement is (execution_id, token, status, result_json, error_json); a Suspended()
# one keeps its results and waits for the wake its delivery asked for (`wake_during_lease`).
ACKNOWLEDGE = """
WITH acks (execution_id, token, status, result_json, error_json) AS (VALUES {rows}),
acknowledged AS (
    UPDATE executions e SET status = a.status,
        ever_suspended = CASE WHEN a.status = 'suspended' THEN 1 ELSE e.ever_suspended END,
        result_json = CASE WHEN a.status = 'suspended' THEN e.result_json ELSE a.result_json END,
        error_json = CASE WHEN a.status = 'suspended' THEN e.error_json ELSE a.error_json END,
        lease_expires_at = NULL, unacknowledged_deliveries = 0, delivery_ended_at = NULL,
        due_at = CASE WHEN a.status = 'suspended' THEN e.wake_during_lease END,
        ready_at = CASE WHEN a.status = 'suspended' THEN e.wake_during_lease END,
        wake_during_lease = NULL, updated_at = ?
    FROM acks a
    WHERE e.execution_id = a.execution_id AND e.token = a.token AND e.status = 'running'
    RETURNING e.execution_id, e.token, a.status),
history AS (
    UPDATE lease_history h SET ended_at = ?, ended_by = ?, outcome = d.status
    FROM acknowledged d WHERE h.execution_id = d.execution_id AND h.token = d.token),
woken AS (
    DELETE FROM waiters w USING acknowledged d
    WHERE w.kind = ? AND w.target = d.execution_id AND d.status <> 'suspended'
    RETURNING w.waiter),
announced AS (
    SELECT pg_notify(?, CASE WHEN octet_length(string_agg(execution_id, E'\\n')) <= {max_payload}
        THEN string_agg(execution_id, E'\\n') ELSE '' END)
    FROM acknowledged WHERE status <> 'suspended' HAVING count(*) > 0)
SELECT 'acknowledged', execution_id, token FROM acknowledged
UNION ALL SELECT 'woken', waiter, NULL FROM woken
UNION ALL SELECT 'announced', NULL, NULL FROM announced"""
ACKNOWLEDGE_ROWS = 64

# The shared `_CLAIMABLE` (due rows earliest first, ties in admission order, then every running
# row whose lease expired and whose redelivery delay passed), the first `limit` of them by due
# time claimed. A superseded delivery (`status = 'running'`) counts as unacknowledged and ends
# when its lease expired. `{at}`: when each claim takes effect (`ExecutionTable(one_clock=)`).
CLAIM = f"""
WITH picked AS MATERIALIZED (
    SELECT *, {{at}} AS at,
        unacknowledged_deliveries + CASE WHEN status = 'running' THEN 1 ELSE 0 END AS unacked,
        CASE WHEN status = 'running' THEN lease_expires_at ELSE delivery_ended_at END AS ended_at
    FROM (
        SELECT * FROM (
            SELECT 0 AS part, seq, {COLUMNS} FROM executions
            WHERE ready_at IS NOT NULL AND status <> 'running' AND due_at <= ? AND ready_at <= ?
            ORDER BY due_at, seq LIMIT ? FOR UPDATE SKIP LOCKED) AS due
        UNION ALL
        SELECT * FROM (
            SELECT 1, seq, {COLUMNS} FROM executions
            WHERE status = 'running' AND ready_at <= ? FOR UPDATE SKIP LOCKED) AS expired
        ORDER BY due_at, part, seq LIMIT ?) AS claimable),
claimed AS (
    UPDATE executions e SET token = p.token + 1, status = 'running', lease_expires_at = p.at + ?,
        unacknowledged_deliveries = p.unacked, delivery_ended_at = p.ended_at, wake_during_lease = NULL,
        ready_at = GREATEST(p.due_at, p.at + ? + yieldstar_delay(p.unacked + 1)), updated_at = p.at
    FROM picked p WHERE e.execution_id = p.execution_id
    RETURNING e.execution_id, e.token, e.lease_expires_at, e.updated_at, p.workflow, p.input_json, p.due_at,
        p.part, p.seq),
superseded AS (
    UPDATE lease_history h SET ended_at = p.lease_expires_at, ended_by = ?, outcome = NULL,
        expires_at = p.lease_expires_at
    FROM picked p WHERE p.status = 'running' AND h.execution_id = p.execution_id AND h.token = p.token),
opened AS (
    INSERT INTO lease_history (execution_id, token, holder, claimed_at, expires_at)
    SELECT execution_id, token, ?, updated_at, lease_expires_at FROM claimed)
SELECT execution_id, token, lease_expires_at, workflow, input_json FROM claimed ORDER BY due_at, part, seq"""


@functools.lru_cache(maxsize=ACKNOWLEDGE_ROWS)
def acknowledge(count: int) -> str:
    """ACKNOWLEDGE for `count` acknowledgements."""
    rows = ["(?::text, ?::bigint, ?::text, ?::text, ?::text)"] + ["(?, ?, ?, ?, ?)"] * (count - 1)
    return ACKNOWLEDGE.format(rows=", ".join(rows), max_payload=notify.MAX_PAYLOAD)


@functools.lru_cache(maxsize=2)
def claim(one_clock: bool) -> str:
    """CLAIM, each claim at the claimer's time, or with `one_clock` no earlier than the row's
    last change."""
    return CLAIM.format(at="GREATEST(?::bigint, updated_at)" if one_clock else "?::bigint")


class PostgresExecutionTable(ExecutionTable):
    def _acknowledge_all(self, db: Transaction, checked: list[tuple], now: int) -> tuple[list, list[str], bool]:
        """As the shared table's, in one statement per ACKNOWLEDGE_ROWS acknowledgements. The
        executions ended are announced in the transaction, so none are left for after it."""
        # One acknowledgement of a delivery stands for it in the statement: a repeat finds the
        # delivery ended by the first, as it would one statement later (LeaseLost), whether the
        # first was current or not.
        first: dict[tuple[str, int], int] = {}
        for i, (lease, _, _, _) in enumerate(checked):
            first.setdefault((lease.execution_id, lease.token), i)
        chosen = list(first.values())
        current: set[tuple[str, int]] = set()
        woken: list[str] = []
        for start in range(0, len(chosen), ACKNOWLEDGE_ROWS):
            some = [checked[i] for i in chosen[start:start + ACKNOWLEDGE_ROWS]]
            # A terminal outcome's fields are (status, result_json, error_json); Suspended() has none.
            params = [value for lease, outcome, _, fields in some
                      for value in (lease.execution_id, lease.token, *(fields or (outcome.status, None, None)))]
            params += [now, now, DeliveryEnd.ACKNOWLEDGED.value, waiters.EXECUTION, notify.ENDED]
            for kind, name, token in db.execute(acknowledge(len(some)), params).fetchall():
                if kind == "acknowledged":
                    current.add((name, token))
                elif kind == "woken":
                    woken.append(name)
        replies = []
        for i, (lease, outcome, _, _) in enumerate(checked):
            key = (lease.execution_id, lease.token)
            replies.append(outcome if first[key] == i and key in current else LeaseLost())
        woke = False
        for waiter in woken:
            woke = self.wake_in(db, waiter, now, now) or woke
        return replies, [], woke

    def _claim_in(self, db: Transaction, now: int, limit: int, duration: int) -> list[Claimed]:
        """As the shared table's, in one statement."""
        rows = db.execute(claim(self._one_clock), (now, now, now, limit, now, limit, duration, duration,
                                                   DeliveryEnd.SUPERSEDED.value, self._holder)).fetchall()
        return [Claimed(ExecutionLease(execution_id, token, expires), workflow, input_json if token == 1 else None)
                for execution_id, token, expires, workflow, input_json in rows]

