"""Messages sent to an execution (SPEC section 14): every statement for `messages`.

A send appends a message to its execution, numbered after the execution's last (`seq`), and
wakes the execution if it waits for one, in one transaction; a repeat of its id adds nothing
(and answers as the first send did, even once the execution has ended).
A `recv` step takes the oldest pending message of its topic under its step key, fenced by the
delivery's token: the key is the message's receipt, so the step's every holder (a replay, a
later delivery after a crash between taking and recording) gets the same message, and no other
step can take it.

A waiting `recv` registers a `message` waiter on its own execution (target: its id, detail: the
topic, for operators). Every send to the execution wakes it, whichever the topic: a wake for
another topic costs one delivery, which finds nothing and waits again.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from .. import arguments
from ..connection import Connection
from ..contract import MessageClient
from ..errors import ExecutionConflict, UnknownExecution
from ..values import ExecutionLease, LeaseLost, Message
from . import waiters
from .clocked import ClockedTable
from .execution_rows import SELECT_ONE_LOCKED, TERMINAL

COLUMNS = "execution_id, message_id, topic, seq, message_json, sent_at, taken_step, taken_at"
# The lease's row, locked: a take is fenced by the token as a step write is (`heap.CURRENT`).
CURRENT_LOCKED = "SELECT 1 FROM executions WHERE execution_id = $p AND token = $p AND status = 'running' $for_update"
BY_ID = f"SELECT {COLUMNS} FROM messages WHERE execution_id = $p AND message_id = $p"
NEXT_SEQ = "SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE execution_id = $p"
INSERT = f"INSERT INTO messages ({COLUMNS}) VALUES ($p, $p, $p, $p, $p, $p, NULL, NULL)"
TAKEN_BY = f"SELECT {COLUMNS} FROM messages WHERE execution_id = $p AND taken_step = $p"
OLDEST_PENDING = f"""
SELECT {COLUMNS} FROM messages WHERE execution_id = $p AND topic = $p AND taken_step IS NULL ORDER BY seq LIMIT 1"""
ANY_PENDING = "SELECT 1 FROM messages WHERE execution_id = $p AND topic = $p AND taken_step IS NULL LIMIT 1"
TAKE = "UPDATE messages SET taken_step = $p, taken_at = $p WHERE execution_id = $p AND message_id = $p"
PENDING = """
SELECT topic, COUNT(*) FROM messages WHERE execution_id = $p AND taken_step IS NULL GROUP BY topic ORDER BY topic"""
LIST = f"SELECT {COLUMNS} FROM messages WHERE execution_id = $p ORDER BY seq"


class MessageTable(ClockedTable, MessageClient):
    def __init__(self, conn: Connection, clock: Callable[[], int], executions, on_due: Callable[[], None], *,
                 max_payload_bytes: int = arguments.DEFAULT_MAX_PAYLOAD_BYTES):
        super().__init__(conn, clock)
        self._executions = executions
        self._on_due = on_due
        self._max_payload = max_payload_bytes

    def send(self, execution_id, message_json, *, topic="default", message_id) -> tuple[Message, bool]:
        arguments.identifier("execution_id", execution_id)
        arguments.identifier("topic", topic)
        arguments.identifier("message id", message_id)
        arguments.json_text("message", message_json, limit=self._max_payload)
        now = self._clock()
        with self._conn.write() as db:
            row = db.execute(self._sql[SELECT_ONE_LOCKED], (execution_id,)).fetchone()
            if row is None:
                raise UnknownExecution(f"execution_id {execution_id!r} is not admitted: no message can be sent to it")
            # A repeat of a send that was kept answers as the first did, even once the execution
            # has ended: a sender retrying after a lost answer must not see an error for a
            # message that was delivered.
            kept = db.execute(self._sql[BY_ID], (execution_id, message_id)).fetchone()
            if kept is not None:
                return Message(*kept), False
            status = row[3]
            if status in TERMINAL:
                raise ExecutionConflict(f"execution {execution_id!r} is {status}: nothing will take a message sent"
                                        " to it")
            (seq,) = db.execute(self._sql[NEXT_SEQ], (execution_id,)).fetchone() or (1,)
            db.execute(self._sql[INSERT], (execution_id, message_id, topic, seq, message_json, now))
            woke = waiters.wake(db, self._sql, waiters.MESSAGE, execution_id, now, self._executions.wake_in)
        if woke:
            self._on_due()
        return Message(execution_id, message_id, topic, seq, message_json, now), True

    def take(self, lease: ExecutionLease, topic, *, step_key) -> Optional[Message] | LeaseLost:
        if not isinstance(lease, ExecutionLease):
            raise arguments.InvalidArgument(f"lease must be an ExecutionLease, not {type(lease).__name__}")
        arguments.identifier("topic", topic)
        arguments.identifier("step_key", step_key)
        eid = lease.execution_id
        now = self._clock()
        with self._conn.write() as db:
            if db.execute(self._sql[CURRENT_LOCKED], (eid, lease.token)).fetchone() is None:
                return LeaseLost()
            taken = db.execute(self._sql[TAKEN_BY], (eid, step_key)).fetchone()
            if taken is not None:
                return Message(*taken)
            found = db.execute(self._sql[OLDEST_PENDING], (eid, topic)).fetchone()
            if found is None:
                return None
            message = Message(*found)
            db.execute(self._sql[TAKE], (step_key, now, eid, message.message_id))
        return dataclasses.replace(message, taken_step=step_key, taken_at=now)

    def wait(self, execution_id, topic) -> bool:
        arguments.identifier("execution_id", execution_id)
        arguments.identifier("topic", topic)
        with self._conn.write() as db:
            # Locked as a send locks it: a send commits before this looks, or wakes what it registers.
            if db.execute(self._sql[SELECT_ONE_LOCKED], (execution_id,)).fetchone() is None:
                raise UnknownExecution(f"execution_id {execution_id!r} is not admitted: it cannot wait for a message")
            if db.execute(self._sql[ANY_PENDING], (execution_id, topic)).fetchone() is not None:
                return True
            waiters.register(db, self._sql, waiters.MESSAGE, execution_id, execution_id, self._clock(), topic)
        return False

    def pending(self, execution_id) -> dict[str, int]:
        arguments.identifier("execution_id", execution_id)
        return dict(self._conn.execute(self._sql[PENDING], (execution_id,)).fetchall())

    def list(self, execution_id) -> list[Message]:
        arguments.identifier("execution_id", execution_id)
        return [Message(*row) for row in self._conn.execute(self._sql[LIST], (execution_id,)).fetchall()]
