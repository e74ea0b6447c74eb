"""The executions table on PostgreSQL: the shared table (`supervisor.ledger.tables.executions`)
with its hottest call, a batch of acknowledgements and a claim, made one round trip.

The shared statements are written so that SQLite, which has no data-modifying `WITH`, can run
them, and a batch runs them in a transaction the client drives: on PostgreSQL that is a round
trip for `BEGIN`, for each acknowledgement, each claimed row, each kind of lease history change,
the waiters, the announcement and `COMMIT`. Here the whole batch is one call of a function each
session makes for itself (`pg_temp.yieldstar_batch`, beside the session's other functions), in a
transaction of its own, with one WAL flush when it claims. Its PL/pgSQL is `batch.sql`, beside
this module and shipped with it as package data (`batch_function` reads it):

1. the acknowledgements, one statement: the fenced updates (each by its own token; the rows it
   returns are the deliveries that were current, the others are `LeaseLost`), the end of their
   deliveries in the lease history, and, in a batch that does not claim, the `yieldstar_ended`
   announcement, which PostgreSQL sends at the commit and drops with a rollback (a batch that
   claims announces after its commit, as the shared table does: see `_acknowledge_and_claim`).
   A diverged replay's suspension parks its execution (not due); a statement after this one,
   run only in a batch that has one, registers it as waiting for code (`tables.parking`);
2. the waiters of the executions they ended, taken and woken by `ExecutionRows.wake_in`'s rules,
   one statement of its own: it must see a waiter registered while an acknowledgement waited for
   its row, and the claim after it sees them due, as on SQLite; a parked one woken so is parked no
   more (a statement that runs only when some waiter was woken);
3. the claim, one statement: the claimable rows (locked, skipping rows other claimers hold),
   their new tokens and leases, the superseded deliveries closed and the new ones opened in the
   lease history.

Each computes in SQL what the shared table computes in Python, by the same rules; the contract
and group-commit tests run against both backends and check the same replies, rows and history.
"""

from __future__ import annotations

from importlib import resources
from typing import Optional

from ..tables.acknowledgements import Acknowledgement
from ..tables.executions import ExecutionTable
from ..tables.execution_rows import COLUMNS
from ..dialect import TERMINAL_SQL
from ..values import Claimed, DeliveryEnd, ExecutionLease, LeaseLost
from . import notify

BATCH_FILE = "batch.sql"


def batch_function() -> str:
    """The `CREATE FUNCTION pg_temp.yieldstar_batch(...)` each session runs when it connects:
    `batch.sql`, beside this module (package data), with the constants it names filled in."""
    text = resources.files(__package__).joinpath(BATCH_FILE).read_text(encoding="utf-8")
    return text.format(columns=COLUMNS, acknowledged=DeliveryEnd.ACKNOWLEDGED.value,
                       superseded=DeliveryEnd.SUPERSEDED.value, expired=DeliveryEnd.EXPIRED.value,
                       ended_channel=notify.ENDED,
                       max_payload=notify.MAX_PAYLOAD,
                       terminal=TERMINAL_SQL)


BATCH = """
SELECT o_kind, o_id, o_token, o_expires, o_workflow, o_input, o_trace, o_queue, o_due FROM pg_temp.yieldstar_batch(
    %s::text[], %s::bigint[], %s::text[], %s::text[], %s::text[], %s::text[], %s::bigint, %s::bigint, %s::bigint, %s::text,
    %s::boolean, %s::boolean, %s::text[])"""


class PostgresExecutionTable(ExecutionTable):
    def _acknowledge_and_claim(self, checked: list[Acknowledgement], now: Optional[int], *, limit: int = 0,
                               duration: int = 0, workflows: Optional[frozenset[str]] = None):
        """As the shared table's, in one call of `yieldstar_batch`: one round trip, in a
        transaction of its own, whose commit waits for the WAL flush when it claims."""
        now = self._now(now)
        if not checked and not limit:
            return [], []
        # One acknowledgement of a delivery stands for it: a repeat finds the delivery ended by
        # the first, as it would one statement later (LeaseLost), whether the first was current or not.
        first: dict[tuple[str, int], int] = {}
        for i, acknowledgement in enumerate(checked):
            first.setdefault(acknowledgement.delivery, i)
        columns: tuple[list, ...] = ([], [], [], [], [], [])  # ids, tokens, statuses, results, errors, details
        for i in first.values():
            acknowledgement = checked[i]
            for column, value in zip(columns, (*acknowledgement.delivery, acknowledgement.status,
                                               acknowledgement.result_json, acknowledgement.error_json,
                                               acknowledgement.diverged)):
                column.append(value)
        flush = limit > 0
        served = None if workflows is None else sorted(workflows)
        rows = self._conn.execute(BATCH, (*columns, now, limit, duration, self._holder, self._one_clock,
                                          flush, served)).fetchall()
        current, ended, woke, claimed = set(), [], False, []
        for kind, execution_id, token, expires, workflow, input_json, trace_context, queue, due_at in rows:
            if kind in ("acknowledged", "ended"):
                current.add((execution_id, token))
                if kind == "ended":
                    ended.append(execution_id)
            elif kind == "woke":
                woke = True
            else:
                claimed.append(Claimed(ExecutionLease(execution_id, token, expires), workflow, input_json,
                                       trace_context=trace_context, queue=queue, due_at=due_at))
        replies = []
        for i, acknowledgement in enumerate(checked):
            key = acknowledgement.delivery
            replies.append(acknowledgement.outcome if first[key] == i and key in current else LeaseLost())
        if limit:
            self._last_claim_found = bool(claimed)
        # A batch that flushes announces the executions it ended after its commit, like the
        # shared table: a NOTIFY in it would hold the server's lock on notifications through
        # the flush, and every other supervisor's flush that notifies would queue behind it.
        self._announce_acknowledged(ended if flush else [], woke)
        return replies, claimed
