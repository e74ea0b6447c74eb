"""Forking an execution (SPEC section 14): a new execution of the same workflow and input whose
recorded steps are copies of the original's up to, not including, one step, so that it runs again
from there. `ExecutionForks` is a part of `executions.ExecutionTable`.

What a fork copies and what it does not, and why:

    copied                                       not copied
    the workflow, input, queue, key, priority    the original's lease history, waits and wakes:
    and timeout (the deadline counted again      the fork is admitted, due now, and its first
    from the fork, as a new start's is; those    delivery replays the copied steps
    still left to the workflow's defaults, not
    recorded yet, left to them too)
    the step rows recorded before the first      the step `from_step` and every row recorded after
    row of `from_step`, in recording order,      it: the fork runs them again, with the code now
    each attempt as stored (done or not, its     deployed
    response, its time)
    the events whose every `set_event` step      events set (last) by a step not copied: their
    was copied (their value is the one the       value at the fork point is not kept anywhere; the
    fork's copied steps set)                     fork sets them again when it gets there
                                                 messages: a copied `recv` step keeps the message
                                                 it took (in its response); the fork's mailbox
                                                 starts empty
                                                 effects, store receipts, child starts: keyed by
                                                 the execution, so the steps the fork runs again
                                                 perform them again under the fork's id (that is
                                                 what a fork is for); a copied step that started a
                                                 child keeps naming the original's child

A fork with copied steps is admitted with token 1, not 0, so that its first claim is not token 1,
which tells a worker that nothing is recorded yet (`COPY_STEPS`). Nothing records where a fork
came from: the schema has no place for it, and a fork needs none
to run. All of it is one transaction: a fork that is refused (an unknown execution or step, a
taken id) writes nothing.
"""

from __future__ import annotations

from .. import arguments
from ..errors import UnknownStep, fork_id_taken
from ..values import WORKFLOWS_TIMEOUT, ExecutionRecord
from . import queues
from .events import COLUMNS as EVENT_COLUMNS, LIST as EVENTS
from .execution_rows import SELECT_ONE, ExecutionRows, insert

# The first row of a step, in recording order (an attempt recorded later keeps its step's place).
DEFAULTS_PENDING = "SELECT defaults_pending FROM executions WHERE execution_id = $p"
FIRST_ROW = "SELECT min($row_order) FROM steps WHERE execution_id = $p AND step_key = $p"
STEP_KEYS = "SELECT step_key FROM steps WHERE execution_id = $p ORDER BY $row_order"
# The rows before it, copied in recording order, so that the fork's rows number in the same order.
# They carry the token one above the fork's as admitted, which the fork then takes (PAST_FIRST_TOKEN):
# a first claim, of token 1, tells its worker that nothing is recorded (`values.Claimed`), and a fork
# with copied steps has steps recorded before its first claim; so its first claim issues token 2,
# and the copies carry a token no delivery of the fork holds.
COPY_STEPS = """
INSERT INTO steps (execution_id, step_key, attempt, done, step_response_json, token, written_at)
SELECT $p, step_key, attempt, done, step_response_json, $p, written_at FROM steps
WHERE execution_id = $p AND $row_order < $p ORDER BY $row_order"""
PAST_FIRST_TOKEN = "UPDATE executions SET token = token + 1 WHERE execution_id = $p"
STEPS_FROM = "SELECT DISTINCT step_key FROM steps WHERE execution_id = $p AND $row_order >= $p"
COPY_EVENT = f"INSERT INTO events ({EVENT_COLUMNS}) VALUES ($p, $p, $p, $p)"

# How the SDK keys the step of `ctx.set_event(key, ...)` (`worker.messages`): `@<n>:set_event:<key>`,
# cut at 255 characters as every unnamed step's key is.
SET_EVENT = "set_event:"
MAX_KEY = 255


class ExecutionForks(ExecutionRows):
    """`fork` (see the module docstring)."""

    def fork(self, execution_id, new_id, *, from_step, trace_context=None, now=None) -> ExecutionRecord:
        arguments.identifier("execution_id", execution_id)
        arguments.identifier("new_id", new_id)
        arguments.identifier("from_step", from_step)
        arguments.trace_context("trace_context", trace_context)
        given, now = now, self._now(now)
        with self._conn.write() as db:
            now = self._now_locked(given, now)
            # Read, not locked: the original is not changed, and its running delivery's writes
            # land after the fork point.
            original = self._row(db, execution_id, lock=False)
            (fork_at,) = db.execute(self._sql[FIRST_ROW], (execution_id, from_step)).fetchone()
            if fork_at is None:
                keys = [key for (key,) in db.execute(self._sql[STEP_KEYS], (execution_id,)).fetchall()]
                raise UnknownStep("from_step", execution_id, from_step, tuple(dict.fromkeys(keys)))
            # Taken before, or (on PostgreSQL) by a start that committed in between.
            taken = db.execute(self._sql[SELECT_ONE], (new_id,)).fetchone() is not None
            # What the original leaves to its workflow's defaults, not recorded yet, the fork does too.
            (pending,) = db.execute(self._sql[DEFAULTS_PENDING], (execution_id,)).fetchone()
            if taken or not insert(
                    db, self._sql, new_id, original.workflow, original.input_json, now,
                    queue=None if pending & queues.PENDING_QUEUE else original.queue, key=original.queue_key,
                    priority=None if pending & queues.PENDING_PRIORITY else original.priority,
                    take_turns=not self._conn.whole_database_write_lock,
                    timeout_ms=WORKFLOWS_TIMEOUT if pending & queues.PENDING_TIMEOUT else original.timeout_ms,
                    trace_context=trace_context):
                raise fork_id_taken("new_id", new_id)
            row = self._row(db, new_id)
            if db.execute(self._sql[COPY_STEPS], (new_id, row.token + 1, execution_id, fork_at)).rowcount:
                db.execute(self._sql[PAST_FIRST_TOKEN], (new_id,))
                row = self._row(db, new_id)
            self._copy_events(db, execution_id, new_id, fork_at)
        self._on_due()
        return self._as_of(row, now)

    def _copy_events(self, db, execution_id: str, new_id: str, fork_at: int) -> None:
        """The original's events that no step from the fork point on set, copied to the fork."""
        events = db.execute(self._sql[EVENTS], (execution_id,)).fetchall()
        if not events:
            return
        later = [key for (key,) in db.execute(self._sql[STEPS_FROM], (execution_id, fork_at)).fetchall()
                 if _sets_an_event(key)]
        for _, key, value_json, set_at in events:
            if not any(step_key == _set_event_step(step_key, key) for step_key in later):
                db.execute(self._sql[COPY_EVENT], (new_id, key, value_json, set_at))


def _sets_an_event(step_key: str) -> bool:
    """Whether `step_key` is the key of a `set_event` step (`@<n>:set_event:...`)."""
    number, _, rest = step_key.partition(":")
    return number[:1] == "@" and number[1:].isdigit() and rest.startswith(SET_EVENT)


def _set_event_step(step_key: str, event_key: str) -> str:
    """The key the `set_event` step numbered as `step_key` would have if it set `event_key`."""
    number = step_key.partition(":")[0]
    return f"{number}:{SET_EVENT}{event_key}"[:MAX_KEY]
