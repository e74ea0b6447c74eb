"""Effects (RFC 004): every statement for the `effects` table.

An effect is an external operation that must not repeat. Its id is handed to the external
system as the idempotency key; `settle` keeps the first result, and a different later result is
reported as a `SettleConflict`, never applied. Settling wakes the executions waiting on it.
"""

from __future__ import annotations

from typing import Callable, Optional

from .. import arguments
from ..connection import Connection
from ..contract import EffectClient
from ..values import EffectState, SettleConflict
from . import waiters

GET = "SELECT effect_id, status, result_json, begun FROM effects WHERE effect_id = $p"
BEGIN = """
INSERT INTO effects (effect_id, status, begun, conflicts, created_at) VALUES ($p, 'pending', 1, 0, $p)
ON CONFLICT (effect_id) DO UPDATE SET begun = effects.begun + 1"""
SETTLE = "UPDATE effects SET status = 'settled', result_json = $p, settled_at = $p WHERE effect_id = $p"
CREATE_SETTLED = """
INSERT INTO effects (effect_id, status, result_json, begun, conflicts, created_at, settled_at)
VALUES ($p, 'settled', $p, 0, 0, $p, $p)
ON CONFLICT (effect_id) DO NOTHING"""
# Writes lock the effect's row first (see `execution_rows.LOCKED`): a settle and a wait that checks
# the status before it registers see each other's commits, never a state in between.
GET_LOCKED = GET + " $for_update"
CONFLICT = "UPDATE effects SET conflicts = conflicts + 1 WHERE effect_id = $p"


def _state(row) -> EffectState:
    return EffectState(row[0], row[1], row[2], row[3])


class EffectTable(EffectClient):
    def __init__(self, conn: Connection, clock: Callable[[], int], executions, on_due: Callable[[], None], *,
                 max_payload_bytes: int = arguments.DEFAULT_MAX_PAYLOAD_BYTES):
        self._conn = conn
        self._max_payload = max_payload_bytes
        self._sql = conn.dialect.statements
        self._clock = clock
        self._executions = executions
        self._on_due = on_due

    def get(self, effect_id) -> Optional[EffectState]:
        arguments.identifier("effect_id", effect_id)
        row = self._conn.execute(self._sql[GET], (effect_id,)).fetchone()
        return None if row is None else _state(row)

    def begin(self, effect_id) -> EffectState:
        arguments.identifier("effect_id", effect_id)
        with self._conn.write() as db:
            db.execute(self._sql[BEGIN], (effect_id, self._clock()))
            return _state(db.execute(self._sql[GET], (effect_id,)).fetchone())

    def settle(self, effect_id, result_json) -> EffectState | SettleConflict:
        arguments.identifier("effect_id", effect_id)
        arguments.json_text("result_json", result_json, limit=self._max_payload)
        now = self._clock()
        woke = False
        with self._conn.write() as db:
            row = db.execute(self._sql[GET_LOCKED], (effect_id,)).fetchone()
            created = False
            if row is None:  # settled from outside before any workflow began it
                created = db.execute(self._sql[CREATE_SETTLED], (effect_id, result_json, now, now)).rowcount == 1
                if not created:  # another settle made it in the meantime: as if it came first
                    row = db.execute(self._sql[GET_LOCKED], (effect_id,)).fetchone()
            if row is not None and row[1] == "settled":
                if arguments.canonical_json(row[2]) != arguments.canonical_json(result_json):
                    db.execute(self._sql[CONFLICT], (effect_id,))
                    return SettleConflict(effect_id, row[2], result_json)
                return _state(row)
            if not created:
                db.execute(self._sql[SETTLE], (result_json, now, effect_id))
            woke = waiters.wake(db, self._sql, waiters.EFFECT, effect_id, now, self._executions.wake_in)
            state = _state(db.execute(self._sql[GET], (effect_id,)).fetchone())
        if woke:
            self._on_due()
        return state

    def wait(self, effect_id, execution_id) -> EffectState:
        arguments.identifier("effect_id", effect_id)
        arguments.identifier("execution_id", execution_id)
        with self._conn.write() as db:
            row = db.execute(self._sql[GET_LOCKED], (effect_id,)).fetchone()
            if row is not None and row[1] == "settled":
                return _state(row)
            waiters.register(db, self._sql, waiters.EFFECT, effect_id, execution_id, self._clock())
        return EffectState(effect_id, "pending", None, 0) if row is None else _state(row)
