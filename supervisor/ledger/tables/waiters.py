"""Waiter registrations: which executions want a wake when something changes.

A registration names a target (an execution that will finish, an effect that will settle, a
store that will change, the waiting execution itself for a message sent to it) and the waiting
execution. It is one-shot: the change that wakes it
deletes it; a waiter that still needs to wait registers again. Registrations are unfenced
(RFC 002): a stale one costs at most one extra delivery, which replay absorbs.

One kind is not woken by its target: `code`, which a parked execution holds under its workflow
until whatever makes it due again deletes it (`parking`).
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

from ..connection import Transaction
from ..dialect import Rendered
from ..errors import UnknownExecution
from .execution_rows import SELECT_ONE

EXECUTION = "execution"
MESSAGE = "message"
EFFECT = "effect"
STORE = "store"

REGISTER = """
INSERT INTO waiters (kind, target, waiter, registered_at, detail) VALUES ($p, $p, $p, $p, $p)
ON CONFLICT DO NOTHING"""
# The waiters of some targets, deleted as they are read: a wake is one statement, found or not.
# `{targets}` is a "$p" per target, at most TAKE_TARGETS (`take`).
TAKE = "DELETE FROM waiters WHERE kind = $p AND target IN ({targets}) RETURNING waiter"
TAKE_TARGETS = 64
OF_WAITER = "SELECT kind, target, detail FROM waiters WHERE waiter = $p ORDER BY registered_at, kind, target"
FORGET_WAITER = "DELETE FROM waiters WHERE waiter = $p"


def register(db: Transaction, sql: Rendered, kind: str, target: str, waiter: str, now: int, detail: Optional[str] = None
             ) -> None:
    # Only an admitted execution can wait: a registration naming nobody would make every later
    # wake of the target fail, and with it the settle, store change or outcome that wakes it.
    if db.execute(sql[SELECT_ONE], (waiter,)).fetchone() is None:
        raise UnknownExecution(f"execution_id {waiter!r} is not admitted: it cannot wait for {kind} {target!r}")
    db.execute(sql[REGISTER], (kind, target, waiter, now, detail))


def wake(db: Transaction, sql: Rendered, kind: str, target: str, now: int,
         wake_in: Callable[[Transaction, str, int, int], bool]) -> bool:
    """Wake every waiter on the target, in the caller's transaction; True if any was woken."""
    return wake_all(db, sql, kind, [target], now, wake_in)


def wake_all(db: Transaction, sql: Rendered, kind: str, targets: list[str], now: int,
             wake_in: Callable[[Transaction, str, int, int], bool]) -> bool:
    """Wake every waiter on any of the targets (a batch of acknowledgements' executions), in the
    caller's transaction; True if any was woken."""
    woken = False
    for start in range(0, len(targets), TAKE_TARGETS):
        some = targets[start:start + TAKE_TARGETS]
        for (waiter,) in db.execute(sql[take(len(some))], (kind, *some)).fetchall():
            woken = wake_in(db, waiter, now, now) or woken
    return woken


@functools.lru_cache(maxsize=TAKE_TARGETS)
def take(count: int) -> str:
    """TAKE for `count` targets."""
    return TAKE.format(targets=", ".join(["$p"] * count))
