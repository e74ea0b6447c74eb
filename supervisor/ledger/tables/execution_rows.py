"""The `executions` table's columns, and the statements that read one row or admit one.

`executions` keeps them for its own calls; `starts` admits children with them and `waiters`
checks that a waiter is admitted, without either importing the executions module.
"""

from .epochs import FLOOR

COLUMNS = (
    "execution_id, workflow, input_json, status, token, due_at, lease_expires_at,"
    " unacknowledged_deliveries, delivery_ended_at, ever_suspended, wake_during_lease,"
    " result_json, error_json, created_at, updated_at"
)
SELECT_ONE = f"SELECT {COLUMNS} FROM executions WHERE execution_id = ?"
# Row locks are written as comments: SQLite ignores them (its write transactions take the whole
# database's write lock), and the PostgreSQL connection makes them clauses (see
# `supervisor.ledger.postgres.connection.translate`). Every read that a write transaction decides on
# locks the rows it reads, so that on PostgreSQL, too, no other writer changes them in between.
LOCKED = " /*FOR UPDATE*/"
SELECT_ONE_LOCKED = SELECT_ONE + LOCKED

# A new execution's token is the current epoch's floor (0 until a restore or a failover raised
# the epoch: see `epochs`), so that its first claim issues a token no earlier epoch issued.
INSERT = f"""
INSERT INTO executions (execution_id, workflow, input_json, status, token, due_at,
    unacknowledged_deliveries, ever_suspended, ready_at, created_at, updated_at)
VALUES (?, ?, ?, 'admitted', {FLOOR}, ?, 0, 0, ?, ?, ?)
ON CONFLICT (execution_id) DO NOTHING"""
