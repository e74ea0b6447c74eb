"""Recorded step responses: every statement for the `steps` table, as templates for both backends."""

from __future__ import annotations

from typing import Callable, Optional

from .. import arguments
from ..connection import Connection
from ..contract import HeapClient
from ..values import ExecutionLease, HeapRecord, LeaseLost

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
    def __init__(self, conn: Connection, clock: Callable[[], int], *, one_clock: bool = False):
        self._conn = conn
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

    def write_step(self, lease, *, step_key, step_attempt, done, step_response_json) -> HeapRecord | LeaseLost:
        if not isinstance(lease, ExecutionLease):
            raise arguments.InvalidArgument(f"lease must be an ExecutionLease, not {type(lease).__name__}")
        arguments.identifier("step_key", step_key)
        arguments.integer("step_attempt", step_attempt, minimum=0)
        arguments.boolean("done", done)
        arguments.json_text("step_response_json", step_response_json)
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

    def steps(self, execution_id) -> list[HeapRecord]:
        arguments.identifier("execution_id", execution_id)
        return [
            HeapRecord(execution_id, key, attempt, bool(done), response)
            for key, attempt, done, response in self._conn.execute(self._sql[READ_ALL], (execution_id,)).fetchall()
        ]
