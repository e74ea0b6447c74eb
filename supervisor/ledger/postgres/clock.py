"""`ServerClock`: the database server's clock, as one process knows it.

Every time the PostgreSQL ledger decides on (claimability, lease expiry, timers, `created_at`)
is the server's, so that hosts whose own clocks disagree still agree on which leases are live
(SPEC section 7). Asking the server in every call would cost a round trip each time (the
statement count of a workflow doubled), so the clock is read once in a while and carried
forward on this process's monotonic clock:

    estimate(t) = server time read at the last sync + monotonic time since that reply came

The server read its clock before its reply left, so an estimate is never ahead of the server:
it lags by the reply's trip at most (plus the drift between the two clocks' rates over one
sync interval, microseconds). Lagging is the safe side of every decision: a lease is taken over
a little later, a timer fires a little later, a renewed lease is a little shorter. The host's
wall clock never enters, so a host whose clock is wrong, or is stepped, changes nothing; a
monotonic clock that stands still while the host is suspended only makes the estimate lag more,
until the next sync. Estimates never go backwards.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

SYNC_INTERVAL_S = 1.0  # how long an estimate is carried forward before the server is asked again


class ServerClock:
    """Milliseconds since the Unix epoch by the server's clock; `read()` asks the server."""

    def __init__(self, read: Callable[[], int], *, sync_interval_s: float = SYNC_INTERVAL_S):
        self._read = read
        self._interval_ns = int(sync_interval_s * 1e9)
        self._lock = threading.Lock()
        self._server_ms = 0  # the server's time in its last reply
        self._received_ns = None  # the monotonic time that reply came, None before the first
        self._last = 0  # the latest estimate given, which later ones never fall below
        self.syncs = 0

    def __call__(self) -> int:
        now_ns = time.monotonic_ns()
        with self._lock:
            due = self._received_ns is None or now_ns - self._received_ns >= self._interval_ns
            if not due:
                return self._estimate(now_ns)
        # The server is read outside the lock: the read takes the connection's lock, which a
        # thread in a transaction holds while it asks for the time (the other order deadlocks).
        server_ms = self._read()  # a storage error propagates: the call needing the time fails
        received_ns = time.monotonic_ns()
        with self._lock:
            self.syncs += 1
            if self._received_ns is None or received_ns > self._received_ns:
                self._server_ms, self._received_ns = server_ms, received_ns
            return self._estimate(received_ns)

    def _estimate(self, now_ns: int) -> int:
        """Under the lock: the estimate at monotonic `now_ns`, never below one given before."""
        estimate = self._server_ms + (now_ns - self._received_ns) // 1_000_000
        self._last = max(self._last, estimate)
        return self._last
