"""Parked executions (SPEC section 11): an execution whose replay diverged from its recorded steps
waits for new code, neither failed nor due.

A delivery acknowledged `Suspended(diverged=detail)` parks its execution, in the transaction of
the fenced acknowledgement: the row is `suspended` with no due time (no claim takes it; a wake
requested during that delivery is dropped, as the same code would only diverge again), and a
registration in `waiters` says why:

    kind    target                     waiter              detail
    code    the execution's workflow   the execution       how the replay diverged (one line)

so that `waiting_for` reads `WaitReason("code", workflow, None, detail)`, and `unpark` finds the
parked executions of a workflow by the waiters' primary key (kind, target), without a scan.

The registration lives exactly as long as the parking. Everything that ends a parking deletes it
in the same transaction, and nothing else can end one:

    unpark(workflows)       a supervisor that serves them starts: every parked one, due now
    resume(id)              an operator: this one, due now
    a wake (`wake_in`)      a timer wake request, an effect settled, a store changed: the wake of
                            a suspended row with no due time deletes it (a PK lookup, which finds
                            nothing unless the row was parked)
    a child ending          the waiters woken in a batch of acknowledgements: `wake_in` on SQLite,
                            a statement after the wake in PostgreSQL's `batch.sql`
    cancel                  forgets every registration of the execution, as it always did

A claim and an ordinary acknowledgement never touch it: a parked row is not claimable, and a row
that is claimable or running was made due by one of the above. Purge deletes a terminal
execution's registrations by waiter, this kind with the others.
"""

from __future__ import annotations

import functools

# Park: register (or re-register, after a delivery that a wake let run: the newer detail wins)
# the execution as waiting for code, under its workflow. Run after the fenced acknowledgement
# succeeded, in its transaction.
PARK = """
INSERT INTO waiters (kind, target, waiter, registered_at, detail)
SELECT 'code', workflow, execution_id, $p, $p FROM executions WHERE execution_id = $p
ON CONFLICT (kind, target, waiter) DO UPDATE SET registered_at = excluded.registered_at, detail = excluded.detail"""

# The parking's registration, by primary key (`wake_in`, `resume`).
PARKED = "SELECT detail FROM waiters WHERE kind = 'code' AND target = $p AND waiter = $p"
FORGET = "DELETE FROM waiters WHERE kind = 'code' AND target = $p AND waiter = $p"

# Unpark every parked execution of some workflows (`{workflows}`: a "$p" per workflow, at most
# UNPARK_WORKFLOWS), due at the first $p. The rows first, found through their registrations (a
# join, so that SQLite looks each row up by its id rather than every suspended row by status),
# locked by the UPDATE on PostgreSQL in the order a wake takes the locks (the execution, then its
# registration); then the registrations of the rows that are now due. A row parked by a commit in
# between keeps its registration, and stays parked for the next unpark. `{stamp}` is what
# `updated_at` becomes (`ExecutionRows._stamp`).
UNPARK = """
UPDATE executions SET due_at = $p, ready_at = $p, wake_during_lease = NULL, updated_at = {stamp}
FROM (SELECT waiter FROM waiters WHERE kind = 'code' AND target IN ({workflows})) AS parked
WHERE executions.execution_id = parked.waiter AND executions.status = 'suspended' AND executions.due_at IS NULL"""
UNPARKED = """
DELETE FROM waiters WHERE kind = 'code' AND target IN ({workflows})
    AND EXISTS (SELECT 1 FROM executions e WHERE e.execution_id = waiters.waiter AND e.due_at IS NOT NULL)"""
UNPARK_WORKFLOWS = 64
# The parked executions by workflow, for `stats`: a range of the waiters' primary key.
PARKED_BY_WORKFLOW = "SELECT target, count(*) FROM waiters WHERE kind = 'code' GROUP BY target ORDER BY target"
STAMP_NOW = "$p"
STAMP_NOT_BEFORE = "$yieldstar_max(updated_at, $p)"  # one_clock: never before the row's last change


@functools.lru_cache(maxsize=2 * UNPARK_WORKFLOWS)
def unpark(count: int, one_clock: bool) -> tuple[str, str]:
    """UNPARK and UNPARKED for `count` workflows."""
    workflows = ", ".join(["$p"] * count)
    return (UNPARK.format(stamp=STAMP_NOT_BEFORE if one_clock else STAMP_NOW, workflows=workflows),
            UNPARKED.format(workflows=workflows))
