"""Starting other workflows from a workflow, and waiting for their outcome (RFC 003)."""

from __future__ import annotations

import json
from typing import Any, Optional

from supervisor.ledger.arguments import to_json
from supervisor.ledger.values import ExecutionStatus


class StartsMixin:
    def start(self, key: str, workflow: str, input: Any = None) -> str:
        """Start `workflow` with `input` as a child execution, once, and return its id.

        The start-request id is derived from this execution and `key`, so a replay, or a
        stale holder, gets the same child and starts nothing. The child's deliveries join this
        one's trace (`worker._runtime.tracing`)."""
        key = self._named_key(key)
        input_json = to_json(f"the input of child {key!r}", input, limit=self._backend.max_payload_bytes)
        return self._recorded_step(
            key, lambda: self._writer.call(self._backend.starts.start, self._derived_id(key), workflow, input_json,
                                           parent=self.execution_id, trace_context=self._child_trace_context()))

    def wait_for(self, execution_id: str, key: Optional[str] = None) -> Any:
        """Suspend until execution `execution_id` is terminal; return its result, or raise
        `StepFailed` carrying its error's type and message (type `Cancelled` for a cancelled one).

        A failed outcome that was opened again (the waiting execution was resumed after failing
        on it) is looked up again: the child may have been resumed and finished since."""
        key = self._named_key(key if key is not None else f"wait:{execution_id}")
        record = self._recorded.get(key)
        if record is None or not record.done:
            target = self._writer.call(self._backend.executions.await_outcome, execution_id, self.execution_id)
            if target.status == ExecutionStatus.COMPLETED.value:
                response = {"value": json.loads(target.result_json)}
            elif target.status in (ExecutionStatus.FAILED.value, ExecutionStatus.CANCELLED.value):
                error = json.loads(target.error_json)
                if not isinstance(error, dict):
                    error = {"type": "Error", "message": str(error)}
                message = error.get("message")
                if target.status == ExecutionStatus.CANCELLED.value:
                    message = f"execution {execution_id!r} was cancelled" + (f": {message}" if message else "")
                response = {"error": {"type": error.get("type", "Error"), "message": message or "",
                                      "traceback": error.get("traceback")}, "retry_at": None}
            else:
                self._suspend_waiting(f"execution {execution_id!r} to finish")
            record = self._write(key, 1 if record is None else record.attempt + 1, True, response)
        return self._replay(key, record)
