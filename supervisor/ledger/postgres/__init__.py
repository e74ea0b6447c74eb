"""The ledger on PostgreSQL (SPEC section 7): the same contract as `supervisor.ledger.sqlite`, for
supervisors on several hosts sharing one database. Needs psycopg 3 (`pip install
'yieldstar[postgres]'`)."""
