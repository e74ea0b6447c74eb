"""The ledger's schema on PostgreSQL, its version, and the migrations that bring a database up to
date: the same tables and columns as on SQLite (`supervisor.ledger.sqlite.schema`), in PostgreSQL's
types. Times are BIGINT milliseconds since the epoch; `seq` columns stand in for SQLite's rowid
(the order executions were admitted and steps written in).

The version is a row of `yieldstar_schema`. `migrate()` runs in one transaction holding a
transaction-level advisory lock (`pg_advisory_xact_lock`), so many processes opening one new
database at once create the schema exactly once; the others wait for the lock, read the new
version and do nothing. A database that holds tables but no `yieldstar_schema` is someone
else's and is refused untouched.
"""

from __future__ import annotations

from ..errors import NotALedger, SchemaTooNew

# The advisory lock key of schema changes: any constant, the same for every process.
SCHEMA_LOCK = 0x5969656C64  # "Yield"

VERSION_TABLE = "CREATE TABLE yieldstar_schema (version INTEGER NOT NULL)"

EXECUTIONS = """
CREATE TABLE executions (
    execution_id              TEXT PRIMARY KEY,
    seq                       BIGSERIAL NOT NULL,
    workflow                  TEXT NOT NULL,
    input_json                TEXT NOT NULL,
    status                    TEXT NOT NULL,
    token                     BIGINT NOT NULL,
    due_at                    BIGINT,
    lease_expires_at          BIGINT,
    unacknowledged_deliveries INTEGER NOT NULL,
    delivery_ended_at         BIGINT,
    ever_suspended            INTEGER NOT NULL,
    wake_during_lease         BIGINT,
    ready_at                  BIGINT,
    result_json               TEXT,
    error_json                TEXT,
    created_at                BIGINT NOT NULL,
    updated_at                BIGINT NOT NULL
)"""
# As on SQLite: claims walk the waiting backlog only (terminal and not-due rows are not in it).
EXECUTIONS_CLAIMABLE = """
CREATE INDEX executions_claimable ON executions (due_at, seq) WHERE ready_at IS NOT NULL AND status <> 'running'"""
EXECUTIONS_EXPIRING = "CREATE INDEX executions_expiring ON executions (ready_at) WHERE status = 'running'"
EXECUTIONS_READY = "CREATE INDEX executions_ready ON executions (ready_at) WHERE ready_at IS NOT NULL"
EXECUTIONS_BY_STATUS = "CREATE INDEX executions_by_status ON executions (status, created_at)"
EXECUTIONS_BY_AGE = "CREATE INDEX executions_by_age ON executions (created_at, seq)"
EXECUTIONS_BY_UPDATE = "CREATE INDEX executions_by_update ON executions (status, updated_at, seq)"

LEASE_HISTORY = """
CREATE TABLE lease_history (
    execution_id TEXT NOT NULL,
    token        BIGINT NOT NULL,
    holder       TEXT NOT NULL,
    claimed_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    renewals     INTEGER NOT NULL DEFAULT 0,
    ended_at     BIGINT,
    ended_by     TEXT,
    outcome      TEXT,
    PRIMARY KEY (execution_id, token)
)"""

STEPS = """
CREATE TABLE steps (
    execution_id       TEXT NOT NULL,
    step_key           TEXT NOT NULL,
    attempt            INTEGER NOT NULL,
    seq                BIGSERIAL NOT NULL,
    done               INTEGER NOT NULL,
    step_response_json TEXT NOT NULL,
    token              BIGINT NOT NULL,
    written_at         BIGINT NOT NULL,
    PRIMARY KEY (execution_id, step_key, attempt)
)"""
STEPS_IN_ORDER = "CREATE INDEX steps_in_order ON steps (execution_id, seq)"

WAITERS = """
CREATE TABLE waiters (
    kind          TEXT NOT NULL,
    target        TEXT NOT NULL,
    waiter        TEXT NOT NULL,
    registered_at BIGINT NOT NULL,
    detail        TEXT,
    PRIMARY KEY (kind, target, waiter)
)"""
WAITERS_BY_WAITER = "CREATE INDEX waiters_by_waiter ON waiters (waiter)"

STARTS = """
CREATE TABLE starts (
    start_request_id TEXT PRIMARY KEY,
    execution_id     TEXT NOT NULL,
    created_at       BIGINT NOT NULL,
    parent           TEXT
)"""
STARTS_BY_TARGET = "CREATE INDEX starts_by_target ON starts (execution_id)"

EFFECTS = """
CREATE TABLE effects (
    effect_id   TEXT PRIMARY KEY,
    status      TEXT NOT NULL,
    result_json TEXT,
    begun       INTEGER NOT NULL,
    conflicts   INTEGER NOT NULL,
    created_at  BIGINT NOT NULL,
    settled_at  BIGINT
)"""

STORES = """
CREATE TABLE stores (
    name       TEXT PRIMARY KEY,
    state_json TEXT NOT NULL,
    version    BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
)"""

STORE_RECEIPTS = """
CREATE TABLE store_receipts (
    store        TEXT NOT NULL,
    execution_id TEXT NOT NULL,
    step_key     TEXT NOT NULL,
    result_json  TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (store, execution_id, step_key)
)"""

# Version 2 (the SQLite ledger's version 3): epochs, so that a ledger whose server forgot commits
# (a promoted replica, a point-in-time recovery) never issues a token twice (`tables.epochs`).
EPOCHS = """
CREATE TABLE epochs (
    epoch       INTEGER PRIMARY KEY,
    started_at  BIGINT NOT NULL,
    reason      TEXT NOT NULL,
    incarnation TEXT
)"""
FIRST_EPOCH = """
INSERT INTO epochs (epoch, started_at, reason) VALUES (0, (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
    'created')"""

# Version 3 (the SQLite ledger's version 4): routing and live supervisors, as on SQLite.
EXECUTIONS_CLAIMABLE_BY_WORKFLOW = """
CREATE INDEX executions_claimable_by_workflow ON executions (workflow, due_at, seq)
WHERE ready_at IS NOT NULL AND status <> 'running'"""
EXECUTIONS_READY_BY_WORKFLOW = """
CREATE INDEX executions_ready_by_workflow ON executions (workflow, ready_at)
WHERE ready_at IS NOT NULL AND status <> 'running'"""
SUPERVISORS = """
CREATE TABLE supervisors (
    supervisor_id  TEXT PRIMARY KEY,
    host           TEXT NOT NULL,
    pid            INTEGER NOT NULL,
    started_at     BIGINT NOT NULL,
    last_seen_at   BIGINT NOT NULL,
    renew_ms       BIGINT NOT NULL,
    workflows_json TEXT NOT NULL,
    concurrency    INTEGER NOT NULL,
    workers        INTEGER NOT NULL
)"""

# Version 4 (the SQLite ledger's version 5): schedules, as on SQLite.
SCHEDULES = """
CREATE TABLE schedules (
    name       TEXT PRIMARY KEY,
    spec       TEXT NOT NULL,
    timezone   TEXT,
    last_tick  BIGINT,
    next_tick  BIGINT,
    updated_at BIGINT NOT NULL
)"""

# Version 5 (the SQLite ledger's version 6): queues and priority, as on SQLite.
EXECUTIONS_QUEUE = "ALTER TABLE executions ADD COLUMN queue TEXT NOT NULL DEFAULT 'default'"
EXECUTIONS_QUEUE_KEY = "ALTER TABLE executions ADD COLUMN queue_key TEXT"
EXECUTIONS_PRIORITY = "ALTER TABLE executions ADD COLUMN priority BIGINT NOT NULL DEFAULT 0"
DROP_CLAIMABLE = "DROP INDEX executions_claimable"
DROP_CLAIMABLE_BY_WORKFLOW = "DROP INDEX executions_claimable_by_workflow"
EXECUTIONS_CLAIMABLE_BY_WORKFLOW_GROUP = """
CREATE INDEX executions_claimable_by_workflow ON executions (workflow, queue, priority, due_at, seq)
WHERE ready_at IS NOT NULL AND status <> 'running'"""
EXECUTIONS_RUNNING_BY_QUEUE = """
CREATE INDEX executions_running_by_queue ON executions (queue, queue_key) WHERE status = 'running'"""
QUEUES = """
CREATE TABLE queues (
    name        TEXT PRIMARY KEY,
    concurrency INTEGER,
    per_key     INTEGER,
    rate_count  INTEGER,
    rate_ms     BIGINT,
    updated_at  BIGINT NOT NULL
)"""
QUEUE_CLAIMS = """
CREATE TABLE queue_claims (
    queue      TEXT NOT NULL,
    claimed_at BIGINT NOT NULL
)"""
QUEUE_CLAIMS_BY_QUEUE = "CREATE INDEX queue_claims_by_queue ON queue_claims (queue, claimed_at)"
WORKFLOW_QUEUES = """
CREATE TABLE workflow_queues (
    workflow   TEXT PRIMARY KEY,
    queue      TEXT NOT NULL,
    priority   BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
)"""

# Version 6 (the SQLite ledger's version 7): the defaults an execution takes when they are recorded.
EXECUTIONS_DEFAULTS_PENDING = "ALTER TABLE executions ADD COLUMN defaults_pending INTEGER NOT NULL DEFAULT 0"
EXECUTIONS_PENDING_BY_WORKFLOW = """
CREATE INDEX executions_pending_by_workflow ON executions (workflow) WHERE defaults_pending <> 0"""

# Version 7 (the SQLite ledger's version 8): workflow timeouts, as on SQLite.
EXECUTIONS_TIMEOUT = "ALTER TABLE executions ADD COLUMN timeout_ms BIGINT"
EXECUTIONS_DEADLINE = "ALTER TABLE executions ADD COLUMN deadline_at BIGINT"
EXECUTIONS_BY_DEADLINE = """
CREATE INDEX executions_deadline ON executions (deadline_at)
WHERE deadline_at IS NOT NULL AND status NOT IN ('completed', 'failed', 'cancelled')"""
WORKFLOW_TIMEOUTS = "ALTER TABLE workflow_queues ADD COLUMN timeout_ms BIGINT"

# Version 8 (the SQLite ledger's version 9): the claimable index by (workflow, queue), then
# priority (higher first) and due time, and the claimable rows of a queue by key, as on SQLite.
EXECUTIONS_CLAIMABLE_BY_QUEUE = """
CREATE INDEX executions_claimable_by_workflow ON executions (workflow, queue, priority DESC, due_at, seq)
WHERE ready_at IS NOT NULL AND status <> 'running'"""
EXECUTIONS_CLAIMABLE_BY_KEY = """
CREATE INDEX executions_claimable_by_key ON executions (queue, queue_key, workflow, priority DESC, due_at, seq)
WHERE ready_at IS NOT NULL AND status <> 'running'"""

# Version 9 (the SQLite ledger's version 10): the trace context of the start that admitted an
# execution, as on SQLite.
EXECUTIONS_TRACE_CONTEXT = "ALTER TABLE executions ADD COLUMN trace_context TEXT"

# Version 10 (the SQLite ledger's version 11): messages and events, as on SQLite.
MESSAGES = """
CREATE TABLE messages (
    execution_id TEXT NOT NULL,
    message_id   TEXT NOT NULL,
    topic        TEXT NOT NULL,
    seq          BIGINT NOT NULL,
    message_json TEXT NOT NULL,
    sent_at      BIGINT NOT NULL,
    taken_step   TEXT,
    taken_at     BIGINT,
    PRIMARY KEY (execution_id, message_id)
)"""
MESSAGES_PENDING = """
CREATE INDEX messages_pending ON messages (execution_id, topic, seq) WHERE taken_step IS NULL"""
MESSAGES_TAKEN = """
CREATE UNIQUE INDEX messages_taken ON messages (execution_id, taken_step) WHERE taken_step IS NOT NULL"""
EVENTS = """
CREATE TABLE events (
    execution_id TEXT NOT NULL,
    event_key    TEXT NOT NULL,
    value_json   TEXT NOT NULL,
    set_at       BIGINT NOT NULL,
    PRIMARY KEY (execution_id, event_key)
)"""

# Each entry brings a database from version i to i + 1. Version 1 here is the SQLite ledger's
# version 2: PostgreSQL ledgers start with everything the operators' calls need.
MIGRATIONS: list[tuple[str, ...]] = [
    (VERSION_TABLE, EXECUTIONS, EXECUTIONS_CLAIMABLE, EXECUTIONS_EXPIRING, EXECUTIONS_READY, EXECUTIONS_BY_STATUS,
     EXECUTIONS_BY_AGE, EXECUTIONS_BY_UPDATE, LEASE_HISTORY, STEPS, STEPS_IN_ORDER, WAITERS, WAITERS_BY_WAITER,
     STARTS, STARTS_BY_TARGET, EFFECTS, STORES, STORE_RECEIPTS),
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
# Each table, by the schema version that brought it.
TABLES_SINCE = {"executions": 1, "lease_history": 1, "steps": 1, "waiters": 1, "starts": 1, "effects": 1, "stores": 1,
                "store_receipts": 1, "epochs": 2, "supervisors": 3,
                "schedules": 4, "queues": 5, "queue_claims": 5, "workflow_queues": 5,
                "messages": 10, "events": 10}
TABLES = tuple(TABLES_SINCE)

SCHEMA_TABLES = "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"


def recognise(db, where: str) -> int:
    """The schema version of the database (0: empty, to be created), read without writing.

    Raises:
        NotALedger: the database holds tables that Yieldstar did not make.
        SchemaTooNew: a newer Yieldstar made it.
    """
    tables = {name for (name,) in db.execute(SCHEMA_TABLES).fetchall()}
    if "yieldstar_schema" not in tables:
        if tables:
            shown = ", ".join(sorted(tables)[:5])
            raise NotALedger(f"{where} is not a Yieldstar ledger: its schema holds {shown}"
                             f"{', ...' if len(tables) > 5 else ''}, which Yieldstar did not create; give a database"
                             f" (or a schema, with ?options=-csearch_path=NAME) of its own")
        return 0
    row = db.execute("SELECT version FROM yieldstar_schema").fetchone()
    version = row[0] if row is not None else 0
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(f"{where} has schema version {version}, from a newer Yieldstar; this one understands up to"
                           f" version {SCHEMA_VERSION}: upgrade Yieldstar to use it")
    missing = {table for table, since in TABLES_SINCE.items() if since <= version} - tables
    if missing:
        raise NotALedger(f"{where} is not a Yieldstar ledger: it has schema version {version} but lacks the tables"
                         f" {', '.join(sorted(missing))}")
    return version


def migrate(db, where: str) -> int:
    """Bring the schema to SCHEMA_VERSION inside the caller's write transaction; returns the
    version found. Waits for any other process migrating the same database first."""
    db.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
    version = recognise(db, where)  # again, under the lock: another process may have migrated
    for statements in MIGRATIONS[version:]:
        for statement in statements:
            db.execute(statement)
    if version == 0:
        db.execute("INSERT INTO yieldstar_schema (version) VALUES (%s)", (SCHEMA_VERSION,))
    elif version != SCHEMA_VERSION:
        db.execute("UPDATE yieldstar_schema SET version = %s", (SCHEMA_VERSION,))
    return version
