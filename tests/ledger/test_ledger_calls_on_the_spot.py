"""The supervisor loop's calls made on the spot (`LedgerCalls(..., inline=...)`): on a connection
of the loop's own that gives up at once on a busy file, whenever that cannot keep the loop
waiting, and by the ledger thread otherwise (`supervisor.ledger_calls`, "Made on the spot").

A write lock is held by another process, as another writer or a foreign tool holds it."""

from __future__ import annotations

import os
import time

import pytest

from supervisor import Completed, LeaseLost, open_backend
from supervisor.ledger.errors import LedgerGone
from supervisor import ledger_calls
from supervisor.dispatcher import Supervisor, SupervisorConfig
from supervisor.ledger_calls import Acknowledge, Claim, LedgerCalls

from test_ledger_batch import LEASE_MS, replies_of
from test_sqlite_busy import WRITE_LOCK, Holder

pytestmark = pytest.mark.timeout(60)


class Counted:
    """Wraps a backend's `executions` methods to count the calls made on it."""

    def __init__(self, backend, *names):
        self.made = []
        for name in names:
            real = getattr(backend.executions, name)
            setattr(backend.executions, name, self._counting(name, real))

    def _counting(self, name, real):
        def counted(*args, **kwargs):
            self.made.append(name)
            return real(*args, **kwargs)
        return counted


METHODS = ("acknowledge", "claim_deliveries", "acknowledge_and_claim_deliveries", "release")


@pytest.fixture
def claimed(sqlite_path):
    """Four admitted executions, two of them claimed: (leases of the two)."""
    with open_backend(sqlite_path) as setup:
        for n in range(4):
            setup.executions.admit(f"e{n}", "w")
        return setup.executions.claim_due(limit=2, duration=LEASE_MS)


def calls_on_the_spot(db_path, **options) -> LedgerCalls:
    spot = open_backend(db_path)
    spot.connection.busy_timeout_s = 0
    made = LedgerCalls(open_backend(db_path), "test-spot", gathering=True, inline=spot, **options)
    made.on_thread = Counted(made.backend, *METHODS)
    made.on_spot = Counted(spot, *METHODS)
    return made


@pytest.fixture
def calls(sqlite_path):
    made = calls_on_the_spot(sqlite_path)
    yield made
    assert made.close()


def submit_endings_and_a_claim(calls: LedgerCalls, leases) -> None:
    for lease in leases:
        calls.submit(Acknowledge(lease, Completed("1")))
    calls.submit(Claim(2, LEASE_MS))


def statuses(db_path) -> list[str]:
    with open_backend(db_path) as check:
        return [check.executions.get(f"e{n}").status for n in range(4)]


def test_what_one_turn_gathers_is_made_on_the_spot_in_one_transaction_with_its_replies_ready_at_once(
        sqlite_path, claimed, calls):
    submit_endings_and_a_claim(calls, claimed)
    calls.flush()

    assert calls.has_replies()  # no wake-up to wait for
    replies = calls.replies()
    assert calls.on_spot.made == ["acknowledge_and_claim_deliveries"] and calls.on_thread.made == []
    assert [reply.value for reply in replies[:2]] == [Completed("1")] * 2
    assert [c.lease.execution_id for c in replies[2].value] == ["e2", "e3"]
    assert calls.pending == 0
    assert statuses(sqlite_path) == ["completed", "completed", "running", "running"]


def test_a_held_write_lock_sends_the_calls_to_the_thread_at_once_which_makes_them_once_it_is_free(
        sqlite_path, claimed, calls):
    holder = Holder(sqlite_path, WRITE_LOCK)
    try:
        submit_endings_and_a_claim(calls, claimed)
        began = time.monotonic()
        calls.flush()
        flushed_in = time.monotonic() - began
        assert not calls.has_replies()
        assert statuses(sqlite_path) == ["running", "running", "admitted", "admitted"]
    finally:
        holder.release()
    holder.released_at()
    replies = replies_of(calls, 3)

    # The loop did not wait for the lock (the ledger's busy timeout is 15 s); the thread did.
    assert flushed_in < 1.0
    assert calls.on_spot.made == ["acknowledge_and_claim_deliveries"]  # tried once, changed nothing
    assert calls.on_thread.made == ["acknowledge_and_claim_deliveries"]
    assert [reply.value for reply in replies[:2]] == [Completed("1")] * 2
    assert [c.lease.execution_id for c in replies[2].value] == ["e2", "e3"]
    assert statuses(sqlite_path) == ["completed", "completed", "running", "running"]


def test_calls_flushed_while_the_thread_has_calls_in_hand_go_to_the_thread_after_them(sqlite_path, claimed, calls):
    first, second = claimed
    holder = Holder(sqlite_path, WRITE_LOCK)
    try:
        calls.submit(Acknowledge(first, Completed("1")))
        calls.flush()  # busy: to the thread, which now waits for the lock
        calls.submit(Acknowledge(second, Completed("2")))
        calls.submit(Acknowledge(first, Completed("3")))
        calls.flush()  # the thread has a call in hand: these queue behind it, in order
    finally:
        holder.release()
    replies = replies_of(calls, 3)

    assert calls.on_spot.made == ["acknowledge"]  # only the first flush was tried on the spot
    assert [reply.value for reply in replies] == [Completed("1"), Completed("2"), LeaseLost()]
    with open_backend(sqlite_path) as check:
        assert check.executions.get("e0").result_json == "1"


def test_a_storage_error_on_the_spot_is_a_reply_as_on_the_thread(sqlite_path, claimed, calls):
    os.rename(sqlite_path, f"{sqlite_path}.moved")  # the ledger is gone: every write must be refused
    calls.submit(Acknowledge(claimed[0], Completed("1")))
    calls.flush()

    (reply,) = calls.replies()
    assert isinstance(reply.error, LedgerGone)
    assert calls.on_thread.made == []


def test_a_slow_flush_on_the_spot_sends_the_calls_of_the_next_while_to_the_thread(sqlite_path, claimed, caplog):
    calls = calls_on_the_spot(sqlite_path, inline_slow_s=0.0)  # every call is "slow"
    first, second = claimed
    try:
        calls.submit(Acknowledge(first, Completed("1")))
        calls.flush()
        assert [reply.value for reply in calls.replies()] == [Completed("1")]

        calls.submit(Acknowledge(second, Completed("2")))
        calls.flush()
        assert [reply.value for reply in replies_of(calls, 1)] == [Completed("2")]
    finally:
        assert calls.close()

    assert calls.on_spot.made == ["acknowledge"] and calls.on_thread.made == ["acknowledge"]
    assert calls.inline_paused_until - time.monotonic() > ledger_calls.INLINE_PAUSE_S - 5
    assert "the next ones go to the ledger thread" in caplog.text


@pytest.mark.parametrize("durability, on_the_spot", [("normal", True), ("full", False)])
def test_a_supervisor_on_sqlite_acknowledges_on_the_spot_unless_its_commits_sync(
        sqlite_path, monkeypatch, durability, on_the_spot):
    # A commit with durability "full" waits for the disk: the loop must not make it itself. One
    # worker, idle while its delivery is acknowledged: nothing else writes to take the lock.
    made = []
    real = LedgerCalls._make

    def counted(self, batch, backend=None):
        made.extend((call.name, backend is not None) for call in batch)
        return real(self, batch, backend)

    monkeypatch.setattr(LedgerCalls, "_make", counted)
    with open_backend(sqlite_path) as setup:
        for n in range(6):
            setup.executions.admit(f"e{n}", "noop3")
    supervisor = Supervisor(str(sqlite_path), "worker.apps.bench",
                            SupervisorConfig(concurrency=1, durability=durability))
    assert supervisor.run(until_idle=True) == 0

    assert supervisor.stats.completed == 6
    acknowledged = [spot for method, spot in made if method == "acknowledge"]
    assert len(acknowledged) == 6
    assert all(acknowledged) if on_the_spot else not any(acknowledged)


def test_a_backend_offers_a_twin_for_calls_on_the_spot_only_where_they_cannot_keep_the_loop_waiting(tmp_path, pg_uri):
    with open_backend(tmp_path / "ledger.db") as backend:
        twin = backend.spot_twin()
        try:
            assert twin is not None and twin.path == backend.path and twin.connection is not backend.connection
            assert twin.connection.busy_timeout_s == 0  # gives up at once on a busy file
            assert backend.connection.busy_timeout_s > 0
        finally:
            twin.close()
    with open_backend(tmp_path / "full.db", durability="full") as backend:
        assert backend.spot_twin() is None  # its commits sync the disk
    with open_backend(pg_uri) as backend:
        assert backend.spot_twin() is None  # every commit is a round trip
