"""Recorded step responses: every statement for the `steps` table, as templates for both backends."""

from __future__ import annotations

import functools
from collections import Counter
from typing import Callable, Optional

from .. import arguments
from ..connection import Connection
from ..contract import HeapClient
from ..values import HeapRecord, LeaseLost, StepWrite
from .execution_rows import RUNNING
from .leases import CURRENT_TOKENS_IDS, current_tokens

# The fence and the write in one statement: the row goes in only while the lease's token is
# current and its delivery has not ended. ON CONFLICT keeps an existing record untouched. On
# PostgreSQL the execution's row is share-locked by the same statement (see
# `execution_rows.LOCKED`): a claim moving the token either commits first, and the write finds the
# token gone, or waits until the write has committed; without the lock, a write checked against
# the token before the claim committed could commit after it. With `one_clock`, the time written is
# never before the row's last change (the claim of this delivery, or a later wake), as
# `ExecutionTable._stamp`: a process whose estimate lags (frozen while it read the server's clock)
# would otherwise record a step before the claim it was written under.
WRITE = """
INSERT INTO steps (execution_id, step_key, attempt, done, step_response_json, token, written_at)
SELECT $p, $p, $p, $p, $p, $p, CASE WHEN $p AND updated_at > $p THEN updated_at ELSE $p END
FROM executions WHERE execution_id = $p AND token = $p AND status = 'running' $for_share
ON CONFLICT DO NOTHING"""

# A batch of writes (`write_steps`), each fenced by its own lease as WRITE is: the executions'
# rows whose `(execution_id, token)` is one of the writes' leases `{leases}` and still running,
# share-locked as WRITE locks its row (two batches never wait for each other on them), in id order, joined
# to the writes `{writes}` (their columns, in VALUES' own names: column1 the execution, 2 the key,
# 3 the attempt, 4 done, 5 the response, 6 the token). What it returns is what it wrote.
WRITE_MANY = """
INSERT INTO steps (execution_id, step_key, attempt, done, step_response_json, token, written_at)
SELECT w.column1, w.column2, w.column3, w.column4, w.column5, w.column6,
    CASE WHEN $p AND e.updated_at > $p THEN e.updated_at ELSE $p END
FROM (SELECT execution_id, token, updated_at FROM executions
      WHERE (execution_id, token) IN (VALUES {leases}) AND status = 'running'
      ORDER BY execution_id $for_share) AS e,
    (VALUES {writes}) AS w
WHERE w.column1 = e.execution_id AND w.column6 = e.token
ON CONFLICT DO NOTHING
RETURNING execution_id, step_key, attempt"""
# At most this many writes per WRITE_MANY statement (8 parameters each, with its lease's 2), well
# within either database's limit on parameters; a larger batch is several, in one transaction.
# Each write names its lease, even where several share one (an IN list minds no repeats), so
# that a statement's shape depends on the number of writes alone: each shape is rendered once
# and kept (`dialect.Rendered`), and one per count of leases too would be kept without bound.
WRITE_MANY_ROWS = 500
# The recorded attempts `{keys}`, "($p, $p, $p)" (execution, key, attempt) each.
READ_ATTEMPTS = """
SELECT execution_id, step_key, attempt, done, step_response_json FROM steps
WHERE (execution_id, step_key, attempt) IN (VALUES {keys})"""

CURRENT = "SELECT 1 FROM executions WHERE execution_id = $p AND token = $p AND status = 'running'"
READ_ATTEMPT = """
SELECT done, step_response_json FROM steps WHERE execution_id = $p AND step_key = $p AND attempt = $p"""
READ_LATEST = """
SELECT attempt, done, step_response_json FROM steps WHERE execution_id = $p AND step_key = $p
ORDER BY attempt DESC LIMIT 1"""
READ_ALL = """
SELECT step_key, attempt, done, step_response_json FROM steps WHERE execution_id = $p
ORDER BY $row_order"""


class HeapTable(HeapClient):
    def __init__(self, conn: Connection, clock: Callable[[], int], *, one_clock: bool = False,
                 max_payload_bytes: int = arguments.DEFAULT_MAX_PAYLOAD_BYTES):
        self._conn = conn
        self._max_payload = max_payload_bytes
        self._sql = conn.dialect.statements
        self._clock = clock
        self._one_clock = one_clock  # see WRITE

    def read_step(self, execution_id, step_key) -> Optional[HeapRecord]:
        arguments.identifier("execution_id", execution_id)
        arguments.identifier("step_key", step_key)
        found = self._conn.execute(self._sql[READ_LATEST], (execution_id, step_key)).fetchone()
        if found is None:
            return None
        attempt, done, response = found
        return HeapRecord(execution_id, step_key, attempt, bool(done), response)

    def _check_write(self, lease, step_key, step_attempt, done, step_response_json) -> None:
        arguments.lease("lease", lease)
        arguments.identifier("step_key", step_key)
        arguments.integer("step_attempt", step_attempt, minimum=0)
        arguments.boolean("done", done)
        arguments.json_text("step_response_json", step_response_json, limit=self._max_payload)

    def write_step(self, lease, *, step_key, step_attempt, done, step_response_json) -> HeapRecord | LeaseLost:
        self._check_write(lease, step_key, step_attempt, done, step_response_json)
        eid, token = lease.execution_id, lease.token
        now = self._clock()
        cursor = self._conn.execute(
            self._sql[WRITE], (eid, step_key, step_attempt, int(done), step_response_json, token, self._one_clock, now, now, eid,
                    token)
        )
        if cursor.rowcount == 1:
            return HeapRecord(eid, step_key, step_attempt, done, step_response_json)
        # Nothing written: either the lease is lost, or the attempt is already recorded.
        with self._conn.read() as db:
            if db.execute(self._sql[CURRENT], (eid, token)).fetchone() is None:
                return LeaseLost()
            found = db.execute(self._sql[READ_ATTEMPT], (eid, step_key, step_attempt)).fetchone()
        if found is None:  # pragma: no cover - the insert can only be ignored for these two reasons
            return LeaseLost()
        return HeapRecord(eid, step_key, step_attempt, bool(found[0]), found[1])

    def write_steps(self, writes) -> list[HeapRecord | LeaseLost]:
        writes = self._checked_writes(writes)
        if not writes:
            return []
        now = self._clock()
        written: set[tuple[str, str, int]] = set()
        with self._conn.write() as db:
            for start in range(0, len(writes), WRITE_MANY_ROWS):
                some = writes[start:start + WRITE_MANY_ROWS]
                params = [self._one_clock, now, now,
                          *(value for w in some for value in (w.lease.execution_id, w.lease.token)),
                          *(value for w in some for value in (w.lease.execution_id, w.step_key, w.step_attempt,
                                                              int(w.done), w.step_response_json, w.lease.token))]
                for eid, key, attempt in db.execute(self._sql[write_many(len(some))], params):
                    written.add((eid, key, attempt))
            # An attempt given twice in the batch was written once: which one, the table says.
            given = Counter((w.lease.execution_id, w.step_key, w.step_attempt) for w in writes)
            unsure = [w for w in writes if given[w.lease.execution_id, w.step_key, w.step_attempt] > 1
                      or (w.lease.execution_id, w.step_key, w.step_attempt) not in written]
            current, recorded = self._current_and_recorded(db, unsure) if unsure else ({}, {})
        replies: list[HeapRecord | LeaseLost] = []
        for w in writes:
            key = (w.lease.execution_id, w.step_key, w.step_attempt)
            if given[key] == 1 and key in written:
                replies.append(HeapRecord(*key, w.done, w.step_response_json))
            elif current.get(w.lease.execution_id) != w.lease.token or key not in recorded:
                replies.append(LeaseLost())
            else:
                replies.append(recorded[key])
        return replies

    def _checked_writes(self, writes) -> list[StepWrite]:
        if isinstance(writes, (str, bytes)) or not hasattr(writes, "__iter__"):
            raise arguments.InvalidArgument(f"writes must be a sequence of StepWrite, not {type(writes).__name__}")
        checked = []
        for i, w in enumerate(writes):
            if not isinstance(w, StepWrite):
                raise arguments.InvalidArgument(f"writes[{i}] must be a StepWrite, not {type(w).__name__}")
            self._check_write(w.lease, w.step_key, w.step_attempt, w.done, w.step_response_json)
            checked.append(w)
        return checked

    def _current_and_recorded(self, db, writes: list[StepWrite]
                              ) -> tuple[dict[str, int], dict[tuple[str, str, int], HeapRecord]]:
        """For the writes a batch did not write (or wrote once for several): the current token of
        each of their executions that is running, and the attempts recorded, read in the batch's
        transaction."""
        ids = list(dict.fromkeys(w.lease.execution_id for w in writes))
        current: dict[str, int] = {}
        for start in range(0, len(ids), CURRENT_TOKENS_IDS):
            part = ids[start:start + CURRENT_TOKENS_IDS]
            for eid, token, status in db.execute(self._sql[current_tokens(len(part))], part):
                if status == RUNNING:
                    current[eid] = token
        keys = list(dict.fromkeys((w.lease.execution_id, w.step_key, w.step_attempt) for w in writes))
        recorded: dict[tuple[str, str, int], HeapRecord] = {}
        for start in range(0, len(keys), WRITE_MANY_ROWS):
            part = keys[start:start + WRITE_MANY_ROWS]
            for eid, key, attempt, done, response in db.execute(
                    self._sql[read_attempts(len(part))], [value for k in part for value in k]):
                recorded[eid, key, attempt] = HeapRecord(eid, key, attempt, bool(done), response)
        return current, recorded

    def steps(self, execution_id) -> list[HeapRecord]:
        arguments.identifier("execution_id", execution_id)
        return [
            HeapRecord(execution_id, key, attempt, bool(done), response)
            for key, attempt, done, response in self._conn.execute(self._sql[READ_ALL], (execution_id,)).fetchall()
        ]


@functools.lru_cache(maxsize=64)
def write_many(writes: int) -> str:
    """WRITE_MANY for `writes` writes."""
    return WRITE_MANY.format(leases=", ".join(["($p, $p)"] * writes),
                             writes=", ".join(["($p, $p, $p, $p, $p, $p)"] * writes))


@functools.lru_cache(maxsize=64)
def read_attempts(count: int) -> str:
    """READ_ATTEMPTS for `count` attempts."""
    return READ_ATTEMPTS.format(keys=", ".join(["($p, $p, $p)"] * count))
