"""Nudges and outcome announcements on PostgreSQL: `LISTEN`/`NOTIFY`, on every host at once.

The same two messages as on SQLite (`supervisor.ledger.sqlite.nudge`), on two channels of the database:

- `yieldstar_due`: work became due (an admission, a wake, a settled effect...). Idle
  supervisors listen and claim at once instead of at their next poll.
- `yieldstar_ended`: executions became terminal; the payload is their ids, one per line (empty
  when too many to name: "look at everything you wait for"). Waiting clients listen.

A notification is only a hint, sent after the commit it is about: polling stays the path that is
always correct, so one lost with a broken connection costs a poll interval. A listener has a
connection of its own (a LISTEN holds no transaction open, so it blocks nothing); its
`fileno()` joins a `select()`/`wait()` and `drain()`/`read()` consume what came. A listener
whose connection broke reports readable once, reads nothing, and tries to connect again every
few seconds; meanwhile its `fileno()` is a pipe that is never ready.
"""

from __future__ import annotations

import os
import time
from typing import Optional

RECONNECT_S = 5.0  # how often a listener whose connection broke tries again

DUE = "yieldstar_due"
ENDED = "yieldstar_ended"
MAX_PAYLOAD = 7_900  # PostgreSQL takes up to 8000 bytes


def notify_due(conn) -> None:
    """Send the nudge on the backend's connection (`supervisor.ledger.postgres.connection.Connection`)."""
    conn.execute("SELECT pg_notify(?, '')", (DUE,))


def notify_ended(conn, execution_ids: list[str]) -> None:
    payload = "\n".join(execution_ids)
    conn.execute("SELECT pg_notify(?, ?)", (ENDED, payload if len(payload.encode()) <= MAX_PAYLOAD else ""))


class Listener:
    """One LISTEN on one channel, on a connection of its own."""

    def __init__(self, uri: str, channel: str):
        self._uri = uri
        self._channel = channel
        self._conn = None
        self._tried_at = 0.0
        # What `fileno()` gives while disconnected: a pipe nobody writes, never ready.
        self._idle_read, self._idle_write = os.pipe()
        self._connect()

    def _connect(self) -> None:
        import psycopg

        self._tried_at = time.monotonic()
        try:
            conn = psycopg.connect(self._uri, autocommit=True, connect_timeout=10, application_name="yieldstar-listen")
            conn.execute(f"LISTEN {self._channel}")
        except psycopg.Error:
            return  # the server is away: the caller's polling goes on meanwhile
        self._conn = conn

    def fileno(self) -> int:
        if self._conn is None or self._conn.closed:
            self._conn = None
            if time.monotonic() - self._tried_at >= RECONNECT_S:
                self._connect()
            if self._conn is None:
                return self._idle_read
        return self._conn.pgconn.socket

    def _take(self) -> Optional[list[str]]:
        """The payloads that arrived; None if the connection broke (it is opened again)."""
        import psycopg

        if self._conn is None:
            return None
        try:
            self._conn.pgconn.consume_input()
            payloads = []
            while (note := self._conn.pgconn.notifies()) is not None:
                payloads.append(note.extra.decode())
            return payloads
        except psycopg.Error:
            self._conn.close()
            self._conn = None  # `fileno()` connects again
            return None

    def drain(self) -> None:
        self._take()

    def read(self) -> Optional[set[str]]:
        """The execution ids announced since the last read; None means "look at everything"."""
        payloads = self._take()
        if payloads is None or any(p == "" for p in payloads):
            return None
        return {i for p in payloads for i in p.split("\n")}

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        for fd in (self._idle_read, self._idle_write):
            os.close(fd)
