"""What the small tables' clients share: their connection, its statements, and the ledger's clock."""

from __future__ import annotations

from typing import Callable, Optional

from .. import arguments
from ..connection import Connection


class ClockedTable:
    """A table client on `conn`, whose calls take `now=` (ms) or read the ledger's clock."""

    def __init__(self, conn: Connection, clock: Callable[[], int]):
        self._conn = conn
        self._sql = conn.dialect.statements
        self._clock = clock

    def _now(self, now: Optional[int]) -> int:
        return self._clock() if now is None else arguments.integer("now", now)
