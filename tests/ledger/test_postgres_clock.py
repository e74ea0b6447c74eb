"""The PostgreSQL ledger's clock (`supervisor.ledger.postgres.clock.ServerClock`): the server's
time, read once a second and carried forward on the monotonic clock, never ahead of the
server, never backwards, and blind to the host's wall clock."""

from __future__ import annotations

import time

import psycopg
import pytest

from faults import wait_until
from supervisor import Completed, Suspended, open_backend
from supervisor.ledger.postgres.clock import ServerClock

pytestmark = pytest.mark.timeout(60)

SERVER_NOW = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"


class Server:
    """A server clock a test can step: `read()` is what the backend would fetch."""

    def __init__(self, now_ms: int):
        self.now_ms, self.reads = now_ms, 0

    def read(self) -> int:
        self.reads += 1
        return self.now_ms


def test_a_burst_of_calls_reads_the_server_once_and_moves_with_the_monotonic_clock():
    server = Server(5_000_000)
    clock = ServerClock(server.read, sync_interval_s=60)
    started = time.monotonic()
    estimates = [clock() for _ in range(10_000)]
    elapsed_ms = (time.monotonic() - started) * 1000
    assert server.reads == clock.syncs == 1
    assert estimates[0] == 5_000_000
    assert estimates == sorted(estimates)
    assert 5_000_000 <= estimates[-1] <= 5_000_000 + elapsed_ms + 1


def test_the_server_is_read_again_after_the_interval_and_a_clock_stepped_back_never_moves_it_back():
    server = Server(5_000_000)
    clock = ServerClock(server.read, sync_interval_s=0.05)
    first = clock()
    server.now_ms = 4_000_000  # the server's clock is stepped back 1,000 s
    deadline = time.monotonic() + 10
    while server.reads < 2:
        assert time.monotonic() < deadline, "the clock never asked the server again"
        assert clock() >= first
    assert clock() >= first  # estimates never go backwards, whatever the server says
    server.now_ms = 9_000_000  # and forwards it follows at the next sync
    while server.reads < 3:
        assert time.monotonic() < deadline
        clock()
    assert clock() >= 9_000_000


def test_the_estimate_is_never_ahead_of_the_server_and_ignores_the_hosts_wall_clock(pg_uri, monkeypatch):
    with open_backend(pg_uri) as backend, psycopg.connect(pg_uri, autocommit=True) as conn:
        estimated = backend.clock()
        # A host whose wall clock is an hour ahead: the ledger's times stay the server's.
        real_time = time.time
        monkeypatch.setattr(time, "time", lambda: real_time() + 3600)
        monkeypatch.setattr(time, "time_ns", lambda: int((real_time() + 3600) * 1e9))
        for _ in range(200):
            estimated = backend.clock()
            server = conn.execute(SERVER_NOW).fetchone()[0]
            assert server - 500 <= estimated <= server  # behind by a reply's trip at most, never ahead
        record = backend.executions.admit("e1", "w")
        assert abs(record.created_at - conn.execute(SERVER_NOW).fetchone()[0]) < 1000
        assert backend.clock.syncs <= 2  # the 200 estimates above took one second at most


def test_threads_sharing_a_backend_never_deadlock_on_the_clock_and_the_connection(pg_uri):
    # One thread in a transaction asks for the time (holding the connection, wanting the clock);
    # another syncs the clock (holding the clock, wanting the connection): the clock must not
    # hold its lock while it reads the server.
    import threading

    with open_backend(pg_uri) as backend:
        backend.clock._interval_ns = 0  # every reading asks the server
        stop, claims = threading.Event(), []

        def claiming():  # a claim and an acknowledgement read the time again inside their transaction
            while not stop.is_set():
                backend.executions.admit(f"e{len(claims)}", "w")
                for lease in backend.executions.claim_due(limit=1, duration=60_000):
                    claims.append(backend.executions.acknowledge(lease, Completed("1")))

        def reading():
            while not stop.is_set():
                backend.clock()

        threads = [threading.Thread(target=claiming, daemon=True), threading.Thread(target=reading, daemon=True)]
        for thread in threads:
            thread.start()
        try:
            # Both threads at work long enough to have met in the two orders many times over;
            # deadlocked, neither gets any further.
            wait_until(lambda: len(claims) >= 200 and backend.clock.syncs >= 1_000, timeout=30,
                       message="200 claims and 1,000 clock readings (the threads deadlocked)")
        finally:
            stop.set()
            for thread in threads:
                thread.join(10)
        assert not any(thread.is_alive() for thread in threads), "the threads deadlocked"


def test_a_claim_records_no_time_before_the_rows_last_change_made_by_a_process_whose_estimate_is_ahead(pg_uri):
    # Two processes' estimates of the server's clock differ by their own lags. One acknowledges
    # a delivery at its estimate; another, a few ms behind, claims the execution at once (a wake
    # came during the lease): the history must still read the end, then the claim.
    t = 5_000_000_000_000
    with open_backend(pg_uri) as ahead, open_backend(pg_uri) as behind:
        ahead.clock, behind.clock = (lambda: t + 5), (lambda: t)
        ahead.executions.admit("e", "w", now=t - 100)
        (first,) = ahead.executions.claim_due(limit=1, duration=60_000, now=t - 100)
        ahead.executions.request_wake("e", t - 10, now=t - 50)
        assert ahead.executions.acknowledge(first, Suspended()) == Suspended()  # ended at t + 5
        (second,) = behind.executions.claim_due(limit=1, duration=60_000)
        ended, claimed = behind.executions.history("e")
        assert (ended.ended_by, ended.ended_at) == ("acknowledged", t + 5)
        assert claimed.claimed_at == t + 5 and second.expires_at == t + 5 + 60_000


@pytest.mark.parametrize("wake", ["request_wake", "the awaited execution's acknowledgement"])
def test_a_wake_stamped_by_a_process_whose_estimate_is_behind_moves_no_claim_before_the_last_delivery_ended(
        pg_uri, wake):
    # The same two estimates; the wake that follows the acknowledgement comes from the process
    # behind: `request_wake`, or the batch that acknowledges the execution it waited for, wakes it
    # and claims it at once. The row's last change must stay the end of the delivery, not move
    # back to the wake's earlier stamp.
    t = 5_000_000_000_000
    with open_backend(pg_uri) as ahead, open_backend(pg_uri) as behind:
        ahead.clock, behind.clock = (lambda: t + 5), (lambda: t)
        for execution_id in ("child", "parent"):  # claimed in this order
            ahead.executions.admit(execution_id, "w", now=t - 100)
        (child,) = behind.executions.claim_due(limit=1, duration=60_000, now=t - 100)
        (parent,) = ahead.executions.claim_due(limit=1, duration=60_000, now=t - 100)
        assert (child.execution_id, parent.execution_id) == ("child", "parent")
        ahead.executions.await_outcome("child", "parent")
        assert ahead.executions.acknowledge(parent, Suspended()) == Suspended()  # ended at t + 5
        if wake == "request_wake":
            behind.executions.request_wake("parent", t - 10)
            (second,) = behind.executions.claim_due(limit=1, duration=60_000)
        else:
            replies, (second,) = behind.executions.acknowledge_and_claim(
                [(child, Completed("1"))], limit=1, duration=60_000)
            assert replies == [Completed("1")]
        assert second.execution_id == "parent"
        ended, claimed = behind.executions.history("parent")
        assert (ended.ended_by, ended.ended_at) == ("acknowledged", t + 5)
        assert claimed.claimed_at == t + 5 and second.expires_at == t + 5 + 60_000


def test_a_step_written_by_a_process_whose_estimate_is_behind_records_no_time_before_its_claim(pg_uri):
    # The claim is stamped by a supervisor's estimate; the worker's estimate lags it (it was frozen
    # while it read the server's clock, and carries the late reading for up to a second): its step
    # must not read as written before the delivery it was written under began.
    t = 5_000_000_000_000
    with open_backend(pg_uri) as supervisor, open_backend(pg_uri) as worker:
        supervisor.clock, worker.clock = (lambda: t), (lambda: t - 2_900)
        supervisor.executions.admit("e", "w", now=t - 100)
        (lease,) = supervisor.executions.claim_due(limit=1, duration=60_000)
        worker.heap.write_step(lease, step_key="k1", step_attempt=1, done=True, step_response_json="1")
        worker.clock = lambda: t + 7  # once it is ahead of the claim, its own time stands
        worker.heap.write_step(lease, step_key="k2", step_attempt=1, done=True, step_response_json="2")
        with psycopg.connect(pg_uri) as conn:
            written = conn.execute("SELECT step_key, written_at FROM steps WHERE execution_id = 'e' ORDER BY step_key")
            assert written.fetchall() == [("k1", t), ("k2", t + 7)]
        (claimed,) = supervisor.executions.history("e")
        assert claimed.claimed_at == t
