"""Parking a diverged execution (SPEC section 11): `Suspended(diverged=detail)` acknowledged parks
the execution (suspended, not due, waiting for `code`) in the fenced acknowledgement; `unpark`,
`resume` and any other wake make it due again, and its `code` registration never outlives the
parking. Every test runs on both backends, on the fake clock."""

from __future__ import annotations

import json

import pytest

from supervisor import Completed, ExecutionConflict, LeaseLost, Suspended
from supervisor.ledger.arguments import MAX_DETAIL_LENGTH
from supervisor.ledger.errors import InvalidArgument
from supervisor.ledger.values import WaitReason

pytestmark = pytest.mark.timeout(120)

LEASE_MS = 30_000
FAR_FUTURE = 10 ** 13
DETAIL = 'replay diverged: recorded step "charge" next, the code reached "reserve"'


def claim(backend, execution_id, *, now=None):
    """Claim the next due execution, which the test expects to be `execution_id`."""
    (lease,) = backend.executions.claim_due(limit=1, duration=LEASE_MS, now=now)
    assert lease.execution_id == execution_id, lease
    return lease


def code_registrations(backend) -> list[tuple]:
    """Every `code` registration in the waiters table: (target, waiter, detail)."""
    return sorted(backend.connection.execute(
        "SELECT target, waiter, detail FROM waiters WHERE kind = 'code'").fetchall())


def acknowledge_by(backend, how, lease, outcome):
    """Acknowledge through one of the three calls that acknowledge; returns the reply."""
    ex = backend.executions
    if how == "acknowledge":
        return ex.acknowledge(lease, outcome)
    if how == "acknowledge_and_claim":
        (reply,), claimed = ex.acknowledge_and_claim([(lease, outcome)], limit=5, duration=LEASE_MS)
    else:
        (reply,), claimed = ex.acknowledge_and_claim_deliveries([(lease, outcome)], limit=5, duration=LEASE_MS)
    assert claimed == [], "a parked execution is not claimed in the same batch"
    return reply


def park(backend, execution_id, workflow="order", detail=DETAIL):
    """Admit (if new), claim and park `execution_id`."""
    backend.executions.admit(execution_id, workflow)
    lease = claim(backend, execution_id)
    assert backend.executions.acknowledge(lease, Suspended(diverged=detail)) == Suspended(diverged=detail)
    return lease


def assert_parked(backend, execution_id, workflow="order", detail=DETAIL):
    record = backend.executions.get(execution_id)
    assert record.status == "suspended" and record.due_at is None, record
    assert backend.executions.waiting_for(execution_id) == [WaitReason("code", workflow, None, detail)]


def assert_not_parked(backend, execution_id):
    assert all(reason.kind != "code" for reason in backend.executions.waiting_for(execution_id))
    assert all(waiter != execution_id for _, waiter, _ in code_registrations(backend))


# -- parking -----------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["acknowledge", "acknowledge_and_claim", "acknowledge_and_claim_deliveries"])
def test_a_diverged_suspension_parks_the_execution_not_due_and_waiting_for_code(backend, clock, how):
    backend.executions.admit("order-1", "order")
    lease = claim(backend, "order-1")
    assert acknowledge_by(backend, how, lease, Suspended(diverged=DETAIL)) == Suspended(diverged=DETAIL)

    assert_parked(backend, "order-1")
    record = backend.executions.get("order-1")
    assert (record.token, record.lease_expires_at, record.unacknowledged_deliveries) == (1, None, 0)
    assert code_registrations(backend) == [("order", "order-1", DETAIL)]
    (delivery,) = backend.executions.history("order-1")
    assert (delivery.ended_by, delivery.outcome) == ("acknowledged", "suspended")
    # Not due: no claim takes it, however late, and nothing is ever ready.
    assert backend.executions.claim_due(limit=10, duration=LEASE_MS, now=FAR_FUTURE) == []
    assert backend.executions.next_ready_at() is None
    assert backend.executions.ended([lease]) == [lease]


def test_a_wake_requested_during_the_diverged_delivery_is_dropped(backend, clock):
    backend.executions.admit("order-1", "order")
    lease = claim(backend, "order-1")
    backend.executions.request_wake("order-1", clock() + 5_000)
    backend.executions.acknowledge(lease, Suspended(diverged=DETAIL))
    assert_parked(backend, "order-1")
    assert backend.executions.claim_due(limit=10, duration=LEASE_MS, now=FAR_FUTURE) == []


def test_an_ordinary_suspension_is_not_parked(backend, clock):
    backend.executions.admit("order-1", "order")
    lease = claim(backend, "order-1")
    backend.executions.request_wake("order-1", clock() + 5_000)
    assert backend.executions.acknowledge(lease, Suspended()) == Suspended()
    assert backend.executions.get("order-1").due_at == clock() + 5_000
    assert code_registrations(backend) == []
    assert backend.executions.unpark(["order"]) == 0


def test_a_stale_holders_diverged_suspension_is_refused_and_changes_nothing(backend, clock, each_backend,
                                                                            db_snapshot):
    backend.executions.admit("order-1", "order")
    stale = claim(backend, "order-1")
    clock.advance(LEASE_MS + 10_000)  # expired, and past the redelivery delay
    current = claim(backend, "order-1")
    assert current.token == stale.token + 1
    before = db_snapshot(each_backend)
    assert backend.executions.acknowledge(stale, Suspended(diverged=DETAIL)) == LeaseLost()
    replies, claimed = backend.executions.acknowledge_and_claim([(stale, Suspended(diverged=DETAIL))], limit=0,
                                                                duration=LEASE_MS)
    assert (replies, claimed) == ([LeaseLost()], [])
    assert db_snapshot(each_backend) == before
    assert backend.executions.get("order-1").status == "running"


def test_a_batch_parks_its_current_deliveries_and_refuses_a_stale_one_alone(backend, clock):
    ex = backend.executions
    ex.admit("c", "order")
    stale = claim(backend, "c")
    clock.advance(LEASE_MS + 10_000)
    assert claim(backend, "c").token == stale.token + 1
    ex.admit("a", "order")
    ex.admit("b", "order")
    leases = {lease.execution_id: lease for lease in ex.claim_due(limit=2, duration=LEASE_MS)}
    replies, claimed = ex.acknowledge_and_claim([(leases["a"], Suspended(diverged="a diverged")),
                                                 (leases["b"], Completed("1")),
                                                 (stale, Suspended(diverged="stale"))], limit=5, duration=LEASE_MS)
    assert (replies, claimed) == ([Suspended(diverged="a diverged"), Completed("1"), LeaseLost()], [])
    assert_parked(backend, "a", detail="a diverged")
    assert ex.get("b").status == "completed"
    assert ex.get("c").status == "running"
    assert code_registrations(backend) == [("order", "a", "a diverged")]


def test_parking_again_keeps_one_registration_with_the_latest_detail(backend, clock):
    park(backend, "order-1", detail="first")
    backend.executions.request_wake("order-1", clock())
    lease = claim(backend, "order-1")
    backend.executions.acknowledge(lease, Suspended(diverged="second"))
    assert_parked(backend, "order-1", detail="second")
    assert code_registrations(backend) == [("order", "order-1", "second")]


def test_a_diverged_detail_of_the_largest_length_is_kept_whole(backend):
    detail = "d" * MAX_DETAIL_LENGTH
    park(backend, "order-1", detail=detail)
    assert_parked(backend, "order-1", detail=detail)


# -- unpark ------------------------------------------------------------------------------------


def test_unpark_makes_the_parked_executions_of_its_workflows_due_and_leaves_the_others(backend, clock, each_backend,
                                                                                     db_snapshot):
    park(backend, "order-1")
    park(backend, "order-2")
    park(backend, "mail-1", workflow="mail")
    backend.executions.admit("quiet", "order")  # an ordinary suspension, not due: not parked
    backend.executions.acknowledge(claim(backend, "quiet"), Suspended())

    before = db_snapshot(each_backend)
    assert backend.executions.unpark(["billing"]) == 0
    assert backend.executions.unpark([]) == 0
    assert db_snapshot(each_backend) == before

    clock.advance(1_000)
    assert backend.executions.unpark({"order", "billing"}) == 2
    for eid in ("order-1", "order-2"):
        record = backend.executions.get(eid)
        assert (record.status, record.due_at) == ("suspended", clock())
        assert_not_parked(backend, eid)
        assert backend.executions.waiting_for(eid) == [WaitReason("due", None, clock())]
    assert_parked(backend, "mail-1", workflow="mail")
    assert backend.executions.get("quiet").due_at is None
    claimed = backend.executions.claim_due(limit=10, duration=LEASE_MS)
    assert sorted(lease.execution_id for lease in claimed) == ["order-1", "order-2"]
    assert backend.executions.unpark(["order"]) == 0  # nothing left parked


def test_unpark_with_now_makes_them_due_then(backend, clock):
    park(backend, "order-1")
    at = clock() + 60_000
    assert backend.executions.unpark(("order",), now=at) == 1
    assert backend.executions.get("order-1").due_at == at
    assert backend.executions.claim_due(limit=1, duration=LEASE_MS, now=at - 1) == []
    assert [lease.execution_id for lease in backend.executions.claim_due(limit=1, duration=LEASE_MS, now=at)] == [
        "order-1"]


@pytest.mark.parametrize("workflows, now", [
    ("order", None),                 # a str is not a collection of names
    (None, None),
    (42, None),
    ({"order": 1}, None),            # a mapping is not a collection of names
    ([""], None),
    (["order", 42], None),
    (["x" * 256], None),
    (["ord\ner"], None),
    (["order"], "soon"),
])
def test_unpark_of_bad_input_is_refused_and_changes_nothing(backend, each_backend, db_snapshot, workflows, now):
    park(backend, "order-1")
    before = db_snapshot(each_backend)
    with pytest.raises(InvalidArgument, match="workflows|now"):
        backend.executions.unpark(workflows, now=now)
    assert db_snapshot(each_backend) == before


# -- resume ------------------------------------------------------------------------------------


def test_resume_of_a_parked_execution_makes_it_due_now_and_parked_no_more(backend, clock):
    park(backend, "order-1")
    clock.advance(5_000)
    record = backend.executions.resume("order-1")
    assert (record.status, record.due_at, record.token) == ("suspended", clock(), 1)
    assert_not_parked(backend, "order-1")
    assert claim(backend, "order-1").token == 2


def test_resume_of_a_suspended_execution_that_is_not_parked_is_still_a_conflict(backend, each_backend, db_snapshot):
    backend.executions.admit("order-1", "order")
    backend.executions.acknowledge(claim(backend, "order-1"), Suspended())
    before = db_snapshot(each_backend)
    with pytest.raises(ExecutionConflict, match="is suspended: only a failed, cancelled or parked"):
        backend.executions.resume("order-1")
    assert db_snapshot(each_backend) == before


# -- wakes from other paths --------------------------------------------------------------------


def wake_by_request(backend, clock, child):
    backend.executions.request_wake("parent", clock())


def wake_by_child(backend, clock, child):
    assert backend.executions.acknowledge(child, Completed('"done"')) == Completed('"done"')


def wake_by_child_in_a_batch(backend, clock, child):
    replies, claimed = backend.executions.acknowledge_and_claim([(child, Completed('"done"'))], limit=1,
                                                                duration=LEASE_MS)
    assert replies == [Completed('"done"')]
    assert [each.execution_id for each in claimed] == ["parent"]  # woken, and claimed in the same batch
    backend.executions.release(claimed[0])


def wake_by_store(backend, clock, child):
    backend.stores.set("stock", '{"apples": 4}')


def wake_by_effect(backend, clock, child):
    backend.effects.settle("charge-1", '"ch_1"')


WAKERS = {"request_wake": wake_by_request, "child": wake_by_child, "child in a batch": wake_by_child_in_a_batch,
          "store": wake_by_store, "effect": wake_by_effect}


@pytest.mark.parametrize("waker", list(WAKERS))
def test_a_wake_from_another_path_unparks_and_leaves_no_stale_code_reason(backend, clock, waker):
    ex = backend.executions
    ex.admit("child", "ship")
    (child,) = ex.claim_due(limit=1, duration=10 ** 9)  # running throughout, unless a waker ends it
    ex.admit("parent", "order")
    backend.stores.get_or_create("stock", '{"apples": 3}')
    backend.effects.begin("charge-1")
    lease = claim(backend, "parent")
    # What the parent waits for, registered by a delivery before the code changed.
    ex.await_outcome("child", "parent")
    assert backend.stores.wait("stock", "parent", backend.stores.get("stock").version) is False
    backend.effects.wait("charge-1", "parent")
    ex.acknowledge(lease, Suspended(diverged=DETAIL))
    record = ex.get("parent")
    assert record.status == "suspended" and record.due_at is None
    assert code_registrations(backend) == [("order", "parent", DETAIL)]

    WAKERS[waker](backend, clock, child)
    assert_not_parked(backend, "parent")
    clock.advance(60_000)  # past the redelivery delay of the batch's release
    # It runs once more (the one delivery a wake costs) and suspends as code that no longer
    # diverges would: nothing says it waits for code any more.
    lease = claim(backend, "parent")
    assert ex.acknowledge(lease, Suspended()) == Suspended()
    assert_not_parked(backend, "parent")
    assert code_registrations(backend) == []


def test_cancel_of_a_parked_execution_forgets_its_parking(backend):
    park(backend, "order-1")
    assert backend.executions.cancel("order-1").status == "cancelled"
    assert code_registrations(backend) == []
    assert backend.executions.unpark(["order"]) == 0
    assert backend.executions.get("order-1").status == "cancelled"


def test_purge_removes_a_code_registration_with_its_execution(backend, clock):
    park(backend, "order-1")
    backend.executions.cancel("order-1")
    # A registration left by some earlier ledger on a terminal execution still goes with it.
    backend.executions.admit("order-2", "order")
    backend.executions.acknowledge(claim(backend, "order-2"), Completed("1"))
    with backend.connection.write() as db:
        db.execute(backend.executions._sql["INSERT INTO waiters (kind, target, waiter, registered_at, detail)"
                                           " VALUES ('code', 'order', $p, 0, 'left over')"], ("order-2",))
    clock.advance(1_000)
    assert backend.executions.purge(before=clock()) == 2
    assert code_registrations(backend) == []
    assert backend.executions.list() == []


def test_stats_counts_the_parked_executions_by_workflow(backend):
    park(backend, "order-1")
    park(backend, "order-2")
    park(backend, "mail-1", workflow="mail")
    stats = backend.executions.stats()
    assert stats.parked == {"mail": 1, "order": 2}
    assert stats.by_status["suspended"] == 3
    backend.executions.unpark(["order"])
    assert backend.executions.stats().parked == {"mail": 1}


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("detail", [42, b"diverged", "", "   ", "d" * (MAX_DETAIL_LENGTH + 1)])
@pytest.mark.parametrize("how", ["acknowledge", "acknowledge_and_claim", "acknowledge_and_claim_deliveries"])
def test_a_bad_diverged_detail_is_refused_and_changes_nothing(backend, each_backend, db_snapshot, how, detail):
    backend.executions.admit("order-1", "order")
    backend.executions.admit("order-2", "order")
    lease = claim(backend, "order-1")
    before = db_snapshot(each_backend)
    with pytest.raises(InvalidArgument, match="outcome.diverged"):
        acknowledge_by(backend, how, lease, Suspended(diverged=detail))
    assert db_snapshot(each_backend) == before
    assert backend.executions.get("order-1").status == "running"
