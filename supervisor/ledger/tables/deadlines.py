"""Workflow timeouts (SPEC section 12): an execution admitted with a timeout runs to a deadline
(admission + timeout); one not terminal by then becomes `failed` with error type
`WorkflowTimedOut`, and a live delivery of it ends as on a cancel.

Nothing runs at the deadline itself. Every supervisor asks, once a round, for the executions whose
deadline has passed (`ExecutionDeadlines.time_out_due`), so that one fails within about a round of
its deadline, and at once when a supervisor starts after none ran. The ask is one seek in the index
of non-terminal deadlines (`executions_deadline`), a read that finds nothing most of the time; only
when it finds some does a write transaction take them, each checked again under the lock.

How a timed-out execution reads afterwards:

    due, sleeping, waiting, parked  -> failed, not due, its waits forgotten (as a cancel does)
    running (a live delivery)       -> failed; the delivery ends `timed_out` in the lease history,
                                       so the holder's fenced writes return LeaseLost and its
                                       supervisor stops the delivery (renewal or `ended`)
    a lease that expired unclaimed  -> failed; that delivery ends `expired`, at its expiry
    waiters (a parent, a client)    -> woken, as for any terminal execution
"""

from __future__ import annotations

from .. import arguments
from ..connection import Transaction
from ..values import DeliveryEnd
from .execution_rows import FAILED, TERMINAL, ExecutionRows, Row
from .operators import terminate

# The passed deadlines of non-terminal executions, by the partial index that holds only those; in
# one order for every caller, as each takes their row locks in it (PostgreSQL).
PASSED = """
SELECT execution_id FROM executions $by_executions_deadline
WHERE deadline_at <= $p AND status NOT IN ($terminal) ORDER BY deadline_at, execution_id"""


def timed_out_error(timeout: int) -> dict:
    """The error a timed-out execution fails with."""
    return {"type": "WorkflowTimedOut",
            "message": f"the execution was not finished within {timeout / 1000:g} s of its admission"}


class ExecutionDeadlines(ExecutionRows):
    """The workflow timeout's part of the executions client (see the module docstring)."""

    def time_out_due(self, *, now=None) -> list[str]:
        """Fail, in one transaction, every non-terminal execution whose deadline is at or before
        `now`; the ids failed. A read of one index seek when none is."""
        given, now = now, self._now(now)
        if not self._conn.execute(self._sql[PASSED], (now,)).fetchall():
            return []
        timed_out, woke = [], False
        with self._conn.write() as db:
            now = self._now_locked(given, now)
            for (execution_id,) in db.execute(self._sql[PASSED], (now,)).fetchall():
                row = self._row(db, execution_id)  # locked: checked again, as a write decides on it
                if row.status in TERMINAL or row.deadline_at is None or row.deadline_at > now:
                    continue
                woke = self._time_out(db, row, now) or woke
                timed_out.append(execution_id)
        if woke:
            self._on_due()
        if timed_out:
            self._on_ended(timed_out)
        return timed_out

    def _time_out(self, db: Transaction, row: Row, now: int) -> bool:
        """Fail one locked row as timed out, as a cancel ends one; whether a waiter was woken."""
        error_json = arguments.to_json("error", timed_out_error(row.timeout_ms))
        return terminate(self, db, row, now, FAILED, error_json, DeliveryEnd.TIMED_OUT)
