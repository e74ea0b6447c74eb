"""The ledger on PostgreSQL, beyond the contract tests both backends run: fenced writes proven
against a claim that another connection holds open mid-transaction (READ COMMITTED with row
locks, SPEC section 7), the server's clock, and a supervisor with its children and the client
end to end on a real server."""

from __future__ import annotations

import select
import subprocess
import sys
import threading
import time

import psycopg
import pytest

from faults import APP, wait_until
from supervisor import Completed, ExecutionLease, Failed, LeaseLost, Renewed, Suspended, open_backend
from supervisor.ledger.errors import StorageBusy
from worker import Client

pytestmark = pytest.mark.timeout(60)


def wait_for_a_lock_wait(uri: str, timeout: float = 10.0) -> None:
    """Until some session of the database waits for a row lock."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(uri, autocommit=True) as watcher:
        while time.monotonic() < deadline:
            waiting = watcher.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                      " AND wait_event_type = 'Lock'").fetchone()[0]
            if waiting:
                return
            time.sleep(0.01)
    raise AssertionError("no session waited for the row lock")


def test_a_stale_write_racing_a_claim_open_in_another_transaction_waits_for_it_and_is_refused(pg_uri):
    with open_backend(pg_uri, clock=lambda: 1_000) as backend:
        backend.executions.admit("e1", "w")
        (stale,) = backend.executions.claim_due(limit=1, duration=100)
        # Another supervisor's claim of the expired lease, paused between its update and its commit.
        claimer = psycopg.connect(pg_uri)
        claimer.execute("SELECT token FROM executions WHERE execution_id = 'e1' FOR UPDATE")
        claimer.execute("UPDATE executions SET token = token + 1 WHERE execution_id = 'e1'")
        replies: list = []
        writer = threading.Thread(target=lambda: replies.append(backend.heap.write_step(
            stale, step_key="charge", step_attempt=1, done=True, step_response_json='"stale"')))
        writer.start()
        wait_for_a_lock_wait(pg_uri)  # the write's fence waits for the claim to decide
        claimer.commit()
        writer.join(10)
        claimer.close()
        assert replies == [LeaseLost()]
        assert backend.heap.steps("e1") == []


def test_a_waiter_registered_while_an_acknowledgement_waits_for_the_row_is_woken_by_it(pg_uri, clock):
    """`await_outcome` locks the execution's row and registers the waiter in one transaction; an
    acknowledgement of that execution waiting for the row meanwhile must, once it gets the row,
    see the new registration and wake the waiter (a statement that read the waiters before it
    waited would leave the waiter asleep for good)."""
    with open_backend(pg_uri, clock=clock) as backend:
        backend.executions.admit("child", "w")
        (lease,) = backend.executions.claim_due(limit=1, duration=60_000)
        backend.executions.admit("parent", "w")
        (parent,) = backend.executions.claim_due(limit=1, duration=60_000)
        assert backend.executions.acknowledge(parent, Suspended()) == Suspended()
        # `await_outcome("child", "parent")`, paused between its registration and its commit.
        registrar = psycopg.connect(pg_uri)
        registrar.execute("SELECT 1 FROM executions WHERE execution_id = 'child' FOR UPDATE")
        registrar.execute("INSERT INTO waiters (kind, target, waiter, registered_at) VALUES"
                          " ('execution', 'child', 'parent', %s)", (clock.now,))
        replies: list = []
        acknowledging = threading.Thread(target=lambda: replies.append(
            backend.executions.acknowledge(lease, Completed("1"))))
        acknowledging.start()
        wait_for_a_lock_wait(pg_uri)  # the acknowledgement's fenced update waits for the row
        registrar.commit()
        acknowledging.join(10)
        registrar.close()
        assert replies == [Completed("1")]
        assert query_waiters(pg_uri) == []
        woken = backend.executions.get("parent")
        assert (woken.status, woken.due_at) == ("suspended", clock.now)
        assert [c.lease.execution_id for c in backend.executions.claim_deliveries(limit=5, duration=60_000)] == [
            "parent"]


def query_waiters(uri: str) -> list:
    with psycopg.connect(uri) as conn:
        return conn.execute("SELECT kind, target, waiter FROM waiters").fetchall()


def test_a_renewal_does_not_wait_long_behind_a_row_a_stuck_transaction_holds_and_the_other_leases_are_renewed(
        pg_uri):
    # A transaction that holds an execution's row and goes no further: a host cut off in the
    # middle of it (a store change that wakes the execution, a step write) keeps its locks until
    # the link heals. A supervisor renews its leases one after another: one stuck row must not
    # hold up the others for longer than a fraction of a lease.
    with open_backend(pg_uri) as backend:
        for eid in ("stuck", "free"):
            backend.executions.admit(eid, "w")
        leases = {lease.execution_id: lease for lease in backend.executions.claim_due(limit=2, duration=3_000)}
        with psycopg.connect(pg_uri) as stuck:
            stuck.execute("SELECT 1 FROM executions WHERE execution_id = 'stuck' FOR SHARE")
            started = time.monotonic()
            with pytest.raises(StorageBusy):
                backend.executions.renew(leases["stuck"], duration=3_000)
            waited = time.monotonic() - started
            assert waited < 2.0, f"the renewal waited {waited:.1f} s for the stuck row"
            assert isinstance(backend.executions.renew(leases["free"], duration=3_000), Renewed)
            stuck.rollback()
        # The row free again, the lease is renewed at the next round.
        assert isinstance(backend.executions.renew(leases["stuck"], duration=3_000), Renewed)


def test_a_batch_of_renewals_skips_a_row_a_stuck_transaction_holds_renews_the_others_and_says_busy_for_it(pg_uri):
    # The batch must not stall behind the stuck row: it renews the free rows at once (SKIP
    # LOCKED), then tries the stuck one alone with the bounded wait, and says busy for it alone.
    with open_backend(pg_uri) as backend:
        for eid in ("free-1", "stuck", "free-2", "gone"):
            backend.executions.admit(eid, "w")
        leases = {lease.execution_id: lease for lease in backend.executions.claim_due(limit=4, duration=3_000)}
        assert backend.executions.acknowledge(leases["gone"], Suspended()) == Suspended()
        order = [leases[eid] for eid in ("free-1", "stuck", "gone", "free-2")]
        with psycopg.connect(pg_uri) as stuck:
            stuck.execute("SELECT 1 FROM executions WHERE execution_id = 'stuck' FOR UPDATE")
            started = time.monotonic()
            replies = backend.executions.renew_many(order, duration=3_000)
            waited = time.monotonic() - started
            assert waited < 2.0, f"the batch waited {waited:.1f} s for the stuck row"
            assert [type(reply) for reply in replies] == [Renewed, StorageBusy, LeaseLost, Renewed]
            stuck.rollback()
        again = backend.executions.renew_many(order, duration=3_000)
        assert [type(reply) for reply in again] == [Renewed, Renewed, LeaseLost, Renewed]
        assert [h.renewals for h in backend.executions.history("stuck")] == [1]


def test_rows_one_stuck_transaction_holds_cost_a_batch_of_renewals_one_lock_wait_not_one_each(pg_uri):
    # A cut-off host's batch of step writes share-locks the rows of many deliveries at once: the
    # renewal round must give up on all of them within one bounded wait (a second, for a lease of
    # 10 s), not one wait per row, or the round's next renewals come too late for the others.
    stuck_ids = [f"stuck-{i}" for i in range(4)]
    with open_backend(pg_uri) as backend:
        for eid in ("free", *stuck_ids):
            backend.executions.admit(eid, "w")
        leases = {lease.execution_id: lease for lease in backend.executions.claim_due(limit=5, duration=10_000)}
        order = [leases[eid] for eid in ("free", *stuck_ids)]
        with psycopg.connect(pg_uri) as stuck:
            stuck.execute("SELECT 1 FROM executions WHERE execution_id LIKE 'stuck-%' FOR SHARE")
            started = time.monotonic()
            replies = backend.executions.renew_many(order, duration=10_000)
            waited = time.monotonic() - started
            assert [type(reply) for reply in replies] == [Renewed] + [StorageBusy] * len(stuck_ids)
            assert waited < 2.5, f"the batch waited {waited:.1f} s for {len(stuck_ids)} rows of one stuck transaction"
            stuck.rollback()
        again = backend.executions.renew_many(order, duration=10_000)
        assert [type(reply) for reply in again] == [Renewed] * len(order)


@pytest.mark.parametrize("call", [
    # A renewal waits for a row lock at most a tenth of its lease: long enough here.
    lambda b, lease: b.executions.renew(lease, duration=30_000),
    lambda b, lease: b.executions.release(lease),
    lambda b, lease: b.executions.acknowledge(lease, Completed('"stale"')),
    lambda b, lease: b.executions.acknowledge_and_claim([(lease, Completed('"stale"'))], limit=0, duration=100)[0][0],
], ids=["renew", "release", "acknowledge", "acknowledge in a batch"])
def test_every_fenced_write_racing_a_claim_open_in_another_transaction_waits_for_it_and_is_refused(pg_uri, call):
    with open_backend(pg_uri, clock=lambda: 1_000) as backend:
        backend.executions.admit("e1", "w")
        (stale,) = backend.executions.claim_due(limit=1, duration=100)
        claimer = psycopg.connect(pg_uri)  # another supervisor's claim, paused before its commit
        claimer.execute("SELECT token FROM executions WHERE execution_id = 'e1' FOR UPDATE")
        claimer.execute("UPDATE executions SET token = token + 1 WHERE execution_id = 'e1'")
        replies: list = []
        writer = threading.Thread(target=lambda: replies.append(call(backend, stale)))
        writer.start()
        wait_for_a_lock_wait(pg_uri)
        claimer.commit()
        writer.join(10)
        claimer.close()
        assert replies == [LeaseLost()]
        record = backend.executions.get("e1")
        assert (record.status, record.token, record.result_json) == ("running", 2, None)
        assert record.lease_expires_at == 1_100  # the stale holder's renewal did not move it
        (history,) = backend.executions.history("e1")
        assert (history.token, history.ended_by) == (1, None)


def test_without_a_clock_the_ledger_keeps_the_servers_time(pg_uri):
    with open_backend(pg_uri) as backend, psycopg.connect(pg_uri) as conn:
        before = conn.execute("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint").fetchone()[0]
        record = backend.executions.admit("e1", "w")
        after = conn.execute("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint").fetchone()[0]
        assert before <= record.created_at <= after


def test_a_supervisor_and_the_client_run_workflows_on_postgresql(pg_uri, tmp_path):
    with Client(pg_uri, poll_s=0.1) as client:
        handles = [client.start("sv.noop3", None, id=f"pg-{n}") for n in range(20)]
        done = subprocess.run([sys.executable, "-m", "supervisor.cli", "--db", pg_uri, "supervise", APP, "--until-idle",
                               "--poll-ms", "100", "--concurrency", "3"], capture_output=True, text=True, timeout=50,
                              cwd=tmp_path, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, done.stderr
        assert [h.result(timeout=10) for h in handles] == ["ok"] * 20
    with open_backend(pg_uri) as backend:
        history = [backend.executions.history(f"pg-{n}") for n in range(20)]
        assert all([(h.token, h.ended_by) for h in rows] == [(1, "acknowledged")] for rows in history)
        assert [s.step_key for s in backend.heap.steps("pg-0")] == ["one", "two", "three"]


def test_an_idle_supervisor_is_woken_by_a_notification_and_a_waiting_client_by_another(pg_uri, tmp_path):
    # A poll of a minute: only LISTEN/NOTIFY can make the supervisor claim, and the client see
    # the outcome, within the test's deadlines.
    log = open(tmp_path / "supervisor.log", "wb")
    supervisor = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "--db", pg_uri, "supervise", APP,
                                   "--poll-ms", "60000", "--concurrency", "1"], stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, cwd=tmp_path, start_new_session=True)
    try:
        with Client(pg_uri, poll_s=600) as client:
            wait_until(lambda: b"is ready" in (tmp_path / "supervisor.log").read_bytes(), timeout=30)
            time.sleep(0.5)  # past the supervisor's first poll, so that only a nudge can wake it
            started = time.monotonic()
            assert client.start("sv.noop3", None).result(timeout=20) == "ok"
            assert time.monotonic() - started < 10
    finally:
        supervisor.terminate()
        supervisor.wait(30)
        log.close()


def listening_sessions(uri: str) -> int:
    with psycopg.connect(uri, autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                            " AND application_name = 'yieldstar-listen'").fetchone()[0]


def test_poll_only_supervisors_and_clients_never_listen_and_still_finish_the_work(pg_uri, tmp_path):
    # What a connection pooler in transaction mode needs: no LISTEN session at all.
    log = open(tmp_path / "supervisor.log", "wb")
    supervisor = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "--db", pg_uri, "supervise", APP,
                                   "--poll-only", "--poll-ms", "100", "--concurrency", "1"], stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp_path,
                                  start_new_session=True)
    try:
        with Client(pg_uri, poll_s=0.1, listen=False) as client:
            wait_until(lambda: b"is ready" in (tmp_path / "supervisor.log").read_bytes(), timeout=30)
            handles = [client.start("sv.noop3", None, id=f"polled-{n}") for n in range(3)]
            assert [h.result(timeout=20) for h in handles] == ["ok"] * 3
            assert listening_sessions(pg_uri) == 0
        assert b"not listening for nudges" in (tmp_path / "supervisor.log").read_bytes()
        with Client(pg_uri, poll_s=0.1) as client:  # the default listens, which the count above would see
            assert client.start("sv.noop3", None).result(timeout=20) == "ok"
            assert listening_sessions(pg_uri) == 1
    finally:
        supervisor.terminate()
        supervisor.wait(30)
        log.close()


def test_a_listener_whose_session_was_killed_connects_again(pg_cluster, pg_uri):
    with open_backend(pg_uri) as backend:
        listener = backend.listen_for_outcomes()
        try:
            pid = listener._conn.info.backend_pid
            with psycopg.connect(pg_cluster.uri(), autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            wait_until(lambda: select.select([listener], [], [], 0.1)[0] and listener.read() is None, timeout=10)
            deadline = time.monotonic() + 20
            heard, n = None, 0
            while not heard and time.monotonic() < deadline:  # it reconnects within RECONNECT_S
                n += 1
                backend.executions.admit(f"e{n}", "w")
                backend.executions.cancel(f"e{n}")
                if select.select([listener], [], [], 0.5)[0]:
                    heard = listener.read()
            assert heard == {f"e{n}"}
        finally:
            listener.close()


def heard(listener, timeout: float = 10.0):
    """What the listener reads once it has heard something."""
    assert select.select([listener], [], [], timeout)[0], "nothing was announced"
    return listener.read()


def test_a_batch_announces_the_executions_it_ended_but_not_those_it_suspended_or_whose_lease_was_lost(pg_uri):
    """On PostgreSQL a batch that does not claim sends the announcement in its own statement
    (delivered at the commit), one that claims sends it after: the executions it made terminal;
    past the payload's limit, "look at everything". That a batch rolled back announces nothing is
    in test_postgres_faults.py."""
    with open_backend(pg_uri) as backend:
        listener = backend.listen_for_outcomes()
        try:
            for execution_id in ("done", "paused", "taken"):
                backend.executions.admit(execution_id, "w")
            leases = {lease.execution_id: lease for lease in backend.executions.claim_due(limit=3, duration=60_000)}
            stale = ExecutionLease("taken", leases["taken"].token - 1, leases["taken"].expires_at)

            replies, _ = backend.executions.acknowledge_and_claim(
                [(leases["done"], Completed("1")), (leases["paused"], Suspended()), (stale, Completed("2"))],
                limit=0, duration=60_000)
            assert replies == [Completed("1"), Suspended(), LeaseLost()]
            assert heard(listener) == {"done"}
            # A batch that claims announces after its commit, in a statement of its own.
            backend.executions.admit("next", "w")
            replies, claimed = backend.executions.acknowledge_and_claim(
                [(leases["taken"], Failed('"no"'))], limit=1, duration=60_000)
            assert (replies, [lease.execution_id for lease in claimed]) == ([Failed('"no"')], ["next"])
            assert heard(listener) == {"taken"}

            many = [f"{n:03}-" + "x" * 150 for n in range(60)]  # 9 kB of ids
            for execution_id in many:
                backend.executions.admit(execution_id, "w")
            claimed = backend.executions.claim_due(limit=60, duration=60_000)
            backend.executions.acknowledge_and_claim([(lease, Completed("3")) for lease in claimed], limit=0,
                                                     duration=60_000)
            assert heard(listener) is None  # too many ids to name: look at everything
            assert {backend.executions.get(execution_id).status for execution_id in many} == {"completed"}
        finally:
            listener.close()


def test_a_batch_that_claims_returns_only_once_its_commit_is_flushed(pg_uri):
    """One round trip, one transaction of its own: a claim is durable before its lease is handed
    out (SPEC section 7) though the session commits without waiting for the flush
    (durability "normal"). Nothing else of the test writes to this server meanwhile, so the
    claim's commit record is the last in the WAL, unless the server's own background work wrote a
    record in the moment between (on a busy machine, two claims of five have shown it). Without
    the flush, the WAL writer flushes an asynchronous commit only every 200 ms, and none of the
    claims is flushed: most of ten is far from that."""
    with open_backend(pg_uri) as backend, psycopg.connect(pg_uri, autocommit=True) as watcher:
        assert backend.connection.execute("SHOW synchronous_commit").fetchone() == ("off",)
        flushed_at_return = 0
        for n in range(10):
            backend.executions.admit(f"e{n}", "w")
            backend.executions.acknowledge_and_claim([], limit=1, duration=60_000)
            flushed, inserted = watcher.execute(
                "SELECT pg_current_wal_flush_lsn() - '0/0', pg_current_wal_insert_lsn() - '0/0'").fetchone()
            flushed_at_return += flushed >= inserted
        assert flushed_at_return >= 6
