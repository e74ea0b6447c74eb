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
whose connection broke reports readable once, reads nothing, and connects again in the
background; its `fileno()` is then a pipe, ready once the connection is back.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Optional

RECONNECT_S = 5.0  # how often a listener whose connection broke tries again

DUE = "yieldstar_due"
ENDED = "yieldstar_ended"
MAX_PAYLOAD = 7_900  # PostgreSQL takes up to 8000 bytes


def notify_due(conn) -> None:
    """Send the nudge on the backend's connection (`supervisor.ledger.postgres.connection.Connection`)."""
    conn.execute("SELECT pg_notify(%s, '')", (DUE,))


def notify_ended(conn, execution_ids: list[str]) -> None:
    payload = "\n".join(execution_ids)
    conn.execute("SELECT pg_notify(%s, %s)", (ENDED, payload if len(payload.encode()) <= MAX_PAYLOAD else ""))


class Listener:
    """One LISTEN on one channel, on a connection of its own.

    Its methods never wait for the server, so a supervisor's loop can hold it beside its
    children's pipes: once the connection breaks, connecting again is tried every
    `RECONNECT_S` on a thread of its own (a server that is away, or a host cut off from it,
    would block a connect for seconds). Meanwhile `fileno()` is a pipe, made ready when the
    connection is back; what was sent in between is lost, so that first read says "look at
    everything".
    """

    def __init__(self, uri: str, channel: str):
        self._uri = uri
        self._channel = channel
        self._lock = threading.Lock()  # guards _conn, _reconnecting and _closed across the two threads
        self._conn = None
        self._reconnecting = False
        self._closed = False
        # What `fileno()` gives while disconnected: ready once a connection is back.
        self._back_read, self._back_write = os.pipe()
        os.set_blocking(self._back_read, False)
        os.set_blocking(self._back_write, False)
        self._conn = self._connect()

    def _connect(self):
        """A connection listening on the channel, or None if the server cannot be reached."""
        import psycopg

        try:
            conn = psycopg.connect(self._uri, autocommit=True, connect_timeout=10, application_name="yieldstar-listen")
            conn.execute(f"LISTEN {self._channel}")
        except psycopg.Error:
            return None  # the server is away: the caller's polling goes on meanwhile
        return conn

    def _reconnect(self) -> None:
        """On its own thread: connect again every RECONNECT_S until it works or the listener closes."""
        while True:
            time.sleep(RECONNECT_S)
            with self._lock:
                if self._closed:
                    self._reconnecting = False
                    return
            conn = self._connect()
            if conn is None:
                continue
            with self._lock:
                self._reconnecting = False
                if self._closed:
                    conn.close()
                    return
                self._conn = conn
            try:
                os.write(self._back_write, b"\0")
            except OSError:
                pass  # already ready, or closed
            return

    def fileno(self) -> int:
        with self._lock:
            conn = self._conn
            if conn is not None and not conn.closed:
                return conn.pgconn.socket
            self._conn = None
            if not self._reconnecting and not self._closed:
                self._reconnecting = True
                threading.Thread(target=self._reconnect, name=f"listen-{self._channel}", daemon=True).start()
            return self._back_read

    def _take(self) -> Optional[list[str]]:
        """The payloads that arrived; None when the connection broke, or is back after breaking
        (what came in between is lost)."""
        import psycopg

        back = False
        try:
            back = bool(os.read(self._back_read, 64))
        except BlockingIOError:
            pass
        with self._lock:
            conn = self._conn
        if conn is None or back:
            return None
        try:
            conn.pgconn.consume_input()
            payloads = []
            while (note := conn.pgconn.notifies()) is not None:
                payloads.append(note.extra.decode())
            return payloads
        except psycopg.Error:
            conn.close()  # `fileno()` starts connecting again
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
        with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        for fd in (self._back_read, self._back_write):
            os.close(fd)
