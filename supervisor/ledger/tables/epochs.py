"""Epochs: a fencing token is never issued twice for one execution, whatever the database forgot.

A token fences only if the ledger never hands it out twice for the same execution. A ledger
restored from a backup, or a PostgreSQL server promoted from an asynchronous replica that had not
received the last commits, has forgotten claims it made; counting on from what it remembers would
issue again a token that a holder from before still carries, and that holder's renewals, step
writes, releases and acknowledgements would pass the fence.

So the ledger counts **epochs**, and every token of an epoch lies in its own range:

    epoch e:   tokens e * 2**32 + 1, e * 2**32 + 2, ...      (epoch 0: 1, 2, 3, ... as always)

Within an epoch a claim's token is the previous one plus one, as the contract says. An epoch is
raised when the ledger may have forgotten something: by `yieldstar restore` (SQLite), and on
PostgreSQL by the first session that finds the server to be another incarnation than the one the
ledger last ran on (`supervisor.ledger.postgres.incarnation`: a promoted replica or a
point-in-time recovery runs on a new timeline; a restored dump is another database). Raising it
is one transaction, which:

1. ends every delivery still open, as a release would (`fenced` in the lease history; the
   execution is delivered again after its redelivery delay);
2. moves every non-terminal execution's token up to `epoch * 2**32`, so that its next claim
   issues `epoch * 2**32 + 1`, above every token of every earlier epoch;
3. records the epoch, when and why (`epochs`, one row per epoch).

Executions admitted later start at the current epoch's floor (`execution_rows.INSERT`), and a
resumed one moves up to it (`executions.RESUME`): no token of an earlier epoch comes round again
for them either. A holder from before therefore carries a token no row has, and every fenced call
it makes is refused (`LeaseLost`), exactly as for any other stale holder.
"""

from __future__ import annotations

from typing import Optional

from ..connection import Transaction
from ..dialect import Rendered
from ..values import DeliveryEnd

EPOCH_BITS = 32  # an epoch has 2**32 tokens per execution: more claims than any execution will see
EPOCH_SPAN = 1 << EPOCH_BITS

# The current epoch's first token minus one: what an execution admitted now starts at.
FLOOR = f"COALESCE((SELECT max(epoch) FROM epochs), 0) * {EPOCH_SPAN}"

CURRENT = "SELECT epoch, incarnation FROM epochs ORDER BY epoch DESC LIMIT 1"
# Taken first by a transaction that may raise the epoch: a second one waits here, then reads
# CURRENT again and finds the epoch already raised (on SQLite the write lock does the same).
CURRENT_LOCKED = "SELECT epoch FROM epochs ORDER BY epoch DESC LIMIT 1 $for_update"
RECORD = "INSERT INTO epochs (epoch, started_at, reason, incarnation) VALUES ($p, $p, $p, $p)"
SEE_INCARNATION = "UPDATE epochs SET incarnation = $p WHERE epoch = $p AND incarnation IS NULL"

OPEN_DELIVERIES = "SELECT execution_id, token, lease_expires_at FROM executions WHERE status = 'running'"
LIFT_TOKENS = "UPDATE executions SET token = $p WHERE status NOT IN ($terminal)"


def token_epoch(token: int) -> int:
    """The epoch a token was issued in."""
    return token >> EPOCH_BITS


def current(db: Transaction, sql: Rendered) -> tuple[int, Optional[str]]:
    """(the current epoch, the incarnation it runs on, or None where none was recorded)."""
    row = db.execute(sql[CURRENT]).fetchone()
    return (0, None) if row is None else (row[0], row[1])


def raise_epoch(db: Transaction, sql: Rendered, now: int, *, reason: str, incarnation: Optional[str] = None,
                above: int = 0) -> int:
    """Raise the epoch in the caller's write transaction, above both the current one and `above`
    (a restore passes the epoch of the ledger it replaces); returns the new epoch. See the module
    docstring for what it does. Where other sessions may decide to raise it at the same moment
    (PostgreSQL), the caller takes `CURRENT_LOCKED` first and decides on what it reads after, as
    `supervisor.ledger.postgres.incarnation.settle` does."""
    # Imported here: the leases module imports this one for its floor.
    from .lease_history import HISTORY_CLOSE
    from .leases import RELEASE

    epoch = max(current(db, sql)[0], above) + 1
    for execution_id, token, expires_at in db.execute(sql[OPEN_DELIVERIES]).fetchall():
        ended = min(expires_at, now)  # a lease that already ran out ended then, as an expiry does
        db.execute(sql[RELEASE], (ended, ended, now, execution_id, token))
        db.execute(sql[HISTORY_CLOSE], (ended, DeliveryEnd.FENCED.value, None, ended, execution_id, token))
    db.execute(sql[LIFT_TOKENS], (epoch * EPOCH_SPAN,))
    db.execute(sql[RECORD], (epoch, now, reason, incarnation))
    return epoch
