"""Workflow starts (RFC 003): every statement for the `starts` table.

A start is idempotent by receipt: the start-request id maps to the first target for good, so a
replay, or a stale holder, that starts again gets the same execution and starts nothing.
"""

from __future__ import annotations

from typing import Callable

from .. import arguments
from ..connection import Connection
from ..contract import WorkflowStartClient
from ..errors import ExecutionConflict
from ..values import WORKFLOWS_TIMEOUT
from .execution_rows import SELECT_ONE, insert

FIND = "SELECT execution_id FROM starts WHERE start_request_id = $p"
RECORD = """
INSERT INTO starts (start_request_id, execution_id, created_at, parent) VALUES ($p, $p, $p, $p)
ON CONFLICT (start_request_id) DO NOTHING"""


class StartTable(WorkflowStartClient):
    def __init__(self, conn: Connection, clock: Callable[[], int], on_due: Callable[[], None], *,
                 max_payload_bytes: int = arguments.DEFAULT_MAX_PAYLOAD_BYTES):
        self._conn = conn
        self._max_payload = max_payload_bytes
        self._sql = conn.dialect.statements
        self._clock = clock
        self._on_due = on_due

    def start(self, start_request_id, workflow, input_json="null", *, parent=None, trace_context=None) -> str:
        arguments.identifier("start_request_id", start_request_id)
        arguments.identifier("workflow", workflow)
        arguments.json_text("input_json", input_json, limit=self._max_payload)
        if parent is not None:
            arguments.identifier("parent", parent)
        arguments.trace_context("trace_context", trace_context)
        now = self._clock()
        with self._conn.write() as db:
            # The receipt first: of two starts with one id, the second waits here for the first
            # to commit (on PostgreSQL), then finds its receipt and starts nothing.
            if db.execute(self._sql[RECORD], (start_request_id, start_request_id, now, parent)).rowcount == 0:
                return db.execute(self._sql[FIND], (start_request_id,)).fetchone()[0]
            # The target's id is the start-request id: readable, and unique by construction.
            if db.execute(self._sql[SELECT_ONE], (start_request_id,)).fetchone() is not None:
                raise ExecutionConflict(
                    f"start_request_id {start_request_id!r} names an execution that was admitted without it")
            # A child goes to its workflow's default queue, at its default priority, with its
            # default timeout, as the app that serves it recorded them (`queues.record_defaults`).
            insert(db, self._sql, start_request_id, workflow, input_json, now, queue=None, key=None, priority=None,
                   take_turns=not self._conn.whole_database_write_lock, timeout_ms=WORKFLOWS_TIMEOUT,
                   trace_context=trace_context)
        self._on_due()
        return start_request_id
