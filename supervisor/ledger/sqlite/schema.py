"""The database schema, its version, and the migrations that bring an older file up to date.

The version lives in SQLite's `user_version` pragma. `recognise()` reads it, and the tables,
before anything writes to a file, so that an SQLite file Yieldstar did not make is refused
untouched. `migrate()` runs inside one `BEGIN IMMEDIATE` transaction, so several processes
opening a new file at once create the schema exactly once. Each table's statements live in the module that owns the table
(`executions.py`, `heap.py`, ...); this module only creates them.
"""

from __future__ import annotations

import re
import sqlite3

from ..errors import NotALedger, SchemaTooNew

EXECUTIONS = """
CREATE TABLE executions (
    execution_id              TEXT PRIMARY KEY,
    workflow                  TEXT NOT NULL,
    input_json                TEXT NOT NULL,
    status                    TEXT NOT NULL,      -- as stored; 'running' = a delivery not yet ended
    token                     INTEGER NOT NULL,   -- the fencing token of the latest claim
    due_at                    INTEGER,            -- NULL: not due until woken
    lease_expires_at          INTEGER,            -- set while status = 'running'
    unacknowledged_deliveries INTEGER NOT NULL,
    delivery_ended_at         INTEGER,            -- end of the last unacknowledged delivery
    ever_suspended            INTEGER NOT NULL,   -- 1 once a delivery was acknowledged suspended
    wake_during_lease         INTEGER,            -- earliest wake requested during the delivery
    ready_at                  INTEGER,            -- earliest claim time; NULL: never claimable
    result_json               TEXT,
    error_json                TEXT,
    created_at                INTEGER NOT NULL,
    updated_at                INTEGER NOT NULL
)"""

# claim_due walks this index in due order and stops after `limit` hits. Terminal, not-due and
# running executions are not in it, so its size follows the waiting backlog: neither the history
# nor the leases other supervisors hold make a claim slower.
EXECUTIONS_CLAIMABLE = """
CREATE INDEX executions_claimable ON executions (due_at) WHERE ready_at IS NOT NULL AND status <> 'running'"""
# Running executions by the time their lease (plus redelivery delay) lets another claim them.
EXECUTIONS_EXPIRING = "CREATE INDEX executions_expiring ON executions (ready_at) WHERE status = 'running'"
# When the next execution becomes claimable: what an idle supervisor sleeps until.
EXECUTIONS_READY = "CREATE INDEX executions_ready ON executions (ready_at) WHERE ready_at IS NOT NULL"
EXECUTIONS_BY_STATUS = "CREATE INDEX executions_by_status ON executions (status, created_at)"
EXECUTIONS_BY_AGE = "CREATE INDEX executions_by_age ON executions (created_at)"

LEASE_HISTORY = """
CREATE TABLE lease_history (
    execution_id TEXT NOT NULL,
    token        INTEGER NOT NULL,
    holder       TEXT NOT NULL,     -- host:pid of the process that claimed
    claimed_at   INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,  -- as of the end; for a live lease see executions
    renewals     INTEGER NOT NULL DEFAULT 0,
    ended_at     INTEGER,
    ended_by     TEXT,              -- acknowledged | released | superseded; NULL until then
    outcome      TEXT,              -- suspended | completed | failed, when acknowledged
    PRIMARY KEY (execution_id, token)
) WITHOUT ROWID"""

STEPS = """
CREATE TABLE steps (
    execution_id       TEXT NOT NULL,
    step_key           TEXT NOT NULL,
    attempt            INTEGER NOT NULL,
    done               INTEGER NOT NULL,
    step_response_json TEXT NOT NULL,
    token              INTEGER NOT NULL,  -- the fencing token the write was accepted under
    written_at         INTEGER NOT NULL,
    PRIMARY KEY (execution_id, step_key, attempt)
)"""  # a rowid table, so that rowid gives the order steps were written in

WAITERS = """
CREATE TABLE waiters (
    kind          TEXT NOT NULL,  -- execution | effect | store
    target        TEXT NOT NULL,
    waiter        TEXT NOT NULL,  -- the execution to wake
    registered_at INTEGER NOT NULL,
    PRIMARY KEY (kind, target, waiter)
) WITHOUT ROWID"""

STARTS = """
CREATE TABLE starts (
    start_request_id TEXT PRIMARY KEY,
    execution_id     TEXT NOT NULL,  -- the first target; a repeat starts nothing and gets it
    created_at       INTEGER NOT NULL
) WITHOUT ROWID"""

EFFECTS = """
CREATE TABLE effects (
    effect_id   TEXT PRIMARY KEY,
    status      TEXT NOT NULL,    -- pending | settled
    result_json TEXT,             -- the first settled result, kept
    begun       INTEGER NOT NULL, -- how many times begin() was called (operators: repeats)
    conflicts   INTEGER NOT NULL, -- settles with a different result, reported and not applied
    created_at  INTEGER NOT NULL,
    settled_at  INTEGER
) WITHOUT ROWID"""

STORES = """
CREATE TABLE stores (
    name       TEXT PRIMARY KEY,
    state_json TEXT NOT NULL,
    version    INTEGER NOT NULL,  -- bumped by every committed change
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
) WITHOUT ROWID"""

STORE_RECEIPTS = """
CREATE TABLE store_receipts (
    store        TEXT NOT NULL,
    execution_id TEXT NOT NULL,
    step_key     TEXT NOT NULL,
    result_json  TEXT NOT NULL,   -- what the change returned, for every holder that asks again
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (store, execution_id, step_key)
) WITHOUT ROWID"""

# Version 2: what operators need. Purge walks terminal executions by the time they last changed,
# and keeps a child whose parent (now recorded with the start) is not terminal; `waiting_for`
# finds an execution's registrations by waiter; a store waiter remembers its match.
EXECUTIONS_BY_UPDATE = "CREATE INDEX executions_by_update ON executions (status, updated_at)"
WAITERS_BY_WAITER = "CREATE INDEX waiters_by_waiter ON waiters (waiter)"
WAITERS_DETAIL = "ALTER TABLE waiters ADD COLUMN detail TEXT"  # e.g. the match of a store take, as JSON
STARTS_PARENT = "ALTER TABLE starts ADD COLUMN parent TEXT"  # the execution that started it; NULL: outside
STARTS_BY_TARGET = "CREATE INDEX starts_by_target ON starts (execution_id)"

# Version 3: epochs, so that a restored ledger never issues a token twice (`tables.epochs`).
# Every ledger so far ran in epoch 0, whose tokens are those it always issued.
EPOCHS = """
CREATE TABLE epochs (
    epoch       INTEGER PRIMARY KEY,  -- its tokens are epoch * 2**32 + 1, + 2, ...
    started_at  INTEGER NOT NULL,
    reason      TEXT NOT NULL,        -- created | restored | failover
    incarnation TEXT                  -- PostgreSQL: the server it began on; NULL on SQLite
)"""
FIRST_EPOCH = """
INSERT INTO epochs (epoch, started_at, reason) VALUES (0, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER), 'created')"""

# Version 4: routing and live supervisors (SPEC section 11). A supervisor claims only the
# workflows its app registers: one seek per workflow in these, so due executions that nobody here
# serves are never read by its claims or by its wait for the next one.
EXECUTIONS_CLAIMABLE_BY_WORKFLOW = """
CREATE INDEX executions_claimable_by_workflow ON executions (workflow, due_at)
WHERE ready_at IS NOT NULL AND status <> 'running'"""
# Waiting rows only: a renewal, which moves a running row's ready_at, never writes to it.
EXECUTIONS_READY_BY_WORKFLOW = """
CREATE INDEX executions_ready_by_workflow ON executions (workflow, ready_at)
WHERE ready_at IS NOT NULL AND status <> 'running'"""
# Every running supervisor, refreshed at each renewal round (`tables.supervisors`).
SUPERVISORS = """
CREATE TABLE supervisors (
    supervisor_id  TEXT PRIMARY KEY,
    host           TEXT NOT NULL,
    pid            INTEGER NOT NULL,
    started_at     INTEGER NOT NULL,
    last_seen_at   INTEGER NOT NULL,
    renew_ms       INTEGER NOT NULL,  -- its renewal interval: live while seen within three of them
    workflows_json TEXT NOT NULL,     -- the workflows it serves, a JSON array of names
    concurrency    INTEGER NOT NULL,
    workers        INTEGER NOT NULL
) WITHOUT ROWID"""

# Version 5: schedules (SPEC section 12), one row per scheduled workflow (`tables.schedules`).
SCHEDULES = """
CREATE TABLE schedules (
    name       TEXT PRIMARY KEY,  -- the workflow
    spec       TEXT NOT NULL,     -- its cron expression, or "every S s"
    timezone   TEXT,              -- the cron's IANA zone; NULL: UTC
    last_tick  INTEGER,           -- the latest tick admitted (ms); NULL before the first
    next_tick  INTEGER,           -- the first tick not yet due; NULL: a cron that matches nothing
    updated_at INTEGER NOT NULL
) WITHOUT ROWID"""

# Version 6: queues and priority (SPEC section 12). Every execution belongs to a queue, may carry a
# key (`queue_key`: KEY is a keyword) and has a priority, higher first. The claim finds the
# (workflow, queue, priority) groups that hold claimable rows by a loose scan of one index, then
# seeks the due rows of each group with capacity: a saturated queue's backlog is never read. One
# claimable index, not one more by (queue, priority): on PostgreSQL the planner could take either
# for the other's seeks, and read rows of workflows or queues it should step over.
EXECUTIONS_QUEUE = "ALTER TABLE executions ADD COLUMN queue TEXT NOT NULL DEFAULT 'default'"
EXECUTIONS_QUEUE_KEY = "ALTER TABLE executions ADD COLUMN queue_key TEXT"
EXECUTIONS_PRIORITY = "ALTER TABLE executions ADD COLUMN priority INTEGER NOT NULL DEFAULT 0"
DROP_CLAIMABLE = "DROP INDEX executions_claimable"
DROP_CLAIMABLE_BY_WORKFLOW = "DROP INDEX executions_claimable_by_workflow"
EXECUTIONS_CLAIMABLE_BY_WORKFLOW_GROUP = """
CREATE INDEX executions_claimable_by_workflow ON executions (workflow, queue, priority, due_at)
WHERE ready_at IS NOT NULL AND status <> 'running'"""
# The leases of a queue, by key: what its limits count (live: lease_expires_at > now, read from
# the row: with the expiry in the index, every renewal would write to it).
EXECUTIONS_RUNNING_BY_QUEUE = """
CREATE INDEX executions_running_by_queue ON executions (queue, queue_key) WHERE status = 'running'"""
# A queue's limits; no row: unlimited (`tables.queues`).
QUEUES = """
CREATE TABLE queues (
    name        TEXT PRIMARY KEY,
    concurrency INTEGER,           -- live leases of the queue at most; NULL: no limit
    per_key     INTEGER,           -- live leases per key at most; NULL: no limit
    rate_count  INTEGER,           -- claims in any window of rate_ms at most; NULL: no limit
    rate_ms     INTEGER,
    updated_at  INTEGER NOT NULL
) WITHOUT ROWID"""
# The claims of a rate-limited queue within its window, pruned by each claim of the queue.
QUEUE_CLAIMS = """
CREATE TABLE queue_claims (
    queue      TEXT NOT NULL,
    claimed_at INTEGER NOT NULL
)"""
QUEUE_CLAIMS_BY_QUEUE = "CREATE INDEX queue_claims_by_queue ON queue_claims (queue, claimed_at)"
# Each workflow's default queue and priority, as the app that serves it declares them.
WORKFLOW_QUEUES = """
CREATE TABLE workflow_queues (
    workflow   TEXT PRIMARY KEY,
    queue      TEXT NOT NULL,
    priority   INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
) WITHOUT ROWID"""

# Version 7: an execution admitted before any supervisor recorded its workflow's defaults (a
# `yieldstar start` before the first `supervise`) takes them when one does: `defaults_pending`
# says which of its queue (1) and priority (2) were not named by its start (`tables.queues`).
EXECUTIONS_DEFAULTS_PENDING = "ALTER TABLE executions ADD COLUMN defaults_pending INTEGER NOT NULL DEFAULT 0"
EXECUTIONS_PENDING_BY_WORKFLOW = """
CREATE INDEX executions_pending_by_workflow ON executions (workflow) WHERE defaults_pending <> 0"""

# Version 8: workflow timeouts (SPEC section 12). An execution's timeout and the deadline it runs
# to (admission + timeout); the deadlines of non-terminal executions indexed, so that the
# supervisors' check for passed ones, every round, is one seek that finds nothing most of the
# time; and each workflow's default timeout beside its default queue.
EXECUTIONS_TIMEOUT = "ALTER TABLE executions ADD COLUMN timeout_ms INTEGER"  # NULL: none
EXECUTIONS_DEADLINE = "ALTER TABLE executions ADD COLUMN deadline_at INTEGER"  # NULL: none
EXECUTIONS_BY_DEADLINE = """
CREATE INDEX executions_deadline ON executions (deadline_at)
WHERE deadline_at IS NOT NULL AND status NOT IN ('completed', 'failed', 'cancelled')"""
WORKFLOW_TIMEOUTS = "ALTER TABLE workflow_queues ADD COLUMN timeout_ms INTEGER"  # NULL: none

# Version 9: the claim's cost stays flat behind a saturated queue. The claimable index orders each
# (workflow, queue) by priority (higher first) then due time, so the claim discovers the queues
# that hold claimable rows with one seek each (not one per priority: a blocked queue's backlog
# costs a claim that step and nothing more) and reads a queue's rows in claim order with one seek.
EXECUTIONS_CLAIMABLE_BY_QUEUE = """
CREATE INDEX executions_claimable_by_workflow ON executions (workflow, queue, priority DESC, due_at)
WHERE ready_at IS NOT NULL AND status <> 'running'"""
# The claimable rows of a queue by key: a queue whose `per_key` holds keys saturated reads the
# others' rows key by key (a seek each, `queues.KEYS`), never the saturated keys' backlog.
EXECUTIONS_CLAIMABLE_BY_KEY = """
CREATE INDEX executions_claimable_by_key ON executions (queue, queue_key, workflow, priority DESC, due_at)
WHERE ready_at IS NOT NULL AND status <> 'running'"""

# Version 10: the trace context of the start that admitted an execution (OpenTelemetry, SPEC
# section 13): the propagator's carrier as JSON text (a W3C `traceparent`, and whatever else the
# starter's propagators wrote), which each claim hands to the worker so that its delivery spans
# join the starter's trace. NULL for a start made outside any span.
EXECUTIONS_TRACE_CONTEXT = "ALTER TABLE executions ADD COLUMN trace_context TEXT"

# Version 11: talking to a running workflow (SPEC section 14). Messages are kept in the order
# they were sent to an execution (`seq`), idempotent by their id; a message taken by a `recv`
# names the step that took it, so the step's every holder gets that one again and no other
# step can take it. Events are the latest value set under a key, per execution.
MESSAGES = """
CREATE TABLE messages (
    execution_id TEXT NOT NULL,
    message_id   TEXT NOT NULL,     -- the sender's idempotency key
    topic        TEXT NOT NULL,
    seq          INTEGER NOT NULL,  -- the order of the execution's messages, from 1
    message_json TEXT NOT NULL,
    sent_at      INTEGER NOT NULL,
    taken_step   TEXT,              -- the step key of the recv that took it; NULL: pending
    taken_at     INTEGER,
    PRIMARY KEY (execution_id, message_id)
) WITHOUT ROWID"""
MESSAGES_PENDING = """
CREATE INDEX messages_pending ON messages (execution_id, topic, seq) WHERE taken_step IS NULL"""
MESSAGES_TAKEN = """
CREATE UNIQUE INDEX messages_taken ON messages (execution_id, taken_step) WHERE taken_step IS NOT NULL"""
EVENTS = """
CREATE TABLE events (
    execution_id TEXT NOT NULL,
    event_key    TEXT NOT NULL,
    value_json   TEXT NOT NULL,     -- the last value set
    set_at       INTEGER NOT NULL,
    PRIMARY KEY (execution_id, event_key)
) WITHOUT ROWID"""

# Each entry brings a file from version i to i + 1.
MIGRATIONS: list[tuple[str, ...]] = [
    (EXECUTIONS, EXECUTIONS_CLAIMABLE, EXECUTIONS_EXPIRING, EXECUTIONS_READY, EXECUTIONS_BY_STATUS, EXECUTIONS_BY_AGE,
     LEASE_HISTORY, STEPS, WAITERS, STARTS, EFFECTS, STORES, STORE_RECEIPTS),
    (EXECUTIONS_BY_UPDATE, WAITERS_BY_WAITER, WAITERS_DETAIL, STARTS_PARENT, STARTS_BY_TARGET),
    (EPOCHS, FIRST_EPOCH),
    (EXECUTIONS_CLAIMABLE_BY_WORKFLOW, EXECUTIONS_READY_BY_WORKFLOW, SUPERVISORS),
    (SCHEDULES,),
    (EXECUTIONS_QUEUE, EXECUTIONS_QUEUE_KEY, EXECUTIONS_PRIORITY, DROP_CLAIMABLE, DROP_CLAIMABLE_BY_WORKFLOW,
     EXECUTIONS_CLAIMABLE_BY_WORKFLOW_GROUP, EXECUTIONS_RUNNING_BY_QUEUE, QUEUES,
     QUEUE_CLAIMS, QUEUE_CLAIMS_BY_QUEUE, WORKFLOW_QUEUES),
    (EXECUTIONS_DEFAULTS_PENDING, EXECUTIONS_PENDING_BY_WORKFLOW),
    (EXECUTIONS_TIMEOUT, EXECUTIONS_DEADLINE, EXECUTIONS_BY_DEADLINE, WORKFLOW_TIMEOUTS),
    (DROP_CLAIMABLE_BY_WORKFLOW, EXECUTIONS_CLAIMABLE_BY_QUEUE, EXECUTIONS_CLAIMABLE_BY_KEY),
    (EXECUTIONS_TRACE_CONTEXT,),
    (MESSAGES, MESSAGES_PENDING, MESSAGES_TAKEN, EVENTS),
]
SCHEMA_VERSION = len(MIGRATIONS)


_CREATE_TABLE = re.compile(r"\s*CREATE TABLE (\w+)")


def tables_at(version: int) -> set[str]:
    """The tables a ledger of schema `version` has."""
    return {match.group(1) for statements in MIGRATIONS[:version] for statement in statements
            if (match := _CREATE_TABLE.match(statement))}


# Every object but SQLite's own (sqlite_sequence, sqlite_stat1, ...).
OBJECTS = r"SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite\_%' ESCAPE '\'"


def recognise(conn: sqlite3.Connection, path: str) -> int:
    """The schema version of the file at `path`, read without writing anything.

    A file with version 0 is new only if it holds nothing at all; a version this Yieldstar
    knows must come with that version's tables.

    Raises:
        NotALedger: the file is an SQLite database that Yieldstar did not make.
        SchemaTooNew: a newer Yieldstar made it.
    """
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    objects = conn.execute(OBJECTS).fetchall()
    tables = {name for kind, name in objects if kind == "table"}
    if version == 0:
        if objects:
            shown = ", ".join(sorted(name for _, name in objects)[:5])
            raise NotALedger(f"{path} is not a Yieldstar ledger: it is an SQLite database holding {shown}"
                             f"{', ...' if len(objects) > 5 else ''}, which Yieldstar did not create")
        return version
    if version > SCHEMA_VERSION:
        if not tables_at(1) <= tables:
            raise NotALedger(f"{path} is not a Yieldstar ledger: its schema version is {version} and it lacks"
                             f" Yieldstar's tables")
        raise SchemaTooNew(f"{path} has schema version {version}, from a newer Yieldstar; this one understands up"
                           f" to version {SCHEMA_VERSION}: upgrade Yieldstar to use it")
    missing = tables_at(version) - tables
    if missing:
        raise NotALedger(f"{path} is not a Yieldstar ledger: it has schema version {version} but lacks the tables"
                         f" {', '.join(sorted(missing))}")
    return version


def migrate(conn: sqlite3.Connection, path: str) -> None:
    """Bring the schema to SCHEMA_VERSION; call inside a write transaction.

    The version is read again under the write lock: another process may have migrated the file
    since it was recognised.
    """
    version = recognise(conn, path)
    for statements in MIGRATIONS[version:]:
        for statement in statements:
            conn.execute(statement)
    if version != SCHEMA_VERSION:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
