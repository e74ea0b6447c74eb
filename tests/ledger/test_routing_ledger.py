"""Routing and live supervisors in the ledger (SPEC section 11), on each backend.

A claim given `workflows` takes only executions of those workflows, through every claim path
(`claim_due`, `claim_deliveries`, `acknowledge_and_claim(_deliveries)`, which PostgreSQL makes in
one call of its batch function); `next_ready_at` looks only at them. The live supervisors are
registered, seen, judged live by their own renewal interval on the fake clock, and removed.
"""

from __future__ import annotations

import pytest

from supervisor import Completed, ExecutionLease, open_backend
from supervisor.ledger.errors import InvalidArgument
from supervisor.ledger.tables.execution_rows import CLAIM_WORKFLOWS
from supervisor.ledger.values import LIVE_INTERVALS

LEASE_MS = 30_000

pytestmark = pytest.mark.timeout(60)


def admit_mix(backend, clock, per_workflow: int = 3, workflows=("order", "refund", "report")) -> None:
    """`per_workflow` executions of each workflow, admitted a millisecond apart, interleaved."""
    for i in range(per_workflow):
        for workflow in workflows:
            backend.executions.admit(f"{workflow}-{i}", workflow, now=clock.now)
            clock.advance(1)


def workflows_of(backend, leases) -> list[str]:
    return [backend.executions.get(lease.execution_id).workflow for lease in leases]


# -- claims ------------------------------------------------------------------------------------


def test_a_claim_with_workflows_takes_only_executions_of_those_workflows(backend, clock):
    admit_mix(backend, clock)

    leases = backend.executions.claim_due(limit=10, duration=LEASE_MS, workflows={"refund", "report"})

    assert sorted(workflows_of(backend, leases)) == ["refund"] * 3 + ["report"] * 3
    # Earliest due first across the workflows served, as an unrouted claim orders them.
    assert [lease.execution_id for lease in leases] == [f"{w}-{i}" for i in range(3) for w in ("refund", "report")]
    assert {r.status for r in backend.executions.list(workflow="order")} == {"admitted"}
    assert {r.token for r in backend.executions.list(workflow="order")} == {0}


def test_a_claim_with_workflows_none_claims_every_workflow(backend, clock):
    admit_mix(backend, clock)

    leases = backend.executions.claim_due(limit=20, duration=LEASE_MS, workflows=None)

    assert sorted(set(workflows_of(backend, leases))) == ["order", "refund", "report"] and len(leases) == 9


def test_a_claim_with_workflows_respects_limit_and_due_time(backend, clock):
    admit_mix(backend, clock)
    backend.executions.admit("order-later", "order", now=clock.now + 10_000)

    first = backend.executions.claim_due(limit=2, duration=LEASE_MS, workflows=["order"])
    rest = backend.executions.claim_due(limit=5, duration=LEASE_MS, workflows=["order"])

    assert [lease.execution_id for lease in first] == ["order-0", "order-1"]
    assert [lease.execution_id for lease in rest] == ["order-2"]  # order-later is not due yet
    assert backend.executions.claim_due(limit=5, duration=LEASE_MS, workflows=["order"], now=clock.now + 10_000)[
        0].execution_id == "order-later"


def test_a_claim_of_an_empty_collection_of_workflows_claims_nothing_and_changes_nothing(
        backend, clock, each_backend, db_snapshot):
    admit_mix(backend, clock)
    before = db_snapshot(each_backend)

    assert backend.executions.claim_due(limit=10, duration=LEASE_MS, workflows=()) == []
    assert backend.executions.claim_deliveries(limit=10, duration=LEASE_MS, workflows=frozenset()) == []
    assert backend.executions.next_ready_at(workflows=[]) is None

    assert db_snapshot(each_backend) == before


def test_a_claim_of_a_workflow_nobody_admitted_claims_nothing(backend, clock):
    admit_mix(backend, clock)
    assert backend.executions.claim_due(limit=10, duration=LEASE_MS, workflows={"no-such"}) == []


@pytest.mark.parametrize("workflows", ["order", b"order", 7, ["order", 7], [""], ["x" * 256], ["bad\nname"], [None]],
                         ids=["a-str", "bytes", "an-int", "an-int-item", "empty-name", "too-long", "control", "none"])
def test_a_claim_with_bad_workflows_raises_invalid_argument_naming_it_and_changes_nothing(
        backend, clock, each_backend, db_snapshot, workflows):
    admit_mix(backend, clock)
    before = db_snapshot(each_backend)

    for claim in (lambda: backend.executions.claim_due(limit=10, duration=LEASE_MS, workflows=workflows),
                  lambda: backend.executions.claim_deliveries(limit=10, duration=LEASE_MS, workflows=workflows),
                  lambda: backend.executions.next_ready_at(workflows=workflows)):
        with pytest.raises(InvalidArgument, match="workflows"):
            claim()

    assert db_snapshot(each_backend) == before


def test_claim_deliveries_with_workflows_gives_the_workflow_and_first_input(backend, clock):
    backend.executions.admit("o", "order", '{"n": 1}')
    backend.executions.admit("r", "refund", '{"n": 2}')

    (claimed,) = backend.executions.claim_deliveries(limit=10, duration=LEASE_MS, workflows=["refund"])

    assert (claimed.lease.execution_id, claimed.workflow, claimed.input_json) == ("r", "refund", '{"n": 2}')


def test_a_routed_claim_takes_over_only_expired_leases_of_its_workflows(backend, clock):
    admit_mix(backend, clock, per_workflow=1)
    dead = backend.executions.claim_due(limit=10, duration=1_000)  # a holder that dies with all three
    assert len(dead) == 3
    clock.advance(1_000 + 1_000)  # the lease, then the first redelivery delay

    (lease,) = backend.executions.claim_due(limit=10, duration=LEASE_MS, workflows={"report"})

    assert (lease.execution_id, lease.token) == ("report-0", 2)
    assert backend.executions.get("order-0").status == "admitted"  # expired, left for its own supervisor
    assert [h.ended_by for h in backend.executions.history("report-0")] == ["superseded", None]
    # Read as expired, not superseded: nobody claimed it again.
    assert [(h.token, h.ended_by) for h in backend.executions.history("order-0")] == [(1, "expired")]


def test_acknowledge_and_claim_with_workflows_acknowledges_every_lease_and_claims_only_those(backend, clock):
    admit_mix(backend, clock, per_workflow=2)
    held = backend.executions.claim_due(limit=2, duration=LEASE_MS)  # order-0 and refund-0
    assert [lease.execution_id for lease in held] == ["order-0", "refund-0"]

    replies, leases = backend.executions.acknowledge_and_claim(
        [(lease, Completed("null")) for lease in held], limit=10, duration=LEASE_MS, workflows={"order"})

    assert replies == [Completed("null")] * 2  # an acknowledgement is not routed: it is the holder's
    assert [lease.execution_id for lease in leases] == ["order-1"]
    assert backend.executions.get("refund-0").status == "completed"
    assert {r.status for r in backend.executions.list(workflow="report")} == {"admitted"}


def test_acknowledge_and_claim_deliveries_with_workflows_claims_only_those(backend, clock):
    admit_mix(backend, clock, per_workflow=2)

    replies, claimed = backend.executions.acknowledge_and_claim_deliveries(
        [], limit=10, duration=LEASE_MS, workflows=("report",))

    assert replies == [] and [c.lease.execution_id for c in claimed] == ["report-0", "report-1"]
    assert {c.workflow for c in claimed} == {"report"}


def test_acknowledge_and_claim_with_bad_workflows_raises_before_acknowledging_anything(
        backend, clock, each_backend, db_snapshot):
    admit_mix(backend, clock, per_workflow=1)
    held = backend.executions.claim_due(limit=1, duration=LEASE_MS)
    before = db_snapshot(each_backend)

    with pytest.raises(InvalidArgument, match="workflows"):
        backend.executions.acknowledge_and_claim([(held[0], Completed("null"))], limit=10, duration=LEASE_MS,
                                                 workflows="order")

    assert db_snapshot(each_backend) == before


def test_acknowledge_and_claim_with_no_workflows_acknowledges_and_claims_nothing(backend, clock):
    admit_mix(backend, clock, per_workflow=1)
    held = backend.executions.claim_due(limit=1, duration=LEASE_MS)

    replies, leases = backend.executions.acknowledge_and_claim([(held[0], Completed("null"))], limit=10,
                                                               duration=LEASE_MS, workflows=set())

    assert replies == [Completed("null")] and leases == []
    assert backend.executions.get(held[0].execution_id).status == "completed"


def test_a_claim_of_more_workflows_than_one_statement_names_claims_each_of_them(backend, clock):
    names = [f"wf-{i:03d}" for i in range(CLAIM_WORKFLOWS + 50)]
    for name in names[::25]:
        backend.executions.admit(f"e-{name}", name)
        clock.advance(1)
    backend.executions.admit("foreign", "not-served")

    leases = backend.executions.claim_due(limit=100, duration=LEASE_MS, workflows=names)

    assert [lease.execution_id for lease in leases] == [f"e-{name}" for name in names[::25]]
    assert backend.executions.next_ready_at(workflows=names) is not None


def test_two_routed_claimers_of_one_workflow_never_claim_one_execution_twice(each_backend, clock):
    with open_backend(each_backend, clock=clock) as first, open_backend(each_backend, clock=clock) as second:
        for i in range(20):
            first.executions.admit(f"o{i}", "order")
            first.executions.admit(f"r{i}", "refund")
        got: list[ExecutionLease] = []
        for _ in range(10):
            got += first.executions.claim_due(limit=3, duration=LEASE_MS, workflows={"order"})
            got += second.executions.claim_due(limit=3, duration=LEASE_MS, workflows={"order", "refund"})
        ids = [lease.execution_id for lease in got]
        assert len(ids) == len(set(ids)) == 40


# -- waiting for the next claim ----------------------------------------------------------------


def test_next_ready_at_with_workflows_looks_only_at_those(backend, clock):
    backend.executions.admit("soon", "order", now=clock.now + 10)
    backend.executions.admit("later", "refund", now=clock.now + 500)

    assert backend.executions.next_ready_at() == clock.now + 10
    assert backend.executions.next_ready_at(workflows={"refund"}) == clock.now + 500
    assert backend.executions.next_ready_at(workflows={"order", "refund"}) == clock.now + 10
    assert backend.executions.next_ready_at(workflows={"report"}) is None


def test_next_ready_at_with_workflows_counts_a_running_one_at_its_lease_expiry(backend, clock):
    backend.executions.admit("o", "order")
    (lease,) = backend.executions.claim_due(limit=1, duration=LEASE_MS, workflows={"order"})

    assert backend.executions.next_ready_at(workflows={"order"}) == lease.expires_at + 1_000
    backend.executions.acknowledge(lease, Completed("null"))
    assert backend.executions.next_ready_at(workflows={"order"}) is None


# -- live supervisors --------------------------------------------------------------------------


def register(backend, supervisor_id="sup-a", **overrides):
    row = dict(host="host-a", pid=4711, workflows=["order", "refund"], concurrency=4, workers=2, renew_ms=1_000)
    row.update(overrides)
    return backend.supervisors.register(supervisor_id, **row)


def test_a_registered_supervisor_is_live_for_three_of_its_renewal_intervals(backend, clock):
    record = register(backend)

    assert (record.id, record.host, record.pid, record.workflows, record.concurrency, record.workers,
            record.renew_ms) == ("sup-a", "host-a", 4711, ("order", "refund"), 4, 2, 1_000)
    assert record.started_at == record.last_seen_at == clock.now
    assert backend.supervisors.live() == [record]
    clock.advance(LIVE_INTERVALS * 1_000 - 1)
    assert backend.supervisors.live() == [record]
    clock.advance(1)
    assert backend.supervisors.live() == []
    assert backend.supervisors.served() == set()


def test_a_supervisor_seen_again_stays_live_and_keeps_its_start(backend, clock):
    started = register(backend).started_at
    for _ in range(5):
        clock.advance(2_000)
        assert backend.supervisors.seen("sup-a") is True

    (live,) = backend.supervisors.live()
    assert (live.started_at, live.last_seen_at) == (started, clock.now)


def test_each_supervisor_is_judged_by_its_own_renewal_interval(backend, clock):
    register(backend, "fast", renew_ms=100, workflows=["order"])
    register(backend, "slow", renew_ms=10_000, workflows=["report"])
    clock.advance(1_000)

    assert [s.id for s in backend.supervisors.live()] == ["slow"]
    assert backend.supervisors.served() == {"report"}


def test_a_registration_drops_the_rows_of_supervisors_no_longer_live_and_seen_then_says_so(
        backend, clock, each_backend, db_snapshot):
    register(backend, "killed")
    clock.advance(LIVE_INTERVALS * 1_000)
    register(backend, "new", workflows=["report"])

    assert backend.supervisors.seen("killed") is False  # its row was dropped: it registers again
    assert [s.id for s in backend.supervisors.live()] == ["new"]
    again = register(backend, "killed", started_at=5)
    assert again.started_at == 5 and [s.id for s in backend.supervisors.live()] == ["killed", "new"]


def test_registering_again_updates_the_row_and_keeps_its_start(backend, clock):
    first = register(backend)
    clock.advance(500)

    again = register(backend, workflows=["order"], concurrency=8)

    (live,) = backend.supervisors.live()
    assert live == again
    assert (live.started_at, live.last_seen_at, live.workflows, live.concurrency) == (
        first.started_at, clock.now, ("order",), 8)


def test_a_removed_supervisor_is_gone_and_removing_again_does_nothing(backend, clock):
    register(backend, "a")
    register(backend, "b", workflows=["report"])

    backend.supervisors.remove("a")
    backend.supervisors.remove("a")

    assert [s.id for s in backend.supervisors.live()] == ["b"]
    assert backend.supervisors.served() == {"report"}


def test_a_supervisor_serving_no_workflow_is_live_and_serves_nothing(backend, clock):
    register(backend, workflows=[])
    assert [s.workflows for s in backend.supervisors.live()] == [()]
    assert backend.supervisors.served() == set()


@pytest.mark.parametrize("bad", [
    {"workflows": "order"}, {"workflows": None}, {"workflows": [3]}, {"pid": 0}, {"pid": "1"}, {"concurrency": 0},
    {"workers": 0}, {"renew_ms": 0}, {"host": ""}])
def test_a_registration_with_bad_input_raises_and_writes_nothing(backend, clock, each_backend, db_snapshot, bad):
    before = db_snapshot(each_backend)
    with pytest.raises(InvalidArgument, match=next(iter(bad))):
        register(backend, **bad)
    with pytest.raises(InvalidArgument, match="supervisor_id"):
        register(backend, supervisor_id="")
    assert db_snapshot(each_backend) == before
