"""`SqliteBackend`: one connection to a ledger file, and the clients that share it."""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Callable, Optional

from .. import arguments
from ..errors import InvalidArgument
from ..nudge import nudge
from .connection import Connection
from .executions import SqliteExecutionClient
from .effects import SqliteEffectClient
from .heap import SqliteHeapClient
from .starts import SqliteStartClient
from .stores import SqliteStoreClient
from .schema import NotALedger, migrate


def wall_clock() -> int:
    """Milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000


def default_redelivery_delay(n: int) -> int:
    """1 s after the first unacknowledged delivery, doubling each time, at most 5 minutes."""
    return min(1000 * 2 ** min(n - 1, 30), 300_000)


# How far a user's redelivery_delay is checked up front for being positive and non-decreasing.
CHECKED_DELAYS = 64


def _checked_delay(fn: Callable[[int], int]) -> Callable[[int], int]:
    if not callable(fn):
        raise InvalidArgument(f"redelivery_delay must be callable, not {type(fn).__name__}")
    previous = 0
    for n in range(1, CHECKED_DELAYS + 1):
        value = fn(n)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise InvalidArgument(f"redelivery_delay({n}) must be an int > 0 ms, got {value!r}")
        if value < previous:
            raise InvalidArgument(
                f"redelivery_delay must not decrease: redelivery_delay({n}) = {value} < redelivery_delay({n - 1}) = {previous}"
            )
        previous = value

    def delay(n: int) -> int:
        return fn(n) if n <= CHECKED_DELAYS else max(fn(n), previous)

    return delay


class SqliteBackend:
    """A ledger on one SQLite file. Any number of processes may open the same file at once."""

    def __init__(self, path, *, clock: Optional[Callable[[], int]] = None,
                 redelivery_delay: Optional[Callable[[int], int]] = None, durability: str = "normal"):
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidArgument(f"path must be a str or os.PathLike, not {type(path).__name__}")
        if clock is not None and not callable(clock):
            raise InvalidArgument(f"clock must be callable, not {type(clock).__name__}")
        self.clock = clock or wall_clock
        self.redelivery_delay = _checked_delay(redelivery_delay or default_redelivery_delay)
        self.path = os.fspath(path)
        self.durability = durability
        try:
            self._conn = Connection(self.path, durability=durability,
                                    functions=[("yieldstar_delay", 1, self.redelivery_delay)])
        except sqlite3.DatabaseError as exc:
            raise NotALedger(f"{self.path} is not a Yieldstar ledger: {exc}") from exc
        try:
            with self._conn.write() as db:
                migrate(db)
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise NotALedger(f"{self.path} is not a Yieldstar ledger: {exc}") from exc
        except BaseException:
            self._conn.close()
            raise
        announce = self._announce_due
        self.executions = SqliteExecutionClient(self._conn, self._clock, self.redelivery_delay, on_due=announce)
        self.heap = SqliteHeapClient(self._conn, self._clock)
        self.starts = SqliteStartClient(self._conn, self._clock, on_due=announce)
        self.effects = SqliteEffectClient(self._conn, self._clock, self.executions, on_due=announce)
        self.stores = SqliteStoreClient(self._conn, self._clock, self.executions, on_due=announce)

    def _announce_due(self) -> None:
        nudge(self.path)

    def _clock(self) -> int:
        return arguments.integer("clock()", self.clock())

    @property
    def connection(self) -> Connection:
        return self._conn

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "SqliteBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SqliteBackend({self.path!r})"


def open_backend(path, *, clock=None, redelivery_delay=None, durability="normal") -> SqliteBackend:
    """Open (creating when missing) the ledger at `path`. See SPEC section 3."""
    return SqliteBackend(path, clock=clock, redelivery_delay=redelivery_delay, durability=durability)
