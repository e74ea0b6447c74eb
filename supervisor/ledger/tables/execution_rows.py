"""The `executions` table's rows: their columns and statuses, the statements that read one row, admit
one or wake one, and how a stored row reads as of a time (`ExecutionRows`, which both halves of
the executions client build on: `leases` and `operators`).

`starts` admits children with these statements and `waiters` checks that a waiter is admitted,
without either importing the executions client.

How a row is stored versus how it reads:

- `status = 'running'` means a delivery with the current `token` has not ended by a release,
  an acknowledgement or a later claim. Its lease is *live* only while `lease_expires_at > now`.
  Expiry is never written when it happens (nothing runs then); every reader works out the row
  "as of now" instead (`ExecutionRows._as_of`), and the next claim records it in the lease history.
- `ready_at` is the earliest time the row may be claimed, kept up to date by every write:
  due time, redelivery delay and, for a running row, lease expiry folded into one column so
  that `claim_due` is a single index range scan. NULL means never (terminal or not due).
"""

from __future__ import annotations

import functools
import os
import socket
from typing import Callable, Optional

from .. import arguments
from ..connection import Connection, Transaction
from ..errors import UnknownExecution
from ..values import TERMINAL_STATUSES, WORKFLOWS_TIMEOUT, ExecutionLease, ExecutionRecord, ExecutionStatus
from . import parking, queues
from .epochs import FLOOR

RUNNING = ExecutionStatus.RUNNING.value
ADMITTED = ExecutionStatus.ADMITTED.value
SUSPENDED = ExecutionStatus.SUSPENDED.value
CANCELLED = ExecutionStatus.CANCELLED.value
FAILED = ExecutionStatus.FAILED.value
TERMINAL = TERMINAL_STATUSES  # in SQL, the dialect's `$terminal`
RESUMABLE = (FAILED, CANCELLED)

COLUMNS = (
    "execution_id, workflow, input_json, status, token, due_at, lease_expires_at,"
    " unacknowledged_deliveries, delivery_ended_at, ever_suspended, wake_during_lease,"
    " result_json, error_json, created_at, updated_at, queue, queue_key, priority, timeout_ms, deadline_at,"
    " trace_context"
)
SELECT_ONE = f"SELECT {COLUMNS} FROM executions WHERE execution_id = $p"
# Every read that a write transaction decides on locks the rows it reads (`$for_update`: a clause
# on PostgreSQL, nothing on SQLite, whose write transactions take the whole database's write
# lock), so that on PostgreSQL, too, no other writer changes them in between.
LOCKED = " $for_update"
SELECT_ONE_LOCKED = SELECT_ONE + LOCKED

# A new execution's token is the current epoch's floor (0 until a restore or a failover raised
# the epoch: see `epochs`), so that its first claim issues a token no earlier epoch issued.
INSERT = f"""
INSERT INTO executions (execution_id, workflow, input_json, status, token, due_at,
    unacknowledged_deliveries, ever_suspended, ready_at, created_at, updated_at, queue, queue_key, priority,
    defaults_pending, timeout_ms, deadline_at, trace_context)
VALUES ($p, $p, $p, 'admitted', {FLOOR}, $p, 0, 0, $p, $p, $p, $p, $p, $p, $p, $p, $p, $p)
ON CONFLICT (execution_id) DO NOTHING"""


def insert(db: Transaction, sql, execution_id: str, workflow: str, input_json: str, now: int, *,
           queue: Optional[str], key: Optional[str], priority: Optional[int], take_turns: bool,
           timeout_ms: Optional[int] | object = None, trace_context: Optional[str] = None) -> bool:
    """Admit a new execution, due now, in the write transaction `db`, unless its id is taken;
    whether it was. A `queue` or `priority` of None is its workflow's recorded default
    (`queues.defaults_for`; `take_turns` on PostgreSQL, where a record of the defaults must not
    slip in between). With `timeout_ms` (or WORKFLOWS_TIMEOUT: the workflow's recorded one, if
    any; before any record, the first record's), its deadline is `now + timeout_ms` (the
    workflow timeout, SPEC section 12).
    `trace_context`: the starter's trace context, handed to every delivery (`Claimed`)."""
    queue, priority, default_timeout, pending = queues.defaults_for(
        db, sql, workflow, queue, priority, take_turns=take_turns, timeout=timeout_ms is WORKFLOWS_TIMEOUT)
    if timeout_ms is WORKFLOWS_TIMEOUT:
        timeout_ms = default_timeout
    deadline = None if timeout_ms is None else now + timeout_ms
    return db.execute(sql[INSERT], (execution_id, workflow, input_json, now, now, now, now, queue, key, priority,
                                    pending, timeout_ms, deadline, trace_context)).rowcount == 1


# Claimable rows (`ExecutionRows._pick`, whose steps `queues` describes): the due rows of a group,
# by priority (higher first), then earliest due first, at most what its queue may still take (`$p` after
# LIMIT), leaving out the keys already at the queue's `per_key` (`{keys}`); ties come out in rowid
# (admission) order, as the index stores them. Those still in their redelivery delay are stepped
# over. `{lock}` is where the claim takes its row locks.
# One (workflow, queue) group's, by the index of (workflow, queue, priority DESC, due_at), in its
# order (said in full, fixed columns included, as `queues` says why): due executions of workflows
# a supervisor does not serve (routing), or of saturated queues, however many, are never read.
_DUE_OF = f"""
SELECT * FROM (
    SELECT {COLUMNS}, 0 AS part, $row_order AS seq FROM executions $by_executions_claimable_by_workflow
    WHERE workflow = $p AND queue = $p AND ready_at IS NOT NULL AND status <> 'running'
        AND due_at <= $p AND ready_at <= $p{{keys}}
    ORDER BY workflow, queue, priority DESC, due_at LIMIT $p{{lock}}) AS due{{i}}"""
# One key's rows of a group (`{key}`: "= $p", or "IS NULL" for the rows without one), by the index
# of (queue, queue_key, workflow, priority DESC, due_at), in its order: what a group whose queue
# holds saturated keys is read by, so that their backlog is never read.
_DUE_OF_KEY = f"""
SELECT * FROM (
    SELECT {COLUMNS}, 0 AS part, $row_order AS seq FROM executions $by_executions_claimable_by_key
    WHERE queue = $p AND queue_key {{key}} AND workflow = $p AND ready_at IS NOT NULL AND status <> 'running'
        AND due_at <= $p AND ready_at <= $p
    ORDER BY queue, queue_key, workflow, priority DESC, due_at LIMIT $p{{lock}}) AS due{{i}}"""
KEY_ARM, NO_KEY_ARM = -1, -2  # the shapes of `_DUE_OF_KEY`'s arms in `claimable_statement`
# Running rows whose lease expired and whose redelivery delay passed: few (those of dead holders),
# so a workflow filter on them reads no more.
_EXPIRED = f"""
SELECT * FROM (
    SELECT {COLUMNS}, 1 AS part, $row_order AS seq FROM executions $by_executions_expiring
    WHERE status = 'running' AND ready_at <= $p{{only}}{{lock}}) AS expired"""
SKIP_LOCKED = " $skip_locked"
# How many groups one claim statement seeks, at most (SQLite allows 500 arms in a UNION): a claim
# of more is made of several statements, merged by priority and due time; and how many workflows
# one statement of expired rows names.
CLAIM_GROUPS = 200
CLAIM_WORKFLOWS = 200


@functools.lru_cache(maxsize=256)
def claimable_statement(arms: tuple[int, ...], lock: bool, expired: int) -> str:
    """The due rows of `len(arms)` groups, each leaving out as many keys as its arm says (or, for
    KEY_ARM and NO_KEY_ARM, of one key of a group); with the expired leases of `expired` named
    workflows (0: of any; -1: none)."""
    lock_clause = SKIP_LOCKED if lock else ""
    parts = []
    for i, keys in enumerate(arms):
        if keys < 0:
            parts.append(_DUE_OF_KEY.format(key="= $p" if keys == KEY_ARM else "IS NULL", lock=lock_clause, i=i))
            continue
        skipped = "" if not keys else " AND (queue_key IS NULL OR queue_key NOT IN ({}))".format(
            ", ".join(["$p"] * keys))
        parts.append(_DUE_OF.format(keys=skipped, lock=lock_clause, i=i))
    if expired >= 0:
        only = "" if expired == 0 else " AND workflow IN ({})".format(", ".join(["$p"] * expired))
        parts.append(_EXPIRED.format(only=only, lock=lock_clause))
    return "\nUNION ALL".join(parts)


def due_parameters(workflow: str, queue: str, keys: list[str], now: int, limit: int) -> tuple:
    return (workflow, queue, now, now, *keys, limit)


def key_arms(workflow: str, queue: str, room: "queues.Capacity", keys: list[str], now: int, limit: int
             ) -> list[tuple[int, tuple]]:
    """The arms that read a group key by key: the rows without a key, and those of each of `keys`
    (all of the queue's) that is not saturated, each at most what its key may still take."""
    arms = [(NO_KEY_ARM, (queue, workflow, now, now, limit))]
    for key in keys:
        left = min(limit, room.per_key - room.live_by_key.get(key, 0))
        if left > 0:
            arms.append((KEY_ARM, (queue, key, workflow, now, now, left)))
    return arms


def _rows(cursor) -> list[tuple["Row", int, int]]:
    """A claimable statement's rows: each as a `Row`, its part (0 due, 1 expired) and admission order."""
    return [(Row(row[:-2]), row[-2], row[-1]) for row in cursor.fetchall()]


WAKE = """
UPDATE executions SET due_at = $p, wake_during_lease = $p, ready_at = $p, updated_at = $p
WHERE execution_id = $p"""


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Row:
    """A stored executions row, by column name."""

    __slots__ = COLUMNS.replace(",", " ").split()

    def __init__(self, row: tuple):
        for name, value in zip(self.__slots__, row):
            setattr(self, name, value)


class ExecutionRows:
    """What both halves of the executions client share: its state, its clock, and a stored row
    read, stamped and woken by the same rules."""

    def __init__(self, conn: Connection, clock: Callable[[], int], delay: Callable[[int], int],
                 on_due: Callable[[], None] = lambda: None, on_ended: Callable[[list[str]], None] = lambda ids: None,
                 one_clock: bool = False, max_payload_bytes: int = arguments.DEFAULT_MAX_PAYLOAD_BYTES):
        """`one_clock`: the processes' clocks are estimates of one clock, each a little behind it
        (by its own amount). A claim, a wake and a resume then stamp no time before the row's last
        change (which another process may have stamped a millisecond ahead of this one's
        estimate: `_stamp`), so that an execution's lease history reads in the order of its
        commits: a delivery that ended, then the claim that followed it, even with a wake from a
        process behind between them."""
        self._conn = conn
        self._sql = conn.dialect.statements  # this backend's form of each statement
        self._max_payload = max_payload_bytes  # the size limit of an input, result or error
        self._one_clock = one_clock
        self._on_due = on_due  # told after a commit that may have made an execution due
        self._on_ended = on_ended  # told the ids after a commit that made executions terminal
        self._clock = clock
        self._delay = delay
        self._holder = _holder()
        self._last_claim_found = False  # whether the last claim made here claimed anything

    def _now(self, now: Optional[int]) -> int:
        if now is None:
            return self._clock()
        return arguments.integer("now", now)

    def _now_locked(self, now: Optional[int], checked: int) -> int:
        """The time of a write, read again once the write lock is held when the caller gave
        none: a call that waited for the lock must not record a time from before it got it
        (the lease history's order would then disagree with the commit order)."""
        return checked if now is not None else self._clock()

    def _stamp(self, row: Row, now: int) -> int:
        """The time a change of `row` made at `now` records: with `one_clock`, never before the
        row's last change, so that `updated_at` never moves back."""
        return max(now, row.updated_at) if self._one_clock else now

    def _lease(self, lease: object) -> ExecutionLease:
        return arguments.lease("lease", lease)

    def _as_of(self, row: Row, now: int) -> ExecutionRecord:
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
            queue=row.queue,
            key=row.queue_key,
            priority=row.priority,
            deadline_at=row.deadline_at,
        )

    def _ready_at(self, due: Optional[int], unacked: int, ended_at: Optional[int]) -> Optional[int]:
        """When a row with no open delivery becomes claimable."""
        if due is None:
            return None
        if unacked == 0:
            return due
        return max(due, ended_at + self._delay(unacked))

    def wake_in(self, db: Transaction, execution_id: str, at: int, now: int) -> bool:
        """`request_wake` inside a write transaction the caller holds; False for a terminal one."""
        row = self._row(db, execution_id)
        if row.status in TERMINAL:
            return False
        due = at if row.due_at is None else min(row.due_at, at)
        if row.status == RUNNING:
            # Remembered for after this delivery: an acknowledged suspension makes it the due
            # time; a release or expiry leaves it owed in due_at. The lease (live, or expired
            # and waiting out its redelivery delay) still decides ready_at.
            wake = at if row.wake_during_lease is None else min(row.wake_during_lease, at)
            ready = row.lease_expires_at + self._delay(row.unacknowledged_deliveries + 1)
            db.execute(self._sql[WAKE], (due, wake, max(due, ready), self._stamp(row, now), execution_id))
        else:
            if row.status == SUSPENDED and row.due_at is None:
                # It may be parked (`parking`): woken, it is parked no more. Only a row that was
                # not due pays this lookup, and only its first wake.
                db.execute(self._sql[parking.FORGET], (row.workflow, execution_id))
            ready = self._ready_at(due, row.unacknowledged_deliveries, row.delivery_ended_at)
            db.execute(self._sql[WAKE], (due, None, ready, self._stamp(row, now), execution_id))
        return True

    def _claimable(self, db, now: int, limit: int, *, lock: bool = False,
                   workflows: Optional[frozenset[str]] = None) -> list[Row]:
        """Up to `limit` claimable rows, by priority (higher first) then due time, of `workflows`
        (None: any), within their queues' limits (see `_pick`)."""
        return self._pick(db, now, limit, lock=lock, workflows=workflows)[0]

    def _pick(self, db, now: int, limit: int, *, lock: bool = False, workflows: Optional[frozenset[str]] = None
              ) -> tuple[list[Row], dict[str, queues.Capacity]]:
        """The rows a claim takes (`queues` tells the steps), and the limited queues' capacities
        (what remains of them after these rows); with `lock`, in the claim's write transaction:
        rows no other claimer holds (on PostgreSQL, each claimer skips the rows another has
        locked), the queues' rows locked before they are counted."""
        groups = self._groups(db, now, workflows)
        names = None if workflows is None else sorted(workflows)
        capacity, limited = {}, {}
        for _, queue, concurrency, per_key, rate_count, rate_ms, live, recent in groups:
            if queues.saturated(concurrency, rate_count, live, recent):
                capacity[queue] = queues.Capacity(queue, 0, per_key)  # nor an expired lease of it
            elif (concurrency, per_key, rate_count) != (None, None, None):
                limited[queue] = (concurrency, per_key, rate_count, rate_ms)
        capacity.update(queues.capacities(db, self._sql, limited, now, write=lock,
                                          lock_rows=lock and not self._conn.whole_database_write_lock))
        arms: list[tuple[int, tuple]] = []
        keys_of: dict[str, Optional[list[str]]] = {}
        for workflow, queue, *_ in groups:
            room = capacity.get(queue)
            most = limit if room is None or room.slots is None else min(limit, room.slots)
            if most <= 0:
                continue  # a saturated queue: its backlog is not read
            saturated = [] if room is None else room.saturated_keys()
            if saturated and queue not in keys_of:
                keys_of[queue] = self._keys(db, queue)
            if saturated and keys_of[queue] is not None:
                arms += key_arms(workflow, queue, room, keys_of[queue], now, most)
            else:
                arms.append((len(saturated), due_parameters(workflow, queue, saturated, now, most)))
        # The due rows of the groups with room, and the expired leases (few: those of dead
        # holders), in one statement per CLAIM_GROUPS groups, the expired ones with the first.
        found: list[tuple[Row, int, int]] = []
        for start in range(0, max(len(arms), 1), CLAIM_GROUPS):
            some = arms[start:start + CLAIM_GROUPS]
            expired = -1 if start else (len(names) if names is not None else 0)
            if expired > CLAIM_WORKFLOWS:  # too many names for one statement: by themselves
                for first in range(0, len(names), CLAIM_WORKFLOWS):
                    part = names[first:first + CLAIM_WORKFLOWS]
                    found += _rows(db.execute(self._sql[claimable_statement((), lock, len(part))], (now, *part)))
                expired = -1
            params = [value for _, each in some for value in each]
            if expired >= 0:
                params += [now, *(names or ())]
            if some or expired >= 0:
                found += _rows(db.execute(self._sql[claimable_statement(tuple(shape for shape, _ in some), lock,
                                                                        expired)], params))
        # An expired lease of a limited queue no group named: its limits too (rare).
        unknown = {row.queue for row, part, _ in found if part == 1} - set(capacity) - {group[1] for group in groups}
        if unknown:
            capacity.update(queues.capacities(db, self._sql, queues.read_limits(db, self._sql, list(unknown)), now,
                                              write=lock, lock_rows=lock and not self._conn.whole_database_write_lock))
        # By priority, then due time; at equal ones, due rows before expired leases, then in
        # admission order.
        picked = []
        for row, _, _ in sorted(found, key=lambda each: (-each[0].priority, each[0].due_at, each[1], each[2])):
            room = capacity.get(row.queue)
            if room is None or room.take(row.queue_key):
                picked.append(row)
                if len(picked) == limit:
                    break
        return picked, capacity

    def _keys(self, db, queue: str) -> Optional[list[str]]:
        """The keys of `queue`'s claimable rows, or None if it holds KEYS_AT_MOST or more."""
        keys = [key for (key,) in db.execute(self._sql[queues.KEYS], (queue, queues.KEYS_AT_MOST)).fetchall()]
        return keys if len(keys) < queues.KEYS_AT_MOST else None

    def _groups(self, db, now: int, workflows: Optional[frozenset[str]]) -> list[tuple]:
        """The (workflow, queue) groups of claimable rows, of `workflows` (None: any), each with its
        queue's limits and counts: (workflow, queue, concurrency, per_key, rate_count, rate_ms,
        live leases, recent claims), see `queues.GROUPS`."""
        if workflows is None:
            return db.execute(self._sql[queues.GROUPS], (now, now)).fetchall()
        groups: list[tuple] = []
        names = sorted(workflows)
        for start in range(0, len(names), queues.GROUPS_WORKFLOWS):
            some = names[start:start + queues.GROUPS_WORKFLOWS]
            groups += db.execute(self._sql[queues.groups_of(len(some))], (*some, now, now)).fetchall()
        return groups

    def _row(self, db: Transaction, execution_id: str, *, lock: bool = True) -> Row:
        found = db.execute(self._sql[SELECT_ONE_LOCKED if lock else SELECT_ONE], (execution_id,)).fetchone()
        if found is None:
            raise UnknownExecution(f"execution_id {execution_id!r} is not admitted")
        return Row(found)

