"""A failover to a lagging asynchronous replica never issues a fencing token twice.

Two real servers on this machine: a primary and a streaming replica made by `pg_basebackup`,
behind one multi-host URI with `target_session_attrs=read-write`, as a high-availability setup
gives them to clients. The replica is made to lag for certain by stopping it before the claim,
so that it never receives the claim; the primary is then killed and the replica promoted (a real
`pg_ctl promote`, a new timeline). The holder from before reconnects to the promoted server and
finds every fenced call refused, while the claim made there stays whole (see
`supervisor.ledger.tables.epochs` and `supervisor.ledger.postgres.incarnation`).
"""

from __future__ import annotations

import psycopg
import pytest

from faults import APP, cli, needs, wait_until
from supervisor import Completed, LeaseLost, Released, Renewed, open_backend
from supervisor.ledger.errors import LedgerGone
from supervisor.chaos.cluster import Cluster, available
from supervisor.ledger.tables.epochs import EPOCH_SPAN, token_epoch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

DATABASE = "ledger"


@pytest.fixture
def primary_and_replica():
    """A primary with a database `ledger`, and its streaming replica, both running."""
    needs(available(), "PostgreSQL failover tests")
    primary = Cluster().start()
    replica = None
    try:
        with psycopg.connect(primary.uri(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")
        replica = primary.replica()
        replica.start_server()
        yield primary, replica
    finally:
        for cluster in (replica, primary):
            if cluster is not None:
                cluster.stop()


def both(primary: Cluster, replica: Cluster) -> str:
    """One URI naming both servers; libpq connects to whichever of them accepts writes."""
    return (f"postgresql://postgres@/{DATABASE}?host={primary.folder},{replica.folder}"
            f"&target_session_attrs=read-write")


def caught_up(primary: Cluster, replica: Cluster) -> None:
    """Wait until the replica has replayed everything the primary has written so far."""
    with psycopg.connect(primary.uri(), autocommit=True) as conn:
        target = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]

    def replayed() -> bool:
        with psycopg.connect(replica.uri(), autocommit=True) as conn:
            return conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)).fetchone()[0]

    wait_until(replayed, 30, 0.05, "the replica to replay the primary's WAL")


def fail_over(primary: Cluster, replica: Cluster) -> None:
    """The primary dies; the replica, which stopped before the last commits, is promoted."""
    primary.stop_server("immediate")
    replica.start_server()
    replica.promote()


def test_a_holder_from_before_a_failover_to_a_lagging_replica_has_every_fenced_call_refused(primary_and_replica):
    primary, replica = primary_and_replica
    uri = both(primary, replica)
    with open_backend(uri) as first:
        first.executions.admit("x", "charge")
        first.executions.admit("y", "charge")
        caught_up(primary, replica)
        replica.stop_server("fast")  # it lags from here on: it will never see what follows
        leases = {lease.execution_id: lease for lease in first.executions.claim_due(limit=2, duration=60_000)}
        assert {lease.token for lease in leases.values()} == {1}
        assert first.heap.write_step(leases["x"], step_key="k1", step_attempt=1, done=True,
                                     step_response_json='"charged"').attempt == 1

        fail_over(primary, replica)

        with open_backend(uri) as second:
            # The promoted server never saw the claims: both executions are claimable again, and
            # the tokens they get now were never issued before, whatever the server forgot.
            again = {lease.execution_id: lease for lease in second.executions.claim_due(limit=2, duration=60_000)}
            assert set(again) == {"x", "y"}
            for lease in again.values():
                assert lease.token == EPOCH_SPAN + 1 and token_epoch(lease.token) == 1
            assert second.heap.read_step("x", "k1") is None  # lost with the primary

            # The holder from before reconnects (to the promoted server, the only one that takes
            # writes now) and is refused everything, like any stale holder.
            x, y = leases["x"], leases["y"]
            assert first.executions.renew(x, duration=60_000) == LeaseLost()
            assert first.heap.write_step(x, step_key="k2", step_attempt=1, done=True,
                                         step_response_json='"stale"') == LeaseLost()
            assert first.executions.release(x) == LeaseLost()
            assert first.executions.acknowledge(y, Completed('"stale"')) == LeaseLost()

            # The stale release and acknowledgement ended nothing: the new deliveries are whole.
            for lease in again.values():
                assert isinstance(second.executions.renew(lease, duration=60_000), Renewed)
            assert second.heap.read_step("x", "k2") is None
            assert second.executions.get("y").status == "running"
            assert second.executions.release(again["x"]) == Released()
            assert second.executions.acknowledge(again["y"], Completed('"ok"')) == Completed('"ok"')
            epochs = second.connection.execute("SELECT epoch, reason FROM epochs ORDER BY epoch").fetchall()
            assert [tuple(row) for row in epochs] == [(0, "created"), (1, "failover")]


def test_an_execution_admitted_again_after_a_failover_that_lost_it_gets_a_token_never_issued(primary_and_replica):
    primary, replica = primary_and_replica
    uri = both(primary, replica)
    with open_backend(uri) as first:
        first.executions.get("nothing")  # the ledger exists on both servers
        caught_up(primary, replica)
        replica.stop_server("fast")
        first.executions.admit("z", "charge")  # on the primary only
        (lease,) = first.executions.claim_due(limit=1, duration=60_000)
        assert lease.token == 1
        fail_over(primary, replica)
        with open_backend(uri) as second:
            assert second.executions.get("z") is None
            assert second.executions.admit("z", "charge").token == EPOCH_SPAN
            (again,) = second.executions.claim_due(limit=1, duration=60_000)
            assert again.token == EPOCH_SPAN + 1
            assert first.executions.renew(lease, duration=60_000) == LeaseLost()
            assert isinstance(second.executions.renew(again, duration=60_000), Renewed)


def test_a_ledger_on_a_read_only_standby_is_refused_with_a_message_that_says_so(primary_and_replica, tmp_path):
    primary, replica = primary_and_replica
    with open_backend(both(primary, replica)):
        pass  # the ledger's schema, on the primary
    caught_up(primary, replica)
    standby = f"postgresql://postgres@/{DATABASE}?host={replica.folder}"
    with pytest.raises(LedgerGone, match="read-only standby"):
        open_backend(standby)
    done = cli(standby, "supervise", APP, "--until-idle", timeout=60)
    assert done.returncode == 5, done.stderr
    assert "read-only standby" in done.stderr and "target_session_attrs=read-write" in done.stderr
    assert "Traceback" not in done.stderr
