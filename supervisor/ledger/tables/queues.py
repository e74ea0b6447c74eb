"""Queues and their limits (SPEC section 12): every statement for the `queues`, `queue_claims` and
`workflow_queues` tables, and the limit check a claim makes in its own transaction.

How a claim (`ExecutionRows._claimable`) picks its rows:

    groups     the (workflow, queue) groups that hold claimable rows, of each workflow served
               (or of each that has some): a loose scan of the claimable index, a seek per group
               (never the rows behind them), each with its queue's limits and, where a count
               decides them, its live leases and recent claims, counted in the same statement
    limits     the limits of the queues those counts leave room in (a saturated queue is passed
               over here, at no further cost), their rows locked in name order ($for_update: on
               PostgreSQL the claimers of one limited queue take turns; SQLite's write lock is
               the whole database's), then counted again: live leases (running, lease not
               expired: a dead holder's lease counts until it expires or ends), live leases per
               key, and claims within the rate window (`queue_claims`, pruned as it goes)
    seeks      the due rows of each group whose queue has capacity, by priority then due time,
               at most the capacity (keys already at `per_key` left out); a saturated queue's
               group is not read at all, so its backlog costs a claim nothing. A group whose
               queue holds saturated keys is read key by key instead (a seek per key of the
               queue, and one for the rows without a key), so that a hot key's backlog is not
               read either; unless the queue holds KEYS_AT_MOST keys or more, where the rows of
               the saturated keys are stepped over in the group's order
    take       the rows of all groups by priority (higher first), then due time, taken while
               their queue and key have room (`Capacity.take`)

Since the limits are read and the claim is written in one transaction holding the queue's row
(or the database), two claims never both see the same free slot.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Optional

from .. import arguments
from ..connection import Transaction
from ..contract import QueueClient
from ..errors import InvalidArgument
from ..values import QueueRecord
from .clocked import ClockedTable

DEFAULT_QUEUE = "default"
# Priorities fit PostgreSQL's and SQLite's integers with room: a 32-bit range.
MIN_PRIORITY, MAX_PRIORITY = -(2 ** 31), 2 ** 31 - 1

_CLAIMABLE = "ready_at IS NOT NULL AND status <> 'running'"
# The queues that hold claimable rows of each workflow served, by a loose scan of the index of
# (workflow, queue, priority DESC, due_at): each step one seek, to the next queue (the seed is '':
# queue names are never empty), whatever the priorities and the rows within a queue. Each seek
# orders by the index's own leading columns, the workflow's included although it is fixed: so
# PostgreSQL's planner takes the index whose order it is even without statistics, rather than
# the index of (workflow, ready_at) and a sort of all the workflow's rows.
_PAIRS_OF = f"""pairs (workflow, queue) AS (
    SELECT workflow, CAST('' AS TEXT) FROM served WHERE workflow IS NOT NULL
    UNION ALL
    SELECT pairs.workflow, (
        SELECT queue FROM executions $by_executions_claimable_by_workflow
        WHERE workflow = pairs.workflow AND {_CLAIMABLE} AND queue > pairs.queue ORDER BY workflow, queue LIMIT 1)
    FROM pairs WHERE pairs.queue IS NOT NULL)"""
# The (workflow, queue) pairs of every workflow, by one loose scan of the same index: each step
# finds the next pair's row (the next queue of the same workflow, else the first of the next
# workflow: a scalar subquery returns one column, so it names the row, read by its key). A
# comparison of the pair as a row value would let SQLite range on the workflow alone and read
# every row of it.
_PAIRS = f"""pairs (workflow, queue) AS (
    SELECT workflow, queue FROM executions WHERE execution_id = (
        SELECT execution_id FROM executions $by_executions_claimable_by_workflow WHERE {_CLAIMABLE}
        ORDER BY workflow, queue LIMIT 1)
    UNION ALL
    SELECT found.workflow, found.queue FROM pairs, executions found WHERE found.execution_id = coalesce(
        (SELECT execution_id FROM executions $by_executions_claimable_by_workflow
         WHERE workflow = pairs.workflow AND queue > pairs.queue AND {_CLAIMABLE} ORDER BY workflow, queue LIMIT 1),
        (SELECT execution_id FROM executions $by_executions_claimable_by_workflow
         WHERE workflow > pairs.workflow AND {_CLAIMABLE} ORDER BY workflow, queue LIMIT 1)))"""
_WITH_LIMITS = """
SELECT pairs.workflow, pairs.queue, q.concurrency, q.per_key, q.rate_count, q.rate_ms,
    CASE WHEN q.concurrency IS NOT NULL THEN (
        SELECT count(*) FROM executions $by_executions_running_by_queue
        WHERE queue = pairs.queue AND status = 'running' AND lease_expires_at > $p) END,
    CASE WHEN q.rate_count IS NOT NULL THEN (
        SELECT count(*) FROM queue_claims WHERE queue = pairs.queue AND claimed_at > $p - q.rate_ms) END
FROM pairs LEFT JOIN queues q ON q.name = pairs.queue WHERE pairs.queue IS NOT NULL AND pairs.queue <> ''"""
# Each group (a workflow's claimable rows in one queue) with its queue's limits (NULLs: none) and,
# for the limits a count decides, the count read without a lock (`$p`, `$p`: now): a queue these
# show saturated is passed over without a statement more (`saturated`), and the claim stays as
# cheap as if its backlog were not there. Only the queues with room are locked and counted again.
# In one statement: the common claim (no limits) pays no statement more for them. Of the
# workflows served (`{names}`: a "(CAST($p AS TEXT))" per workflow), or of any.
GROUPS_OF = f"""
WITH RECURSIVE served (workflow) AS (VALUES {{names}}),
{_PAIRS_OF}{_WITH_LIMITS}"""
GROUPS = f"""
WITH RECURSIVE {_PAIRS}{_WITH_LIMITS}"""
GROUPS_WORKFLOWS = 200  # workflows per GROUPS_OF statement

# The keys of a queue's claimable rows (of any workflow), by a loose scan of the index of (queue,
# queue_key, ...): a seek per key, however many rows each holds; at most `$p` keys (the last
# `$p`), so that a queue of many keys is not walked key by key at every claim (`KEYS_AT_MOST`).
KEYS = f"""
WITH RECURSIVE keys (queue_key, n) AS (
    SELECT CAST('' AS TEXT), 0
    UNION ALL
    SELECT (SELECT queue_key FROM executions $by_executions_claimable_by_key
            WHERE queue = $p AND queue_key > keys.queue_key AND {_CLAIMABLE} ORDER BY queue, queue_key LIMIT 1), keys.n + 1
    FROM keys WHERE keys.queue_key IS NOT NULL AND keys.n < $p)
SELECT queue_key FROM keys WHERE queue_key IS NOT NULL AND n > 0"""
KEYS_AT_MOST = 32

# `{names}`: a "$p" per queue. Locked in name order, the order every claim takes them in.
LIMITS = """
SELECT name, concurrency, per_key, rate_count, rate_ms FROM queues WHERE name IN ({names})
ORDER BY name{lock}"""
LIVE_BY_KEY = """
SELECT queue_key, count(*) FROM executions $by_executions_running_by_queue
WHERE queue = $p AND status = 'running' AND lease_expires_at > $p GROUP BY queue_key"""
RATE_PRUNE = "DELETE FROM queue_claims WHERE queue = $p AND claimed_at <= $p"
RATE_COUNT = "SELECT count(*) FROM queue_claims WHERE queue = $p AND claimed_at > $p"
RATE_CLAIMED = "INSERT INTO queue_claims (queue, claimed_at) VALUES ($p, $p)"

DECLARE = """
INSERT INTO queues (name, concurrency, per_key, rate_count, rate_ms, updated_at) VALUES ($p, $p, $p, $p, $p, $p)
ON CONFLICT (name) DO UPDATE SET concurrency = excluded.concurrency, per_key = excluded.per_key,
    rate_count = excluded.rate_count, rate_ms = excluded.rate_ms, updated_at = excluded.updated_at"""
FORGET = "DELETE FROM queues WHERE name = $p"
ALL_LIMITS = "SELECT name, concurrency, per_key, rate_count, rate_ms FROM queues"
# Per queue: due (claimable now), running (live leases) and waiting (not due: asleep or waiting).
COUNTS = f"""
SELECT queue,
    sum(CASE WHEN {_CLAIMABLE} AND due_at <= $p AND ready_at <= $p THEN 1
             WHEN status = 'running' AND lease_expires_at <= $p THEN 1 ELSE 0 END),
    sum(CASE WHEN status = 'running' AND lease_expires_at > $p THEN 1 ELSE 0 END),
    sum(CASE WHEN status NOT IN ($terminal) AND status <> 'running'
             AND NOT (ready_at IS NOT NULL AND due_at <= $p AND ready_at <= $p) THEN 1 ELSE 0 END)
FROM executions WHERE status NOT IN ($terminal) GROUP BY queue"""
RECORD_DEFAULTS = """
INSERT INTO workflow_queues (workflow, queue, priority, timeout_ms, updated_at) VALUES ($p, $p, $p, $p, $p)
ON CONFLICT (workflow) DO UPDATE SET queue = excluded.queue, priority = excluded.priority,
    timeout_ms = excluded.timeout_ms, updated_at = excluded.updated_at"""
# A workflow's defaults: its queue, priority and timeout (ms; NULL: none).
DEFAULTS_OF = "SELECT queue, priority, timeout_ms FROM workflow_queues WHERE workflow = $p"
# An execution admitted before any supervisor recorded its workflow's defaults goes to the
# default queue at priority 0 for now, `defaults_pending` saying which of the two its start left
# to the defaults (PENDING_QUEUE | PENDING_PRIORITY); the first record of the defaults moves it,
# unless a live lease holds it then (the queue's limits count that lease where it is: the next
# record moves it, if it is still not terminal). A start that left the timeout to its workflow
# (PENDING_TIMEOUT) takes the recorded one then, its deadline counted from its admission.
PENDING_QUEUE, PENDING_PRIORITY, PENDING_TIMEOUT = 1, 2, 4
TAKE_DEFAULTS = """
UPDATE executions SET queue = CASE WHEN (defaults_pending & 1) <> 0 THEN $p ELSE queue END,
    priority = CASE WHEN (defaults_pending & 2) <> 0 THEN $p ELSE priority END,
    timeout_ms = CASE WHEN (defaults_pending & 4) <> 0 THEN CAST($p AS BIGINT) ELSE timeout_ms END,
    deadline_at = CASE WHEN (defaults_pending & 4) <> 0 THEN created_at + CAST($p AS BIGINT) ELSE deadline_at END,
    defaults_pending = 0
WHERE workflow = $p AND defaults_pending <> 0 AND (status <> 'running' OR lease_expires_at <= $p)"""
# On PostgreSQL an admit that looks a workflow's defaults up and a record of them take turns (an
# advisory lock per workflow, shared by admits; its two-key space is apart from the schema's
# one-key lock), so that a record never misses an admit that found no defaults and commits later.
DEFAULTS_TURN_SHARED = "SELECT pg_advisory_xact_lock_shared(20261205, hashtext($p))"
DEFAULTS_TURN = "SELECT pg_advisory_xact_lock(20261205, hashtext($p))"


def queue_records(db: Transaction, sql, now: int) -> list[QueueRecord]:
    """Every queue (the declared ones, those executions name, and `default`) by name, with its
    limits and its counts as of `now`, read in the transaction `db`."""
    limits_by_name = {row[0]: row[1:] for row in db.execute(sql[ALL_LIMITS]).fetchall()}
    counts = {row[0]: row[1:] for row in db.execute(sql[COUNTS], (now,) * 6).fetchall()}
    records = []
    for name in sorted(set(limits_by_name) | set(counts) | {DEFAULT_QUEUE}):
        concurrency, per_key, rate_count, rate_ms = limits_by_name.get(name, (None, None, None, None))
        due, running, waiting = (int(value or 0) for value in counts.get(name, (0, 0, 0)))
        records.append(QueueRecord(name=name, concurrency=concurrency, per_key=per_key,
                                   rate=None if rate_count is None else (rate_count, rate_ms / 1000),
                                   due=due, running=running, waiting=waiting))
    return records


def defaults_for(db: Transaction, sql, workflow: str, queue: Optional[str], priority: Optional[int], *,
                 take_turns: bool, timeout: bool = False) -> tuple[str, int, Optional[int], int]:
    """The queue and priority of a new execution of `workflow`, given those its start named
    (None: its workflow's default), with `timeout` its workflow's default timeout (else None),
    and which of the queue, priority and (with `timeout`) timeout still wait for recorded
    defaults (`TAKE_DEFAULTS`)."""
    if queue is not None and priority is not None and not timeout:
        return queue, priority, None, 0
    if take_turns:
        db.execute(sql[DEFAULTS_TURN_SHARED], (workflow,))
    found = db.execute(sql[DEFAULTS_OF], (workflow,)).fetchone()
    if found is not None:
        return ((found[0] if queue is None else queue), (found[1] if priority is None else priority),
                found[2] if timeout else None, 0)
    pending = ((PENDING_QUEUE if queue is None else 0) | (PENDING_PRIORITY if priority is None else 0)
               | (PENDING_TIMEOUT if timeout else 0))
    return (DEFAULT_QUEUE if queue is None else queue), (0 if priority is None else priority), None, pending


@functools.lru_cache(maxsize=64)
def groups_of(count: int) -> str:
    return GROUPS_OF.format(names=", ".join(["(CAST($p AS TEXT))"] * count))


def saturated(concurrency: Optional[int], rate_count: Optional[int], live: Optional[int],
              recent: Optional[int]) -> bool:
    """Whether a group's counts (GROUPS) leave its queue no room. Read without the queue's lock
    on PostgreSQL, they may be a moment old: a queue seen saturated waits for the next claim; one
    seen with room is counted again under the lock (`capacities`) before anything is taken."""
    return (concurrency is not None and live >= concurrency) or (rate_count is not None and recent >= rate_count)


@functools.lru_cache(maxsize=64)
def limits_of(count: int, lock: bool) -> str:
    return LIMITS.format(names=", ".join(["$p"] * count), lock=" $for_update" if lock else "")


@dataclass
class Capacity:
    """What one limited queue may still take in this claim."""

    name: str
    slots: Optional[int]  # live leases (and, with a rate, claims in the window) still allowed; None: any
    per_key: Optional[int]
    live_by_key: dict[str, int] = field(default_factory=dict)
    rate_limited: bool = False
    counts_live: bool = False  # a concurrency or per_key limit: its live leases are counted

    def saturated_keys(self) -> list[str]:
        if self.per_key is None:
            return []
        return sorted(key for key, count in self.live_by_key.items() if key is not None and count >= self.per_key)

    def take(self, key: Optional[str]) -> bool:
        """Whether a row of `key` fits; if so, counted."""
        if self.slots is not None and self.slots <= 0:
            return False
        if self.per_key is not None and key is not None and self.live_by_key.get(key, 0) >= self.per_key:
            return False
        if self.slots is not None:
            self.slots -= 1
        if key is not None:
            self.live_by_key[key] = self.live_by_key.get(key, 0) + 1
        return True


def capacities(db: Transaction, sql, limited: dict[str, tuple], now: int, *, write: bool,
               lock_rows: bool = False) -> dict[str, Capacity]:
    """What each queue of `limited` ({name: (concurrency, per_key, rate_count, rate_ms)}) may still
    take at `now` (see the module docstring). `write`: in a write transaction, which prunes the
    rate windows as it reads them. `lock_rows`: on a backend with row locks, the queues' rows are
    locked in name order and their limits read again first."""
    if not limited:
        return {}
    if lock_rows:
        limited = read_limits(db, sql, list(limited), lock=True)
    found: dict[str, Capacity] = {}
    for name in sorted(limited):
        concurrency, per_key, rate_count, rate_ms = limited[name]
        room = found[name] = Capacity(name, None, per_key)
        if concurrency is not None or per_key is not None:
            room.counts_live = True
            room.live_by_key = {key: count for key, count in db.execute(sql[LIVE_BY_KEY], (name, now)).fetchall()}
        if concurrency is not None:
            room.slots = concurrency - sum(room.live_by_key.values())
        if rate_count is not None:
            if write:
                db.execute(sql[RATE_PRUNE], (name, now - rate_ms))
            left = rate_count - db.execute(sql[RATE_COUNT], (name, now - rate_ms)).fetchone()[0]
            room.slots = left if room.slots is None else min(room.slots, left)
            room.rate_limited = True
    return found


def read_limits(db: Transaction, sql, queues: list[str], *, lock: bool = False) -> dict[str, tuple]:
    """The limits of those of `queues` that have some: {name: (concurrency, per_key, rate_count,
    rate_ms)}; with `lock`, their rows locked in name order."""
    found = {}
    names = sorted(set(queues))
    for start in range(0, len(names), 500):
        some = names[start:start + 500]
        for name, *values in db.execute(sql[limits_of(len(some), lock)], some).fetchall():
            found[name] = tuple(values)
    return found


def priority(name: str, value) -> int:
    arguments.integer(name, value)
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidArgument(f"{name} must be between {MIN_PRIORITY} and {MAX_PRIORITY}, got {value}")
    return value


def limits(concurrency, per_key, rate) -> tuple[Optional[int], Optional[int], Optional[int], Optional[int]]:
    """Checked limits: (concurrency, per_key, rate_count, rate_ms)."""
    if concurrency is not None:
        arguments.integer("concurrency", concurrency, minimum=1)
    if per_key is not None:
        arguments.integer("per_key", per_key, minimum=1)
    if rate is None:
        return concurrency, per_key, None, None
    if not isinstance(rate, (tuple, list)) or len(rate) != 2:
        raise InvalidArgument(f"rate must be a (count, seconds) pair, got {rate!r}")
    count, seconds = rate
    arguments.integer("rate count", count, minimum=1)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not arguments.finite(seconds) \
            or seconds <= 0:
        raise InvalidArgument(f"rate seconds must be a number > 0, got {seconds!r}")
    rate_ms = round(seconds * 1000)
    if rate_ms < 1:
        raise InvalidArgument(f"rate seconds must be at least 0.001, got {seconds!r}")
    return concurrency, per_key, count, rate_ms


class QueueTable(ClockedTable, QueueClient):
    """Queue limits and the workflows' default queues (`contract.QueueClient`)."""


    def declare(self, name, *, concurrency=None, per_key=None, rate=None, now=None) -> None:
        arguments.identifier("name", name)
        checked = limits(concurrency, per_key, rate)
        now = self._now(now)
        with self._conn.write() as db:
            if checked == (None, None, None, None):
                db.execute(self._sql[FORGET], (name,))
            else:
                db.execute(self._sql[DECLARE], (name, *checked, now))

    def record_defaults(self, defaults, *, now=None) -> None:
        checked = []
        for workflow, (queue, prio, *timeout) in sorted(dict(defaults).items()):
            if len(timeout) > 1:
                raise InvalidArgument(f"the defaults of workflow {workflow!r} must be (queue, priority) or (queue,"
                                      f" priority, timeout_ms)")
            checked.append((arguments.identifier("workflow", workflow), arguments.identifier("queue", queue),
                            priority("priority", prio), arguments.timeout_ms("timeout_ms", (timeout or [None])[0])))
        now = self._now(now)
        take_turns = not self._conn.whole_database_write_lock
        with self._conn.write() as db:
            for workflow, queue, prio, timeout_ms in checked:
                if take_turns:
                    db.execute(self._sql[DEFAULTS_TURN], (workflow,))
                db.execute(self._sql[RECORD_DEFAULTS], (workflow, queue, prio, timeout_ms, now))
                db.execute(self._sql[TAKE_DEFAULTS], (queue, prio, timeout_ms, timeout_ms, workflow, now))

    def defaults_of(self, workflow) -> tuple[str, int]:
        return self._defaults(workflow)[:2]

    def timeout_of(self, workflow) -> Optional[int]:
        return self._defaults(workflow)[2]

    def _defaults(self, workflow) -> tuple[str, int, Optional[int]]:
        """The recorded (queue, priority, timeout_ms), or ("default", 0, None) before any record."""
        arguments.identifier("workflow", workflow)
        found = self._conn.execute(self._sql[DEFAULTS_OF], (workflow,)).fetchone()
        return (DEFAULT_QUEUE, 0, None) if found is None else (found[0], found[1], found[2])

    def list(self, *, now=None) -> list[QueueRecord]:
        now = self._now(now)
        with self._conn.read() as db:
            return queue_records(db, self._sql, now)
