"""Named durable JSON stores (RFC 005): every statement for `stores` and `store_receipts`.

A change made by a workflow commits atomically with a receipt keyed by (store, execution, step
key): whichever holder commits first applies the change once, and every holder, stale or
current, gets the recorded result. Changes from outside (`put`, `set`) carry no receipt. Every
committed change bumps the store's version and wakes the executions waiting on it.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

from .. import arguments
from ..connection import Connection
from ..contract import NoMatch, StoreClient
from ..errors import InvalidArgument
from ..values import StoreReceipt, StoreState
from . import waiters

GET = "SELECT name, state_json, version FROM stores WHERE name = $p"
# Writes lock the store's row first (see `execution_rows.LOCKED`): changes, and a wait that checks the
# version before it registers, each see the last committed change and none slips in between.
GET_LOCKED = GET + " $for_update"
CREATE = """
INSERT INTO stores (name, state_json, version, created_at, updated_at) VALUES ($p, $p, 1, $p, $p)
ON CONFLICT (name) DO NOTHING"""
UPDATE = "UPDATE stores SET state_json = $p, version = version + 1, updated_at = $p WHERE name = $p"
LIST = "SELECT name, state_json, version FROM stores ORDER BY name"
RECEIPT = "SELECT result_json FROM store_receipts WHERE store = $p AND execution_id = $p AND step_key = $p"
RECORD = """
INSERT INTO store_receipts (store, execution_id, step_key, result_json, created_at) VALUES ($p, $p, $p, $p, $p)"""


class StoreTable(StoreClient):
    def __init__(self, conn: Connection, clock: Callable[[], int], executions, on_due: Callable[[], None], *,
                 max_payload_bytes: int = arguments.DEFAULT_MAX_PAYLOAD_BYTES):
        self._conn = conn
        self._max_payload = max_payload_bytes
        self._sql = conn.dialect.statements
        self._clock = clock
        self._executions = executions
        self._on_due = on_due

    def get(self, name) -> Optional[StoreState]:
        arguments.identifier("store name", name)
        row = self._conn.execute(self._sql[GET], (name,)).fetchone()
        return None if row is None else StoreState(*row)

    def list(self) -> list[StoreState]:
        return [StoreState(*row) for row in self._conn.execute(self._sql[LIST]).fetchall()]

    def get_or_create(self, name, initial_json) -> StoreState:
        arguments.identifier("store name", name)
        arguments.json_text("initial_json", initial_json, limit=self._max_payload)
        now = self._clock()
        with self._conn.write() as db:
            db.execute(self._sql[CREATE], (name, initial_json, now, now))
            return StoreState(*db.execute(self._sql[GET], (name,)).fetchone())

    def change(self, name, *, execution_id, step_key, change: Callable[[Any], tuple[Any, Any]]
               ) -> Optional[StoreReceipt]:
        arguments.identifier("store name", name)
        arguments.identifier("execution_id", execution_id)
        arguments.identifier("step_key", step_key)
        now = self._clock()
        with self._conn.write() as db:
            row = db.execute(self._sql[GET_LOCKED], (name,)).fetchone()
            recorded = db.execute(self._sql[RECEIPT], (name, execution_id, step_key)).fetchone()
            if recorded is not None:
                return StoreReceipt(name, execution_id, step_key, recorded[0], applied=False)
            if row is None:
                raise InvalidArgument(f"store {name!r} does not exist; create it with get_or_create first")
            try:
                new_state, result = change(json.loads(row[1]))
            except NoMatch:
                return None
            state_json = arguments.to_json(f"store {name!r} value", new_state, limit=self._max_payload)
            result_json = arguments.to_json(f"the result of the change to store {name!r}", result,
                                           limit=self._max_payload)
            db.execute(self._sql[UPDATE], (state_json, now, name))
            db.execute(self._sql[RECORD], (name, execution_id, step_key, result_json, now))
            woke = waiters.wake(db, self._sql, waiters.STORE, name, now, self._executions.wake_in)
        if woke:
            self._on_due()
        return StoreReceipt(name, execution_id, step_key, result_json, applied=True)

    def put(self, name, item_json) -> StoreState:
        """From outside: append an item to a list store (created empty when missing)."""
        arguments.identifier("store name", name)
        arguments.json_text("item_json", item_json, limit=self._max_payload)
        return self._outside(name, "[]", lambda state: _append(name, state, json.loads(item_json)))

    def set(self, name, state_json) -> StoreState:
        """From outside: replace the store's whole state (created when missing)."""
        arguments.identifier("store name", name)
        arguments.json_text("state_json", state_json, limit=self._max_payload)
        return self._outside(name, state_json, lambda state: json.loads(state_json))

    def _outside(self, name: str, initial_json: str, change: Callable[[Any], Any]) -> StoreState:
        now = self._clock()
        with self._conn.write() as db:
            db.execute(self._sql[CREATE], (name, initial_json, now, now))
            row = db.execute(self._sql[GET_LOCKED], (name,)).fetchone()
            db.execute(self._sql[UPDATE], (arguments.to_json(f"store {name!r} value", change(json.loads(row[1])),
                                                                limit=self._max_payload), now, name))
            woke = waiters.wake(db, self._sql, waiters.STORE, name, now, self._executions.wake_in)
            state = StoreState(*db.execute(self._sql[GET], (name,)).fetchone())
        if woke:
            self._on_due()
        return state

    def wait(self, name, execution_id, seen_version, *, match_json=None) -> bool:
        """Register `execution_id` to be woken by the next change; True if one already came
        after `seen_version` (then there is nothing to wait for)."""
        arguments.identifier("store name", name)
        arguments.identifier("execution_id", execution_id)
        arguments.integer("seen_version", seen_version)
        if match_json is not None:
            arguments.json_text("match_json", match_json, limit=self._max_payload)
        with self._conn.write() as db:
            row = db.execute(self._sql[GET_LOCKED], (name,)).fetchone()
            if row is not None and row[2] > seen_version:
                return True
            waiters.register(db, self._sql, waiters.STORE, name, execution_id, self._clock(), match_json)
        return False


def _append(name: str, state: Any, item: Any) -> list:
    if not isinstance(state, list):
        raise InvalidArgument(f"store {name!r} holds a {type(state).__name__}, not a list: cannot put an item in it")
    return state + [item]
