"""The lease history: every statement for `lease_history`, one row per delivery, opened by the
claim that made it and ended by a release, an acknowledgement, a later claim (superseded) or a
cancel; an expiry is read, not written (`operators.ExecutionOperators.history`).
"""

from __future__ import annotations

import functools

# The deliveries a claim opened, one row each, in one statement (a round trip for all of them):
# `{rows}` is "($p, $p, $p, $p, $p)" once per lease (`history_open`), at most HISTORY_OPEN_ROWS, well
# within either database's limit on parameters.
HISTORY_OPEN = """
INSERT INTO lease_history (execution_id, token, holder, claimed_at, expires_at)
VALUES {rows}"""
HISTORY_OPEN_ROWS = 64

HISTORY_CLOSE = """
UPDATE lease_history SET ended_at = $p, ended_by = $p, outcome = $p, expires_at = $p
WHERE execution_id = $p AND token = $p"""

# The history keeps the lease's expiry as the lease moves, so ending a delivery needs no look
# at the execution row first (HISTORY_END).
HISTORY_RENEWED = """
UPDATE lease_history SET renewals = renewals + 1, expires_at = $p WHERE execution_id = $p AND token = $p"""

# The same for a batch of renewals (`renew_many`), all to one expiry: `{deliveries}` is "($p, $p)"
# (execution id, token) once per delivery renewed.
HISTORY_RENEWED_MANY = """
UPDATE lease_history SET renewals = renewals + 1, expires_at = $p WHERE (execution_id, token) IN (VALUES {deliveries})"""

# `{deliveries}`: "(execution_id = $p AND token = $p)" once per delivery ended the same way, joined
# by OR, at most HISTORY_END_ROWS (`history_end`): a batch of acknowledgements ends its
# deliveries in one statement.
HISTORY_END = "UPDATE lease_history SET ended_at = $p, ended_by = $p, outcome = $p WHERE {deliveries}"
HISTORY_END_ROWS = 64

HISTORY = """
SELECT h.execution_id, h.token, h.holder, h.claimed_at,
    CASE WHEN h.ended_by IS NULL AND e.token = h.token THEN e.lease_expires_at ELSE h.expires_at END,
    h.renewals, h.ended_at, h.ended_by, h.outcome
FROM lease_history h JOIN executions e USING (execution_id)
WHERE h.execution_id = $p ORDER BY h.token"""

DELIVERIES = "SELECT count(*) FROM lease_history"


@functools.lru_cache(maxsize=HISTORY_END_ROWS)
def history_end(count: int) -> str:
    """HISTORY_END for `count` deliveries."""
    return HISTORY_END.format(deliveries=" OR ".join(["(execution_id = $p AND token = $p)"] * count))


@functools.lru_cache(maxsize=HISTORY_OPEN_ROWS)
def history_open(count: int) -> str:
    """HISTORY_OPEN for `count` leases."""
    return HISTORY_OPEN.format(rows=", ".join(["($p, $p, $p, $p, $p)"] * count))



@functools.lru_cache(maxsize=64)
def history_renewed_many(count: int) -> str:
    """HISTORY_RENEWED_MANY for `count` deliveries."""
    return HISTORY_RENEWED_MANY.format(deliveries=", ".join(["($p, $p)"] * count))
