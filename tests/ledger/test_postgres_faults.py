"""PostgreSQL's infrastructure faults cost time, never correctness (SPEC section 7,
docs/postgres.md): a server restarted under a running supervisor loses no execution and
duplicates no step; a session killed while a ledger call waits inside its transaction leaves
none of that call's writes, and the next call on the same backend connects again and makes
them; a statement held on a row lock past the server's timeout is `StorageBusy` and changes
nothing.

Real servers only: the restart test runs a cluster of its own (the session's cluster is shared
by every other test), the others a fresh database of the session's cluster. A call is paused
mid-transaction by a row lock that another connection holds, found waiting in
`pg_stat_activity` (application_name 'yieldstar'), and ended with `pg_terminate_backend`.
"""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
import urllib.parse

import psycopg
import pytest

from faults import no_two_live_leases, query, step_tokens, wait_until
from supervisor import Completed, LeaseLost, open_backend
from supervisor.ledger.errors import StorageBusy, StorageError, StorageUnavailable
from supervisor.ledger.postgres import notify

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("dump_on_hang")]

RESPONSE = '{"value": "charged"}'
OUTAGE_S = 8.0  # longer than a worker's start timeout


def ledger_session_waiting_for_a_lock(uri: str, timeout: float = 10.0) -> tuple[int, str]:
    """The pid and statement of the ledger's session that waits for a row lock, once it does."""
    def waiting():
        with psycopg.connect(uri, autocommit=True) as watcher:
            return watcher.execute(
                "SELECT pid, query FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = 'yieldstar' AND wait_event_type = 'Lock'").fetchone()
    return wait_until(waiting, timeout, message="the ledger's session to wait for the row lock")


def killed_while_waiting(admin_uri: str, uri: str, call) -> tuple[BaseException, str]:
    """Run `call` in a thread until its session waits for a row lock, terminate that session,
    and return what the call raised and the statement it was waiting in."""
    outcome: dict = {}

    def run():
        try:
            outcome["reply"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome["raised"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    pid, statement = ledger_session_waiting_for_a_lock(uri)
    with psycopg.connect(admin_uri, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
    thread.join(15)
    assert not thread.is_alive(), "the call did not return after its session was killed"
    assert "raised" in outcome, f"the call survived its killed session: {outcome}"
    return outcome["raised"], statement


def killed_holding(admin_uri: str, uri: str, lock: str, call, snapshot) -> str:
    """With a row locked by `lock` in another transaction, kill `call`'s session while it waits
    for that row; check that the call raised `StorageUnavailable` and that the database is as it
    was before the call. Returns the statement the call was waiting in."""
    with psycopg.connect(uri) as holder:
        holder.execute(lock)
        before = snapshot(uri)
        raised, statement = killed_while_waiting(admin_uri, uri, call)
        holder.rollback()
    assert isinstance(raised, StorageUnavailable), repr(raised)
    assert isinstance(raised, StorageError) and raised.transient
    assert snapshot(uri) == before
    return statement


def child_awaited_by_parent(backend):
    """'child' claimed, and 'parent' registered to be woken when it ends; the child's lease."""
    backend.executions.admit("child", "charge")
    (lease,) = backend.executions.claim_due(limit=1, duration=60_000)
    backend.executions.admit("parent", "order")
    assert backend.executions.await_outcome("child", "parent").status == "running"
    return lease


# -- a session killed mid-transaction ---------------------------------------------------------------

def test_a_fenced_step_write_whose_session_is_killed_writes_nothing_and_the_next_call_connects_again(
        pg_cluster, pg_uri, clock, db_snapshot):
    with open_backend(pg_uri, clock=clock) as backend:
        backend.executions.admit("e1", "charge")
        (lease,) = backend.executions.claim_due(limit=1, duration=60_000)
        write = lambda: backend.heap.write_step(lease, step_key="charge", step_attempt=1, done=True,  # noqa: E731
                                                step_response_json=RESPONSE)
        # Another transaction holds the execution's row: the write's fence (FOR SHARE) waits.
        statement = killed_holding(pg_cluster.uri(), pg_uri, "SELECT 1 FROM executions WHERE execution_id = 'e1'"
                                   " FOR UPDATE", write, db_snapshot)
        assert statement.lstrip().startswith("INSERT INTO steps"), statement
        assert query(pg_uri, "SELECT count(*) FROM steps") == [(0,)]
        assert query(pg_uri, "SELECT token, status FROM executions") == [(lease.token, "running")]

        # The same backend: the next call opens a new session, and the write is made once.
        assert write().attempt == 1
        assert write().step_response_json == RESPONSE  # a repeat finds it recorded
        assert step_tokens(pg_uri, "e1") == [("charge", 1, lease.token)]
        assert backend.executions.acknowledge(lease, Completed('"ok"')) == Completed('"ok"')


def test_an_acknowledgement_killed_after_its_first_writes_leaves_none_of_them_and_announces_nothing(
        pg_cluster, pg_uri, clock, db_snapshot):
    with open_backend(pg_uri, clock=clock) as backend:
        lease = child_awaited_by_parent(backend)
        backend.executions.admit("bystander", "charge")
        listener = backend.listen_for_outcomes()
        acknowledge = lambda: backend.executions.acknowledge(lease, Completed('"ok"'))  # noqa: E731
        # The acknowledgement ends the child's lease and announces it, then wakes its waiter: the
        # parent's row, which another transaction holds, so it waits there with its own writes made.
        statement = killed_holding(pg_cluster.uri(), pg_uri, "SELECT 1 FROM executions WHERE execution_id = 'parent'"
                                   " FOR UPDATE", acknowledge, db_snapshot)
        assert "yieldstar_batch" in statement, statement  # the acknowledgement: one statement on PostgreSQL
        child = backend.executions.get("child")  # the next call connects again
        assert (child.status, child.token) == ("running", lease.token)
        assert backend.executions.history("child")[-1].ended_by is None
        assert query(pg_uri, "SELECT waiter FROM waiters WHERE target = 'child'") == [("parent",)]
        # Announcements arrive in commit order: the killed one, had it been sent, would come first.
        backend.executions.cancel("bystander")
        try:
            assert select.select([listener], [], [], 10)[0]
            assert listener.read() == {"bystander"}
        finally:
            listener.close()

        assert acknowledge() == Completed('"ok"')
        assert backend.executions.get("child").status == "completed"
        assert [(h.token, h.ended_by) for h in backend.executions.history("child")] == [(lease.token, "acknowledged")]
        assert query(pg_uri, "SELECT count(*) FROM waiters") == [(0,)]  # the parent was woken
        assert backend.executions.acknowledge(lease, Completed('"ok"')) == LeaseLost()


def test_a_claim_killed_after_taking_one_execution_moves_no_token_and_opens_no_lease(pg_cluster, pg_uri, clock,
                                                                                   db_snapshot):
    with open_backend(pg_uri, clock=clock) as backend:
        backend.executions.admit("expired", "charge")
        (stale,) = backend.executions.claim_due(limit=1, duration=100)
        # Admitted earlier than the other was, so the claim takes it first (earliest due first).
        backend.executions.admit("fresh", "charge", now=clock.now - 1)
        clock.advance(60_000)  # the first lease expired long ago, and its redelivery delay passed
        claim = lambda: backend.executions.claim_due(limit=2, duration=60_000)  # noqa: E731
        # The claim takes 'fresh' and 'expired', and closes the expired lease's history row, held here.
        statement = killed_holding(pg_cluster.uri(), pg_uri, "SELECT 1 FROM lease_history WHERE execution_id ="
                                   " 'expired' FOR UPDATE", claim, db_snapshot)
        assert "yieldstar_batch" in statement, statement  # the claim: one statement on PostgreSQL
        assert sorted(query(pg_uri, "SELECT execution_id, token FROM executions")) == [("expired", 1), ("fresh", 0)]
        assert query(pg_uri, "SELECT execution_id, token, ended_by FROM lease_history") == [("expired", 1, None)]

        leases = claim()  # the same backend, connected again
        assert sorted((lease.execution_id, lease.token) for lease in leases) == [("expired", 2), ("fresh", 1)]
        assert [(h.token, h.ended_by) for h in backend.executions.history("expired")] == [(1, "superseded"),
                                                                                          (2, None)]
        assert backend.heap.write_step(stale, step_key="late", step_attempt=1, done=True,
                                       step_response_json=RESPONSE) == LeaseLost()


# -- a row lock held past the server's timeout --------------------------------------------------------

def test_an_acknowledgement_held_on_a_row_lock_past_the_servers_timeout_is_busy_and_changes_nothing(
        pg_cluster, pg_uri, clock, db_snapshot):
    # The ledger's own lock timeout (15 s, 55P03) is tested on the connection in
    # test_postgres_connection.py; here an operator's statement_timeout (57014) ends the wait.
    database = urllib.parse.urlsplit(pg_uri).path[1:]
    with psycopg.connect(pg_cluster.uri(), autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{database}" SET statement_timeout = 300')
    with open_backend(pg_uri, clock=clock) as backend:
        lease = child_awaited_by_parent(backend)
        with psycopg.connect(pg_uri) as holder:
            holder.execute("SELECT 1 FROM executions WHERE execution_id = 'parent' FOR UPDATE")
            before = db_snapshot(pg_uri)
            started = time.monotonic()
            with pytest.raises(StorageBusy, match="busy") as raised:
                backend.executions.acknowledge(lease, Completed('"ok"'))
            assert time.monotonic() - started >= 0.3  # it waited for the lock, then gave up
            assert raised.value.transient
            assert db_snapshot(pg_uri) == before
            holder.rollback()
        # No transaction was left open (an aborted one would refuse every statement): it can be made again.
        assert backend.executions.acknowledge(lease, Completed('"ok"')) == Completed('"ok"')
        assert backend.executions.get("child").status == "completed"


# -- a server restarted under a running supervisor ------------------------------------------------------

@pytest.fixture
def own_cluster():
    """A cluster of this test's own, to restart without disturbing the other tests' server."""
    from pgcluster import cluster_fixture

    yield from cluster_fixture()


def restart(cluster) -> None:
    """`pg_ctl restart -m fast`: every session is ended, the server is down for a moment."""
    cluster._run("pg_ctl", "-D", cluster.data, "-m", "fast", "-l", f"{cluster.folder}/server.log", "-w",
                 "restart")


def started_at(uri: str):
    return query(uri, "SELECT pg_postmaster_start_time()")[0][0]


def counts(uri: str) -> dict[str, int]:
    """How many executions have each status; empty while the server cannot be reached."""
    try:
        return dict(query(uri, "SELECT status, count(*) FROM executions GROUP BY status"))
    except psycopg.OperationalError:
        return {}


def completed_count(uri: str, supervisor) -> int:
    """How many executions completed, failing at once if the supervisor died or one failed."""
    found = counts(uri)
    assert supervisor.popen.poll() is None, f"the supervisor died:\n{supervisor.log()}"
    assert not found.get("failed"), f"executions failed: {found}"
    return found.get("completed", 0)


@pytest.mark.timeout(240)
def test_a_server_restarted_twice_under_a_running_supervisor_loses_nothing_and_duplicates_nothing(
        own_cluster, tmp_path, supervisors):
    uri = own_cluster.new_database()
    n, steps = 200, 3
    ids = [f"run-{i}" for i in range(n)]
    with open_backend(uri) as backend:
        for execution_id in ids:
            backend.executions.admit(execution_id, "sv.steps", json.dumps(
                {"log": str(tmp_path / "effects.log"), "steps": steps, "sleep": 0.02}))
    supervisor = supervisors.start(uri, concurrency=2)
    for threshold in (20, 100):
        wait_until(lambda: completed_count(uri, supervisor) >= threshold, timeout=60, interval=0.05,
                   message=f"{threshold} executions to complete")
        server_began = started_at(uri)
        restart(own_cluster)
        assert started_at(uri) > server_began
        assert completed_count(uri, supervisor) < n, "the run ended before the restart: nothing was tested"
    wait_until(lambda: completed_count(uri, supervisor) == n, timeout=150, interval=0.2,
               message="every execution to complete")
    assert supervisor.popen.poll() is None, f"the supervisor died:\n{supervisor.log()}"

    redelivered = 0
    with open_backend(uri) as backend:
        for execution_id in ids:
            record = backend.executions.get(execution_id)
            assert record.status == "completed", record
            history = backend.executions.history(execution_id)
            no_two_live_leases(history)
            assert (history[-1].ended_by, history[-1].outcome) == ("acknowledged", "completed"), history
            written = step_tokens(uri, execution_id)
            # Each step recorded once, at its first attempt (a storage error is no failed
            # attempt), in order, each under a token of the execution's own leases.
            assert [(key, attempt) for key, attempt, _ in written] == [(f"s{i}", 1) for i in range(steps)], written
            tokens = [token for _, _, token in written]
            assert tokens == sorted(tokens) and set(tokens) <= {h.token for h in history}, (written, history)
            assert json.loads(record.result_json)["token"] == history[-1].token
            redelivered += len(history) > 1
    # Each worker's session was among those the restarts ended, so its next delivery met the
    # fault and was released, to be delivered again: the restarts cost deliveries, nothing more.
    assert redelivered >= 2, f"only {redelivered} executions were delivered more than once"
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(30) == 0, supervisor.log()


@pytest.mark.timeout(120)
def test_a_supervisor_started_while_the_server_is_down_waits_for_it_and_then_works(own_cluster, tmp_path,
                                                                                   supervisors):
    uri = own_cluster.new_database()
    with open_backend(uri) as backend:
        backend.executions.admit("early", "sv.noop3")
    own_cluster.stop_server()
    supervisor = supervisors.start(uri, concurrency=1, ready=False)
    time.sleep(OUTAGE_S)  # how long the server stays down
    assert supervisor.popen.poll() is None, f"the supervisor gave up:\n{supervisor.log()}"
    own_cluster.start_server()
    wait_until(lambda: counts(uri).get("completed") == 1, timeout=60, interval=0.1,
               message="the execution admitted before the outage to complete")
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(30) == 0, supervisor.log()


@pytest.mark.timeout(120)
def test_a_supervisor_whose_own_connection_is_refused_at_start_waits_and_then_works(pg_cluster, supervisors):
    # A role that may hold one session: the worker's. The supervisor's own connections are
    # refused ("too many connections", a transient fault) until the limit is raised.
    name = f"limited_{time.monotonic_ns()}"
    with psycopg.connect(pg_cluster.uri(), autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{name}" LOGIN CONNECTION LIMIT 1')
        admin.execute(f'CREATE DATABASE "{name}" OWNER "{name}"')
    uri = f"postgresql://{name}@/{name}?host={pg_cluster.folder}"
    with open_backend(uri) as backend:
        backend.executions.admit("waiting", "sv.noop3")
    supervisor = supervisors.start(uri, concurrency=1, ready=False)
    wait_until(lambda: "cannot open the ledger yet" in supervisor.log(), timeout=30,
               message="the supervisor to be refused a connection")
    assert "too many connections" in supervisor.log()
    assert supervisor.popen.poll() is None, f"the supervisor gave up:\n{supervisor.log()}"
    with psycopg.connect(pg_cluster.uri(), autocommit=True) as admin:
        admin.execute(f'ALTER ROLE "{name}" CONNECTION LIMIT 10')
    wait_until(lambda: counts(uri).get("completed") == 1, timeout=60, interval=0.1,
               message="the execution to complete once connections are allowed")
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(30) == 0, supervisor.log()


@pytest.mark.timeout(120)
def test_a_listener_never_waits_for_a_server_that_does_not_answer_and_hears_again_once_it_is_back(own_cluster):
    """A supervisor's loop holds its listener beside its children's pipes: reconnecting must
    never block it, even when a connection attempt would hang (a host cut off from the server)."""
    import socket

    uri = own_cluster.new_database()
    with open_backend(uri) as backend:
        listener = backend.listen_for_outcomes()
        try:
            own_cluster.stop_server()
            # A socket that takes connections and never answers: each attempt waits its whole timeout.
            silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            silent.bind(f"{own_cluster.folder}/.s.PGSQL.5432")
            silent.listen(64)
            try:
                wait_until(lambda: select.select([listener], [], [], 0.1)[0] and listener.read() is None, timeout=10,
                           message="the listener to find its connection broken")
                deadline = time.monotonic() + notify.RECONNECT_S + 3  # past the first reconnection attempt
                while time.monotonic() < deadline:
                    began = time.monotonic()
                    ready = select.select([listener], [], [], 0.2)[0]
                    assert time.monotonic() - began < 1.0, "the listener waited for the server"
                    assert not ready
            finally:
                silent.close()
                os.unlink(f"{own_cluster.folder}/.s.PGSQL.5432")
            own_cluster.start_server()
            wait_until(lambda: select.select([listener], [], [], 0.2)[0], timeout=30,
                       message="the listener to be back")
            assert listener.read() is None  # what was sent meanwhile is lost: look at everything
            with open_backend(uri) as writer:  # the first backend's session ended with the server
                writer.executions.admit("e1", "w")
                writer.executions.cancel("e1")
            assert select.select([listener], [], [], 10)[0] and listener.read() == {"e1"}
        finally:
            listener.close()
