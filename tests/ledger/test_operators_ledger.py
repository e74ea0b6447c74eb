"""The operator calls of the ledger (SPEC section 8): cancel, resume, purge, waiting_for, stats,
the list filters, and `ended`, which lets a supervisor find a cancelled delivery within a
heartbeat. Times come from the fake clock; nothing here waits on real time."""

from __future__ import annotations

import json
import os

import pytest

from supervisor import (
    Completed,
    ExecutionConflict,
    Failed,
    LeaseLost,
    Suspended,
    UnknownExecution,
)
from supervisor.ledger.tables import operators as table_operators
from supervisor.ledger.values import WaitReason

LEASE_MS = 30_000


def rows_of(backend, sql: str) -> list[tuple]:
    """Rows read on the backend's own connection (either backend)."""
    return backend.connection.execute(sql).fetchall()


def claim(backend, execution_id, *, now=None):
    """Claim the next due execution, which the test expects to be `execution_id`."""
    (lease,) = backend.executions.claim_due(limit=1, duration=LEASE_MS, now=now)
    assert lease.execution_id == execution_id, lease
    return lease


def fail_it(backend, execution_id, error=None):
    lease = claim(backend, execution_id)
    error = error or {"type": "KeyError", "message": "'sku'", "traceback": "..."}
    assert backend.executions.acknowledge(lease, Failed(json.dumps(error))) == Failed(json.dumps(error))
    return lease


def step(backend, lease, key, response, *, attempt=1, done=True):
    written = backend.heap.write_step(lease, step_key=key, step_attempt=attempt, done=done,
                                      step_response_json=json.dumps(response))
    assert written.status == "written", written
    return written


# -- cancel ------------------------------------------------------------------------------------


def test_cancel_of_an_admitted_execution_is_terminal_and_never_claimed(backend, clock):
    backend.executions.admit("order-1", "order")
    record = backend.executions.cancel("order-1", reason="customer changed their mind")
    assert record.status == "cancelled"
    assert json.loads(record.error_json) == {"type": "Cancelled", "message": "customer changed their mind"}
    assert record.due_at is None and record.result_json is None
    clock.advance(10 * LEASE_MS)
    assert backend.executions.claim_due(limit=10, duration=LEASE_MS) == []
    assert backend.executions.get("order-1").status == "cancelled"


def test_cancel_ends_a_live_delivery_every_fenced_call_of_its_holder_is_lost(backend, clock):
    backend.executions.admit("order-1", "order")
    lease = claim(backend, "order-1")
    step(backend, lease, "charge", {"value": 1})
    clock.advance(100)
    backend.executions.cancel("order-1", reason="stop")
    assert backend.executions.ended([lease]) == [lease]
    assert isinstance(backend.heap.write_step(lease, step_key="ship", step_attempt=1, done=True,
                                              step_response_json="{}"), LeaseLost)
    assert isinstance(backend.executions.renew(lease, duration=LEASE_MS), LeaseLost)
    assert isinstance(backend.executions.acknowledge(lease, Completed("1")), LeaseLost)
    assert isinstance(backend.executions.release(lease), LeaseLost)
    record = backend.executions.get("order-1")
    assert record.status == "cancelled" and record.result_json is None and record.lease_expires_at is None
    assert [s.step_key for s in backend.heap.steps("order-1")] == ["charge"]
    (delivery,) = backend.executions.history("order-1")
    assert (delivery.ended_by, delivery.ended_at) == ("cancelled", clock.now)


def test_cancel_of_a_suspended_execution_is_not_woken_again(backend, clock):
    backend.executions.admit("sleeper", "w")
    backend.executions.acknowledge(claim(backend, "sleeper"), Suspended())
    backend.executions.request_wake("sleeper", clock.now + 1000)
    backend.executions.cancel("sleeper")
    backend.executions.request_wake("sleeper", clock.now)  # ignored, as for any terminal execution
    clock.advance(2000)
    assert backend.executions.claim_due(limit=10, duration=LEASE_MS) == []
    assert backend.executions.get("sleeper").status == "cancelled"


def test_cancel_after_the_lease_ran_out_records_the_delivery_as_expired(backend, clock):
    backend.executions.admit("order-1", "order")
    lease = claim(backend, "order-1")
    clock.advance(LEASE_MS + 5)
    backend.executions.cancel("order-1")
    (delivery,) = backend.executions.history("order-1")
    assert (delivery.ended_by, delivery.ended_at) == ("expired", lease.expires_at)


def test_cancel_is_idempotent_and_leaves_completed_and_failed_executions_unchanged(backend, clock, each_backend,
                                                                                   db_snapshot):
    for eid in ("a", "b", "c"):
        backend.executions.admit(eid, "order")
    backend.executions.acknowledge(claim(backend, "a"), Completed('"done"'))
    fail_it(backend, "b")
    first = backend.executions.cancel("c", reason="once")
    clock.advance(1000)
    before = db_snapshot(each_backend)
    assert backend.executions.cancel("c", reason="twice") == first
    assert backend.executions.cancel("a").status == "completed"
    assert backend.executions.cancel("b").status == "failed"
    assert db_snapshot(each_backend) == before


def test_cancel_of_an_unknown_id_or_with_a_bad_reason_raises_and_changes_nothing(backend, each_backend, db_snapshot):
    backend.executions.admit("order-1", "order")
    before = db_snapshot(each_backend)
    with pytest.raises(UnknownExecution, match="nobody"):
        backend.executions.cancel("nobody")
    with pytest.raises(ValueError, match="reason"):
        backend.executions.cancel("order-1", reason=42)
    with pytest.raises(ValueError, match="execution_id"):
        backend.executions.cancel("")
    assert db_snapshot(each_backend) == before


def test_cancel_of_a_child_wakes_the_parent_waiting_for_it(backend, clock):
    backend.executions.admit("parent", "p")
    backend.executions.admit("child", "c")
    parent = claim(backend, "parent")
    assert backend.executions.await_outcome("child", "parent").status == "admitted"
    backend.executions.acknowledge(parent, Suspended())
    assert backend.executions.get("parent").due_at is None
    backend.executions.cancel("child", reason="not needed")
    assert backend.executions.get("parent").due_at == clock.now
    assert backend.executions.waiting_for("parent") == [WaitReason("due", None, clock.now)]


def test_a_cancelled_execution_forgets_what_it_waited_for(backend):
    backend.executions.admit("waiter", "w")
    backend.effects.wait("effect-1", "waiter")
    backend.executions.cancel("waiter")
    assert rows_of(backend, "SELECT count(*) FROM waiters") == [(0,)]


# -- resume ------------------------------------------------------------------------------------


def test_resume_of_a_failed_execution_is_admitted_due_now_and_keeps_its_steps(backend, clock):
    backend.executions.admit("order-1", "order")
    lease = claim(backend, "order-1")
    step(backend, lease, "reserve", {"value": "r-1"})
    step(backend, lease, "charge", {"error": {"type": "KeyError", "message": "'card'", "traceback": "t"},
                                    "retry_at": None})
    backend.executions.acknowledge(lease, Failed('{"type": "StepFailed"}'))
    clock.advance(5000)
    record = backend.executions.resume("order-1")
    assert (record.status, record.due_at, record.error_json, record.result_json,
            record.unacknowledged_deliveries) == ("admitted", clock.now, None, None, 0)
    steps = backend.heap.steps("order-1")
    assert [(s.step_key, s.attempt, s.step_response_json) for s in steps] == [
        ("reserve", 1, '{"value": "r-1"}'),
        ("charge", 1, '{"error": {"type": "KeyError", "message": "\'card\'", "traceback": "t"}, "retry_at": null}')]
    # The step the run failed on is open again, so the replay tries it once more; the rest stay done.
    assert [s.done for s in steps] == [True, False]
    again = claim(backend, "order-1")
    assert again.token == lease.token + 1


def test_resume_after_a_failure_outside_any_step_reopens_nothing(backend):
    backend.executions.admit("order-1", "order")
    lease = claim(backend, "order-1")
    step(backend, lease, "reserve", {"value": "r-1"})
    backend.executions.acknowledge(lease, Failed('{"type": "NameError"}'))
    backend.executions.resume("order-1")
    assert [s.done for s in backend.heap.steps("order-1")] == [True]


def test_resume_of_a_cancelled_execution(backend, clock):
    backend.executions.admit("order-1", "order")
    backend.executions.cancel("order-1")
    assert backend.executions.resume("order-1").status == "admitted"
    assert claim(backend, "order-1").token == 1


@pytest.mark.parametrize("status", ["admitted", "running", "suspended", "completed"])
def test_resume_of_an_execution_that_did_not_fail_raises_a_conflict_naming_its_status(
        backend, each_backend, db_snapshot, status):
    backend.executions.admit("order-1", "order")
    if status != "admitted":
        lease = claim(backend, "order-1")
        if status == "suspended":
            backend.executions.acknowledge(lease, Suspended())
        elif status == "completed":
            backend.executions.acknowledge(lease, Completed("1"))
    before = db_snapshot(each_backend)
    with pytest.raises(ExecutionConflict, match=f"is {status}"):
        backend.executions.resume("order-1")
    with pytest.raises(UnknownExecution):
        backend.executions.resume("nobody")
    assert db_snapshot(each_backend) == before


# -- purge -------------------------------------------------------------------------------------


def test_purge_deletes_old_terminal_executions_with_what_is_only_theirs(backend, clock, each_backend):
    backend.stores.get_or_create("stock", '{"apples": 3}')
    for eid in ("old-done", "old-failed", "old-cancelled", "old-waiting", "new-done"):
        backend.executions.admit(eid, "order")
    for eid in ("old-done", "old-failed"):
        lease = claim(backend, eid)
        step(backend, lease, "s1", {"value": 1})
        backend.stores.change("stock", execution_id=eid, step_key="take",
                              change=lambda state: ({**state, "apples": state["apples"] - 1}, 1))
        backend.effects.begin(f"{eid}/charge")
        outcome = Completed("1") if eid == "old-done" else Failed("{}")
        backend.executions.acknowledge(lease, outcome)
    backend.executions.cancel("old-cancelled")
    backend.executions.acknowledge(claim(backend, "old-waiting"), Suspended())
    clock.advance(60_000)
    cutoff = clock.now
    backend.executions.acknowledge(claim(backend, "new-done"), Completed("2"))

    assert backend.executions.purge(before=cutoff, dry_run=True) == 3
    assert len(backend.executions.list()) == 5
    assert backend.executions.purge(before=cutoff) == 3
    left = {r.execution_id: r.status for r in backend.executions.list()}
    assert left == {"old-waiting": "suspended", "new-done": "completed"}
    owners = {table: {row[0] for row in rows_of(backend, f"SELECT execution_id FROM {table}")}
              for table in ("steps", "lease_history", "store_receipts")}
    assert owners == {"steps": set(), "lease_history": {"old-waiting", "new-done"}, "store_receipts": set()}
    # Effects and stores are shared by identity: kept.
    assert {row[0] for row in rows_of(backend, "SELECT effect_id FROM effects")} == {"old-done/charge",
                                                                                  "old-failed/charge"}
    assert json.loads(backend.stores.get("stock").state_json) == {"apples": 1}
    assert backend.executions.purge(before=cutoff) == 0


def test_purge_keeps_a_child_while_its_parent_is_not_terminal(backend, clock, monkeypatch):
    monkeypatch.setattr(table_operators, "PURGE_BATCH", 2)  # the kept children span batches
    backend.executions.admit("parent", "p")
    backend.executions.admit("done-parent", "p")
    for n in range(5):
        child = backend.starts.start(f"parent/child-{n}", "c", parent="parent")
        backend.executions.cancel(child)
    backend.starts.start("done-parent/child", "c", parent="done-parent")
    backend.executions.cancel("done-parent/child")
    backend.executions.cancel("done-parent")
    backend.starts.start("from-outside", "c")
    backend.executions.cancel("from-outside")
    clock.advance(1000)
    cutoff = clock.now
    assert backend.executions.purge(before=cutoff, dry_run=True) == 3
    assert backend.executions.purge(before=cutoff) == 3
    assert sorted(r.execution_id for r in backend.executions.list()) == ["parent"] + [
        f"parent/child-{n}" for n in range(5)]
    backend.executions.cancel("parent")
    clock.advance(1000)
    assert backend.executions.purge(before=clock.now) == 6
    assert rows_of(backend, "SELECT count(*) FROM starts") == [(0,)]


def test_purge_refuses_non_terminal_statuses_and_changes_nothing(backend, clock, each_backend, db_snapshot):
    backend.executions.admit("a", "order")
    backend.executions.cancel("a")
    before = db_snapshot(each_backend)
    for statuses in (("completed", "running"), ("admitted",), (), "completed"):
        with pytest.raises(ValueError, match="status"):
            backend.executions.purge(before=clock.now + 1, statuses=statuses)
    with pytest.raises(ValueError, match="before"):
        backend.executions.purge(before="yesterday")
    assert db_snapshot(each_backend) == before


def test_purge_of_only_one_status(backend, clock):
    for eid in ("a", "b"):
        backend.executions.admit(eid, "order")
    backend.executions.cancel("a")
    fail_it(backend, "b")
    clock.advance(1)
    assert backend.executions.purge(before=clock.now, statuses=["failed"]) == 1
    assert [r.execution_id for r in backend.executions.list()] == ["a"]


# -- waiting_for -------------------------------------------------------------------------------


def test_waiting_for_names_a_timer_a_retry_and_a_wake(backend, clock):
    for eid in ("sleeper", "retrier", "woken", "idle"):
        backend.executions.admit(eid, "w")
    lease = claim(backend, "sleeper")
    step(backend, lease, "nap", {"until": clock.now + 60_000})
    backend.executions.request_wake("sleeper", clock.now + 60_000)
    backend.executions.acknowledge(lease, Suspended())
    lease = claim(backend, "retrier")
    step(backend, lease, "charge", {"error": {"type": "Timeout", "message": "bank", "traceback": None},
                                    "retry_at": clock.now + 2000}, done=False)
    backend.executions.request_wake("retrier", clock.now + 2000)
    backend.executions.acknowledge(lease, Suspended())
    backend.executions.acknowledge(claim(backend, "woken"), Suspended())
    backend.executions.request_wake("woken", clock.now + 9000)
    backend.executions.acknowledge(claim(backend, "idle"), Suspended())

    assert backend.executions.waiting_for("sleeper") == [WaitReason("timer", "nap", clock.now + 60_000)]
    assert backend.executions.waiting_for("retrier") == [WaitReason("retry", "charge", clock.now + 2000,
                                                                    "Timeout: bank")]
    assert backend.executions.waiting_for("woken") == [WaitReason("wake", None, clock.now + 9000)]
    assert backend.executions.waiting_for("idle") == [WaitReason("wake")]
    clock.advance(60_000)
    assert backend.executions.waiting_for("sleeper") == [WaitReason("due", None, clock.now)]


def test_waiting_for_names_an_effect_a_store_with_its_match_and_a_child(backend):
    backend.executions.admit("waiter", "w")
    backend.executions.admit("child", "c")
    backend.executions.acknowledge(claim(backend, "waiter"), Suspended())
    backend.effects.wait("waiter/charge", "waiter")
    backend.stores.wait("mailbox", "waiter", 0, match_json='{"order": 42}')
    backend.executions.await_outcome("child", "waiter")
    assert sorted(backend.executions.waiting_for("waiter"), key=lambda r: r.kind) == [
        WaitReason("effect", "waiter/charge"),
        WaitReason("execution", "child"),
        WaitReason("store", "mailbox", None, '{"order": 42}'),
    ]


def test_waiting_for_a_redelivery_backoff_and_nothing_for_running_or_terminal(backend, clock):
    backend.executions.admit("crashy", "w")
    lease = claim(backend, "crashy")
    assert backend.executions.waiting_for("crashy") == []
    backend.executions.release(lease)
    (reason,) = backend.executions.waiting_for("crashy")
    assert (reason.kind, reason.at) == ("redelivery", clock.now + 1000)
    assert "1 deliveries" in reason.detail
    backend.executions.cancel("crashy")
    assert backend.executions.waiting_for("crashy") == []
    with pytest.raises(UnknownExecution):
        backend.executions.waiting_for("nobody")


# -- stats, list, ended ------------------------------------------------------------------------


def test_stats_counts_by_status_and_workflow_and_lists_live_leases(backend, clock):
    for n in range(3):
        backend.executions.admit(f"order-{n}", "order")
    backend.executions.admit("mail-0", "mail")
    leases = backend.executions.claim_due(limit=10, duration=LEASE_MS)
    live = next(lease for lease in leases if lease.execution_id == "order-0")
    clock.advance(10)
    stats = backend.executions.stats()
    assert stats.by_status == {"admitted": 0, "running": 4, "suspended": 0, "completed": 0, "failed": 0,
                               "cancelled": 0}
    assert {lease.execution_id for lease in stats.live_leases} == {"order-0", "order-1", "order-2", "mail-0"}
    first = next(lease for lease in stats.live_leases if lease.execution_id == "order-0")
    assert (first.token, first.expires_at, first.workflow) == (live.token, live.expires_at, "order")
    assert first.holder.endswith(f":{os.getpid()}")
    assert stats.deliveries == 4 and stats.oldest_due is None
    # Expire them all: they read admitted again, with one unacknowledged delivery each.
    clock.advance(LEASE_MS)
    backend.executions.cancel("mail-0")
    stats = backend.executions.stats()
    assert stats.by_status["admitted"] == 3 and stats.by_status["cancelled"] == 1
    assert stats.by_workflow == {"order": {"admitted": 3}, "mail": {"cancelled": 1}}
    assert [r.execution_id for r in stats.unacknowledged] == ["order-0", "order-1", "order-2"]
    assert stats.live_leases == []
    assert stats.oldest_due is None  # all still in their redelivery delay
    clock.advance(1000)
    assert backend.executions.stats().oldest_due.execution_id == "order-0"


def test_list_filters_by_workflow_time_id_prefix_and_pages(backend, clock):
    for n in range(6):
        backend.executions.admit(f"{'order' if n % 2 else 'mail'}-{n}", "order" if n % 2 else "mail")
        clock.advance(1000)
    start = clock.now - 6000
    ids = lambda **kw: [r.execution_id for r in backend.executions.list(**kw)]  # noqa: E731
    assert ids() == ["order-5", "mail-4", "order-3", "mail-2", "order-1", "mail-0"]
    assert ids(workflow="order") == ["order-5", "order-3", "order-1"]
    assert ids(since=start + 2000, until=start + 4000) == ["order-3", "mail-2"]
    assert ids(id_prefix="mail-") == ["mail-4", "mail-2", "mail-0"]
    assert ids(limit=2, offset=1) == ["mail-4", "order-3"]
    assert ids(workflow="mail", offset=2) == ["mail-0"]
    assert ids(limit=0) == []
    backend.executions.cancel("mail-2")
    assert ids(status="cancelled") == ["mail-2"]
    with pytest.raises(ValueError, match="offset"):
        backend.executions.list(offset=-1)
    with pytest.raises(ValueError, match="status"):
        backend.executions.list(status="done")


def test_ended_names_the_leases_that_are_no_longer_current(backend, clock):
    for eid in ("a", "b", "c"):
        backend.executions.admit(eid, "w")
    leases = {lease.execution_id: lease for lease in backend.executions.claim_due(limit=3, duration=LEASE_MS)}
    assert backend.executions.ended(list(leases.values())) == []
    backend.executions.cancel("a")
    backend.executions.acknowledge(leases["b"], Suspended())
    assert backend.executions.ended(list(leases.values())) == [leases["a"], leases["b"]]
    clock.advance(LEASE_MS)
    assert backend.executions.ended([leases["c"]]) == []  # expired, but nobody claimed it since: still current
    clock.advance(1000)
    claim(backend, "c")
    assert backend.executions.ended([leases["c"]]) == [leases["c"]]
