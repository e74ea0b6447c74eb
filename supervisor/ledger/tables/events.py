"""Events an execution publishes (SPEC section 14): every statement for `events`.

`ctx.set_event` sets the latest value under a key, fenced by the delivery's token; once the
set committed, the backend announces the execution's id the way the commit of an outcome does
(`Backend.listen_for_outcomes`), so a client waiting in `get_event` reads the event again at
once rather than at its next slow poll. A waiter for an outcome that hears such an announcement
finds the execution not terminal yet and waits on.
"""

from __future__ import annotations

from typing import Callable, Optional

from .. import arguments
from ..connection import Connection
from ..contract import EventClient
from ..values import Event, ExecutionLease, LeaseLost
from .clocked import ClockedTable
from .messages import CURRENT_LOCKED

COLUMNS = "execution_id, event_key, value_json, set_at"
GET = f"SELECT {COLUMNS} FROM events WHERE execution_id = $p AND event_key = $p"
SET = f"""
INSERT INTO events ({COLUMNS}) VALUES ($p, $p, $p, $p)
ON CONFLICT (execution_id, event_key) DO UPDATE SET value_json = excluded.value_json, set_at = excluded.set_at"""
LIST = f"SELECT {COLUMNS} FROM events WHERE execution_id = $p ORDER BY event_key"


class EventTable(ClockedTable, EventClient):
    def __init__(self, conn: Connection, clock: Callable[[], int], on_set: Callable[[list[str]], None], *,
                 max_payload_bytes: int = arguments.DEFAULT_MAX_PAYLOAD_BYTES):
        super().__init__(conn, clock)
        self._on_set = on_set
        self._max_payload = max_payload_bytes

    def set(self, lease: ExecutionLease, key, value_json) -> Event | LeaseLost:
        if not isinstance(lease, ExecutionLease):
            raise arguments.InvalidArgument(f"lease must be an ExecutionLease, not {type(lease).__name__}")
        arguments.identifier("event key", key)
        arguments.json_text(f"event {key!r} value", value_json, limit=self._max_payload)
        eid = lease.execution_id
        now = self._clock()
        with self._conn.write() as db:
            if db.execute(self._sql[CURRENT_LOCKED], (eid, lease.token)).fetchone() is None:
                return LeaseLost()
            db.execute(self._sql[SET], (eid, key, value_json, now))
        self._on_set([eid])
        return Event(eid, key, value_json, now)

    def get(self, execution_id, key) -> Optional[Event]:
        arguments.identifier("execution_id", execution_id)
        arguments.identifier("event key", key)
        row = self._conn.execute(self._sql[GET], (execution_id, key)).fetchone()
        return None if row is None else Event(*row)

    def list(self, execution_id) -> list[Event]:
        arguments.identifier("execution_id", execution_id)
        return [Event(*row) for row in self._conn.execute(self._sql[LIST], (execution_id,)).fetchall()]
