"""Which server a PostgreSQL ledger runs on, checked by every session before its first statement.

A ledger whose server forgot commits must never issue a token twice (`supervisor.ledger.tables.
epochs`). On PostgreSQL that happens when the ledger moves to another *incarnation* of its
database: an asynchronous replica promoted after the primary died (a new timeline, without the
commits it had not received), a point-in-time recovery (a new timeline), a dump restored into
another database or cluster (another database oid or system identifier). So each session of the
ledger, once connected, reads

    system identifier : database oid : timeline        e.g. 7715656165305819210:16384:2

and compares it with the incarnation the ledger's current epoch recorded. The same: nothing to
do (one round trip per connection, none per call). None recorded yet (a new ledger, or one made
before epochs): this one is recorded. Another: the session raises the epoch, in one transaction
that a concurrent session waits for and then finds done, before it runs anything else, so that
no holder from before can have a fenced call accepted on the new server. A planned switchover
that lost nothing raises it too: that costs the deliveries open at that moment a redelivery.

A session that reaches a server in recovery (a standby: read-only) is refused with `LedgerGone`
and a message saying so: the supervisor stops (exit 5) instead of failing every write.

A server where the functions are not granted (some managed services) has its incarnation
unchecked: it is logged once, and such a service's own failover must not lose commits (see
docs/postgres.md).
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

from ..errors import LedgerGone
from ..tables import epochs
from .connection import Connection, standby

log = logging.getLogger("yieldstar.ledger")

# pg_walfile_name() names the WAL segment with the timeline new WAL is written on (the first
# eight hex digits); it exists on a primary only, hence the CASE.
READ = """
SELECT pg_is_in_recovery(),
    (SELECT system_identifier FROM pg_control_system()),
    (SELECT oid FROM pg_database WHERE datname = current_database()),
    CASE WHEN pg_is_in_recovery() THEN NULL ELSE substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) END"""

_unchecked_logged = False


def read(conn, where: str) -> Optional[str]:
    """The incarnation the psycopg connection `conn` reached, or None where the server does not
    let this role read it.

    Raises:
        LedgerGone: the server is a read-only standby.
        psycopg.Error: the connection failed (the caller maps it).
    """
    import psycopg

    global _unchecked_logged
    try:
        in_recovery, system, database, timeline = conn.execute(READ).fetchone()
    except (psycopg.errors.InsufficientPrivilege, psycopg.errors.UndefinedFunction) as exc:
        if not _unchecked_logged:
            _unchecked_logged = True
            log.warning("cannot tell which server the ledger database %s runs on (%s): a failover to a replica that"
                        " lost commits would not be noticed; see docs/postgres.md", where,
                        str(exc).strip().splitlines()[0], extra={"event": "failover_unchecked"})
        in_recovery = conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]
        if in_recovery:
            raise LedgerGone(standby(where)) from None
        return None
    if in_recovery:
        raise LedgerGone(standby(where))
    return f"{system}:{database}:{int(timeline, 16)}"


def settle(conn: Connection, incarnation: str, clock: Callable[[], int], where: str) -> None:
    """Make the ledger's current epoch one of `incarnation`: record it where none is, or raise
    the epoch where another is recorded (see the module docstring). `clock()` is read only to
    raise it."""
    sql = conn.dialect.statements
    row = conn.execute(sql[epochs.CURRENT]).fetchone()
    if row is not None and row[1] == incarnation:
        return
    with conn.write(flush=True) as db:
        db.execute(sql[epochs.CURRENT_LOCKED])  # a concurrent session settling the same change waits here
        epoch, recorded = epochs.current(db, sql)
        if recorded == incarnation:
            return
        if recorded is None:
            db.execute(sql[epochs.SEE_INCARNATION], (incarnation, epoch))
            return
        raised = epochs.raise_epoch(db, sql, clock(), reason="failover", incarnation=incarnation)
    log.warning("the ledger database %s now runs on another server than before (%s, was %s): a promoted replica or"
                " a restore, which may have lost commits. Its epoch is now %d: every delivery open before is fenced"
                " off (its holder's calls are refused) and will be delivered again", where, incarnation, recorded,
                raised, extra={"event": "ledger_failover", "epoch": raised})
