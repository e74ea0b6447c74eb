"""The ledger contract (SPEC section 3, RFC 002's conformance and fencing tables).

Every backend implementation must pass this module, and every test runs on each: `each_backend` is
a SQLite file or the URI of a fresh PostgreSQL database (a throwaway server, see
`tests/pgcluster.py`). Times come from the injected fake clock
(`clock` fixture) or an explicit `now=`; nothing here waits on real time except the
two-dispatcher race, which releases two threads at one barrier.
"""

from __future__ import annotations

import threading

import pytest

from supervisor import (
    Completed,
    ExecutionConflict,
    ExecutionLease,
    ExecutionRecord,
    Failed,
    HeapRecord,
    LeaseLost,
    Released,
    Renewed,
    SqliteBackend,
    Suspended,
    open_backend,
)

LEASE_MS = 30_000


def default_delay(n: int) -> int:
    """The redelivery delay SPEC section 3 prescribes when none is given."""
    return min(1000 * 2 ** (n - 1), 300_000)


def claim_one(backend, *, duration=LEASE_MS, now=None) -> ExecutionLease:
    leases = backend.executions.claim_due(limit=10, duration=duration, now=now)
    assert len(leases) == 1, leases
    return leases[0]


def nothing_claimable(backend, *, now=None) -> bool:
    return backend.executions.claim_due(limit=10, duration=LEASE_MS, now=now) == []


# -- RFC 002 conformance tests ---------------------------------------------------------------


@pytest.mark.timeout(60)
def test_two_dispatchers_claim_concurrently_exactly_one_receives_a_lease(each_backend, clock):
    rounds = 40
    with open_backend(each_backend, clock=clock) as first, open_backend(each_backend, clock=clock) as second:
        barrier = threading.Barrier(3, timeout=10)  # the two dispatchers and this thread
        results: dict[str, list] = {"first": [], "second": []}

        def dispatcher(name, backend):
            for _ in range(rounds):
                barrier.wait()  # the round's execution is admitted: claim, both at once
                results[name].append(backend.executions.claim_due(limit=5, duration=LEASE_MS))
                barrier.wait()  # the round is over

        threads = [threading.Thread(target=dispatcher, args=item) for item in (("first", first), ("second", second))]
        for thread in threads:
            thread.start()
        for i in range(rounds):
            first.executions.admit(f"order-{i}", "charge")
            barrier.wait()
            barrier.wait()
        for thread in threads:
            thread.join(timeout=30)
            assert not thread.is_alive()

        for i in range(rounds):
            got = results["first"][i] + results["second"][i]
            assert got == [ExecutionLease(f"order-{i}", 1, clock.now + LEASE_MS)], (i, got)
        assert second.executions.get("order-0").status == "running"


def test_claim_due_claims_a_due_execution_status_is_running(backend, clock):
    backend.executions.admit("order-42", "charge", '{"amount": 5}')
    lease = claim_one(backend)

    assert lease == ExecutionLease("order-42", 1, clock.now + LEASE_MS)
    record = backend.executions.get("order-42")
    assert record.status == "running"
    assert record.token == 1
    assert record.lease_expires_at == clock.now + LEASE_MS
    assert record.unacknowledged_deliveries == 0


def test_lease_expires_without_renewal_execution_is_claimable_with_a_higher_token(backend, clock):
    backend.executions.admit("order-42", "charge")
    first = claim_one(backend, duration=100)

    assert nothing_claimable(backend, now=first.expires_at - 1)  # still live
    # Expiry counts as an unacknowledged delivery ending at expires_at, so the redelivery
    # delay runs from there.
    assert nothing_claimable(backend, now=first.expires_at + default_delay(1) - 1)
    clock.now = first.expires_at + default_delay(1)
    second = claim_one(backend)

    assert second.token > first.token
    assert second.token == 2
    assert backend.executions.get("order-42").status == "running"


def test_lease_expires_after_an_earlier_suspended_delivery_status_returns_to_suspended(backend, clock):
    backend.executions.admit("order-42", "charge")
    first = claim_one(backend)
    backend.executions.request_wake("order-42", clock.now + 10)
    assert backend.executions.acknowledge(first, Suspended()) == Suspended()
    clock.advance(10)
    second = claim_one(backend, duration=50)

    clock.now = second.expires_at
    record = backend.executions.get("order-42")
    assert record.status == "suspended"
    assert record.lease_expires_at is None
    assert record.unacknowledged_deliveries == 1


def test_lease_expires_before_any_acknowledgement_status_returns_to_admitted(backend, clock):
    backend.executions.admit("order-42", "charge")
    lease = claim_one(backend, duration=50)

    clock.now = lease.expires_at
    record = backend.executions.get("order-42")
    assert record.status == "admitted"
    assert record.lease_expires_at is None
    assert record.unacknowledged_deliveries == 1


def test_renewal_keeps_the_lease_past_its_original_expiry_delivery_completes_with_one_claim(each_backend, clock):
    with open_backend(each_backend, clock=clock) as holder, open_backend(each_backend, clock=clock) as rival:
        holder.executions.admit("order-42", "charge")
        lease = claim_one(holder, duration=100)
        original_expiry = lease.expires_at
        for _ in range(10):  # ten lease periods, renewed at half-life
            clock.advance(50)
            reply = holder.executions.renew(lease, duration=100)
            assert isinstance(reply, Renewed)
            assert reply.status == "renewed"
            assert reply.lease == ExecutionLease("order-42", 1, clock.now + 100)
            lease = reply.lease
            assert nothing_claimable(rival)
        assert clock.now > original_expiry

        assert holder.heap.write_step(lease, step_key="charge", step_attempt=0, done=True,
                                      step_response_json='"ch_1"').status == "written"
        assert holder.executions.acknowledge(lease, Completed('"paid"')) == Completed('"paid"')

        record = rival.executions.get("order-42")
        assert (record.status, record.token, record.result_json) == ("completed", 1, '"paid"')
        assert [h.token for h in rival.executions.history("order-42")] == [1]
        assert rival.executions.history("order-42")[0].renewals == 10


def test_renewal_uses_a_stale_token_returns_lost(backend, clock, each_backend, db_snapshot):
    backend.executions.admit("order-42", "charge")
    stale = claim_one(backend, duration=100)
    clock.now = stale.expires_at + default_delay(1)
    current = claim_one(backend, duration=100)
    before = db_snapshot(each_backend)

    reply = backend.executions.renew(stale, duration=10_000)

    assert reply == LeaseLost()
    assert reply.status == "lost"
    assert db_snapshot(each_backend) == before
    assert backend.executions.get("order-42").lease_expires_at == current.expires_at


def test_lease_is_released_claimable_after_the_redelivery_delay_with_a_higher_token(backend, clock):
    backend.executions.admit("order-42", "charge")
    first = claim_one(backend)
    clock.advance(5)
    reply = backend.executions.release(first)
    assert reply == Released()
    assert reply.status == "released"
    released_at = clock.now

    assert nothing_claimable(backend, now=released_at + default_delay(1) - 1)
    clock.now = released_at + default_delay(1)
    second = claim_one(backend)
    assert second.token == first.token + 1


def test_acknowledge_suspended_with_a_future_wake_lease_ends_and_execution_is_due_at_the_wake(backend, clock):
    backend.executions.admit("order-42", "charge")
    lease = claim_one(backend)
    wake_at = clock.now + 5_000
    backend.executions.request_wake("order-42", wake_at)
    clock.advance(100)

    assert backend.executions.acknowledge(lease, Suspended()) == Suspended()

    record = backend.executions.get("order-42")
    assert (record.status, record.due_at, record.lease_expires_at) == ("suspended", wake_at, None)
    assert backend.executions.renew(lease, duration=100) == LeaseLost()  # the lease has ended
    assert nothing_claimable(backend, now=wake_at - 1)
    clock.now = wake_at
    assert claim_one(backend).token == 2


def test_acknowledge_suspended_with_no_wake_lease_ends_and_execution_is_not_due(backend, clock):
    backend.executions.admit("order-42", "charge")
    lease = claim_one(backend)

    assert backend.executions.acknowledge(lease, Suspended()) == Suspended()

    record = backend.executions.get("order-42")
    assert (record.status, record.due_at, record.lease_expires_at) == ("suspended", None, None)
    assert backend.executions.renew(lease, duration=100) == LeaseLost()
    assert nothing_claimable(backend, now=clock.now + 10**9)


# -- RFC 002 fencing tests -------------------------------------------------------------------


def reclaimed(backend, clock, *, duration=100):
    """Admit, claim, let the lease expire and claim again: (stale lease, current lease)."""
    backend.executions.admit("order-42", "charge")
    stale = claim_one(backend, duration=duration)
    clock.now = stale.expires_at + default_delay(1)
    current = claim_one(backend, duration=LEASE_MS)
    assert current.token == stale.token + 1
    return stale, current


def test_stale_holder_writes_a_heap_step_after_a_reclaim_returns_lost_and_current_records_unchanged(
        backend, clock, each_backend, db_snapshot):
    backend.executions.admit("order-42", "charge")
    stale = claim_one(backend, duration=100)
    assert backend.heap.write_step(stale, step_key="load", step_attempt=0, done=True,
                                   step_response_json='{"order": 42}').status == "written"
    clock.now = stale.expires_at + default_delay(1)
    current = claim_one(backend)
    charged = backend.heap.write_step(current, step_key="charge", step_attempt=0, done=True,
                                      step_response_json='"ch_current"')
    before = db_snapshot(each_backend)

    replies = [
        backend.heap.write_step(stale, step_key="charge", step_attempt=0, done=True,
                                step_response_json='"ch_stale"'),
        backend.heap.write_step(stale, step_key="charge", step_attempt=1, done=True,
                                step_response_json='"ch_stale"'),
        backend.heap.write_step(stale, step_key="refund", step_attempt=0, done=False,
                                step_response_json='"stale"'),
    ]

    assert replies == [LeaseLost()] * 3
    assert db_snapshot(each_backend) == before
    assert backend.heap.read_step("order-42", "charge") == charged
    assert backend.heap.read_step("order-42", "refund") is None
    assert [s.step_key for s in backend.heap.steps("order-42")] == ["load", "charge"]


@pytest.mark.parametrize("outcome", [Suspended(), Completed('"stale"'), Failed('{"error": "stale"}')],
                         ids=["suspended", "completed", "failed"])
@pytest.mark.parametrize("current_state", ["running", "completed"])
def test_stale_holder_acknowledges_after_a_reclaim_returns_lost_status_and_outcome_unchanged(
        backend, clock, each_backend, db_snapshot, outcome, current_state):
    stale, current = reclaimed(backend, clock)
    if current_state == "completed":
        assert backend.executions.acknowledge(current, Completed('"paid"')) == Completed('"paid"')
    before_record = backend.executions.get("order-42")
    before = db_snapshot(each_backend)

    assert backend.executions.acknowledge(stale, outcome) == LeaseLost()

    assert db_snapshot(each_backend) == before
    assert backend.executions.get("order-42") == before_record
    assert before_record.status == current_state
    if current_state == "running":
        assert backend.executions.renew(current, duration=LEASE_MS).status == "renewed"


def test_holder_pauses_past_expiry_another_claims_and_every_fenced_write_from_the_first_returns_lost(
        each_backend, clock, db_snapshot):
    with open_backend(each_backend, clock=clock) as paused, open_backend(each_backend, clock=clock) as other:
        paused.executions.admit("order-42", "charge")
        lease = claim_one(paused, duration=100)
        clock.now = lease.expires_at + default_delay(1)  # paused: no renewal
        current = claim_one(other)
        other.heap.write_step(current, step_key="charge", step_attempt=0, done=True, step_response_json='"ch_2"')
        before = db_snapshot(each_backend)

        replies = [
            paused.heap.write_step(lease, step_key="charge", step_attempt=0, done=True, step_response_json='"ch_1"'),
            paused.heap.write_step(lease, step_key="email", step_attempt=0, done=True, step_response_json='"sent"'),
            paused.executions.renew(lease, duration=100),
            paused.executions.release(lease),
            paused.executions.acknowledge(lease, Suspended()),
            paused.executions.acknowledge(lease, Completed('"done"')),
            paused.executions.acknowledge(lease, Failed('"boom"')),
        ]

        assert replies == [LeaseLost()] * len(replies)
        assert all(reply.status == "lost" for reply in replies)
        assert db_snapshot(each_backend) == before
        record = other.executions.get("order-42")
        assert (record.status, record.token, record.lease_expires_at) == ("running", 2, current.expires_at)


def test_current_holder_rewrites_an_existing_step_record_succeeds_and_recorded_value_is_unchanged(
        backend, each_backend, db_snapshot):
    backend.executions.admit("order-42", "charge")
    lease = claim_one(backend)
    first = backend.heap.write_step(lease, step_key="charge", step_attempt=0, done=True,
                                    step_response_json='{"charge": "ch_1"}')
    assert first == HeapRecord("order-42", "charge", 0, True, '{"charge": "ch_1"}')
    before = db_snapshot(each_backend)

    again = backend.heap.write_step(lease, step_key="charge", step_attempt=0, done=False,
                                    step_response_json='{"charge": "ch_2"}')

    assert again == first  # the caller continues with the recorded value
    assert again.status == "written"
    assert db_snapshot(each_backend) == before


@pytest.mark.parametrize("current_acknowledges", ["suspended", "completed"])
def test_stale_holder_requests_a_wake_at_most_one_extra_delivery_and_outcome_unchanged(
        backend, clock, current_acknowledges):
    stale, current = reclaimed(backend, clock)
    final = Suspended() if current_acknowledges == "suspended" else Completed('"paid"')
    if current_acknowledges == "completed":
        assert backend.executions.acknowledge(current, final) == final
        backend.executions.request_wake("order-42", clock.now)  # the stale holder's wake
    else:
        backend.executions.request_wake("order-42", clock.now)  # during the current live lease
        assert backend.executions.acknowledge(current, final) == final

    extra = []
    for _ in range(5):  # every delivery from here on acknowledges suspended with no wake
        clock.advance(default_delay(10))
        for lease in backend.executions.claim_due(limit=10, duration=LEASE_MS):
            extra.append(lease)
            assert backend.executions.acknowledge(lease, Suspended()) == Suspended()

    assert len(extra) <= 1
    assert len(extra) == (1 if current_acknowledges == "suspended" else 0)
    record = backend.executions.get("order-42")
    assert record.status == current_acknowledges
    if current_acknowledges == "completed":
        assert (record.result_json, record.token) == ('"paid"', current.token)


# -- dispatcher-table rows that are pure ledger semantics ------------------------------------


def test_release_increments_unacknowledged_deliveries_by_one(backend, clock):
    backend.executions.admit("order-42", "charge")
    for n in range(1, 4):
        lease = claim_one(backend)
        assert backend.executions.get("order-42").unacknowledged_deliveries == n - 1
        assert backend.executions.release(lease) == Released()
        assert backend.executions.get("order-42").unacknowledged_deliveries == n
        clock.advance(default_delay(n))


def test_repeated_releases_each_wait_a_nonzero_nondecreasing_delay(each_backend, clock):
    delays = {1: 7, 2: 7, 3: 40, 4: 90, 5: 90}
    with open_backend(each_backend, clock=clock, redelivery_delay=lambda n: delays.get(n, 500)) as backend:
        backend.executions.admit("order-42", "charge")
        lease = claim_one(backend)
        observed = []
        for _ in range(6):
            clock.advance(3)
            assert backend.executions.release(lease) == Released()
            released_at = clock.now
            # Step the clock one ms at a time until the execution can be claimed again.
            while not (leases := backend.executions.claim_due(limit=1, duration=LEASE_MS)):
                clock.advance(1)
                assert clock.now - released_at <= 1_000, "never claimable again"
            lease = leases[0]
            observed.append(clock.now - released_at)

    assert observed == [7, 7, 40, 90, 90, 500]
    assert all(d > 0 for d in observed)
    assert observed == sorted(observed)


def test_lease_expires_after_a_release_both_count_unacknowledged_deliveries_is_two(backend, clock):
    backend.executions.admit("order-42", "charge")
    assert backend.executions.release(claim_one(backend)) == Released()
    clock.advance(default_delay(1))
    lease = claim_one(backend, duration=100)
    assert backend.executions.get("order-42").unacknowledged_deliveries == 1

    clock.now = lease.expires_at
    record = backend.executions.get("order-42")
    assert (record.status, record.unacknowledged_deliveries) == ("admitted", 2)
    # The expiry is recorded by the next claim; the count stays two, then the delay for n = 2.
    assert nothing_claimable(backend, now=lease.expires_at + default_delay(2) - 1)
    clock.now = lease.expires_at + default_delay(2)
    claim_one(backend)
    assert backend.executions.get("order-42").unacknowledged_deliveries == 2


@pytest.mark.parametrize("wake", ["during the delivery", "after the acknowledgement"])
def test_acknowledged_after_several_releases_resets_to_zero_and_next_wake_is_not_delayed(backend, clock, wake):
    backend.executions.admit("order-42", "charge")
    for n in range(1, 5):
        assert backend.executions.release(claim_one(backend)) == Released()
        clock.advance(default_delay(n))
    lease = claim_one(backend)
    assert backend.executions.get("order-42").unacknowledged_deliveries == 4
    wake_at = clock.now + 20
    if wake == "during the delivery":
        backend.executions.request_wake("order-42", wake_at)

    assert backend.executions.acknowledge(lease, Suspended()) == Suspended()
    if wake == "after the acknowledgement":
        backend.executions.request_wake("order-42", wake_at)

    record = backend.executions.get("order-42")
    assert (record.unacknowledged_deliveries, record.due_at) == (0, wake_at)
    assert nothing_claimable(backend, now=wake_at - 1)
    assert claim_one(backend, now=wake_at).token == 6  # not held back by delay(4) = 8 s


# -- get(), wakes, admit ---------------------------------------------------------------------


def test_get_reads_the_record_as_of_now_and_counts_an_expiry(backend, clock):
    created = clock.now
    backend.executions.admit("order-42", "charge", '{"amount": 5}')
    lease = claim_one(backend, duration=100)

    live = backend.executions.get("order-42", now=lease.expires_at - 1)
    assert live == ExecutionRecord(
        execution_id="order-42", workflow="charge", input_json='{"amount": 5}', status="running", token=1,
        due_at=created, lease_expires_at=lease.expires_at, unacknowledged_deliveries=0, result_json=None,
        error_json=None, created_at=created, updated_at=live.updated_at,
    )
    expired = backend.executions.get("order-42", now=lease.expires_at)  # expires_at <= now: not live
    assert (expired.status, expired.lease_expires_at, expired.unacknowledged_deliveries) == ("admitted", None, 1)
    assert expired.token == 1
    assert expired.due_at == created  # the delivery's wakes are still owed
    # Reading is not writing: the same record reads as live again for an earlier now.
    assert backend.executions.get("order-42", now=lease.expires_at - 1) == live
    assert backend.executions.get("unknown") is None


def test_get_with_steps_reads_the_record_as_of_now_and_the_steps_in_write_order(backend, clock):
    backend.executions.admit("order-42", "charge", '{"amount": 5}')
    lease = claim_one(backend, duration=100)
    backend.executions.admit("order-43", "charge")
    assert backend.executions.get_with_steps("order-42") == (backend.executions.get("order-42"), [])
    for key, attempt, done in (("load", 1, True), ("charge", 2, False), ("charge", 1, False)):
        backend.heap.write_step(lease, step_key=key, step_attempt=attempt, done=done,
                                step_response_json=f'{{"attempt": {attempt}}}')

    for now in (lease.expires_at - 1, lease.expires_at):  # live, then expired: as `get` reads it
        record, steps = backend.executions.get_with_steps("order-42", now=now)
        assert record == backend.executions.get("order-42", now=now)
        assert steps == backend.heap.steps("order-42")
    assert [(s.step_key, s.attempt, s.done) for s in steps] == [("load", 1, True), ("charge", 2, False),
                                                                ("charge", 1, False)]
    assert backend.executions.get_with_steps("order-43") == (backend.executions.get("order-43"), [])
    assert backend.executions.get_with_steps("unknown") is None


def test_request_wake_during_a_live_lease_is_remembered_and_not_claimable_while_live(backend, clock):
    backend.executions.admit("order-42", "charge")
    lease = claim_one(backend, duration=1_000)
    wake_at = clock.now + 10
    backend.executions.request_wake("order-42", wake_at)
    backend.executions.request_wake("order-42", wake_at + 500)  # a later wake does not override

    clock.now = wake_at + 100  # the wake's time has come, but the lease is live
    assert nothing_claimable(backend)
    assert backend.executions.get("order-42").status == "running"

    assert backend.executions.acknowledge(lease, Suspended()) == Suspended()
    assert backend.executions.get("order-42").due_at == wake_at
    assert claim_one(backend).token == 2  # overdue: claimable at once


def test_request_wake_without_a_live_lease_moves_due_at_earlier_only(backend, clock):
    backend.executions.admit("order-42", "charge")
    lease = claim_one(backend)
    assert backend.executions.acknowledge(lease, Suspended()) == Suspended()

    backend.executions.request_wake("order-42", clock.now + 500)
    assert backend.executions.get("order-42").due_at == clock.now + 500
    backend.executions.request_wake("order-42", clock.now + 900)
    assert backend.executions.get("order-42").due_at == clock.now + 500
    backend.executions.request_wake("order-42", clock.now + 200)
    assert backend.executions.get("order-42").due_at == clock.now + 200
    assert nothing_claimable(backend, now=clock.now + 199)
    assert claim_one(backend, now=clock.now + 200).token == 2


def test_request_wake_for_an_unknown_execution_raises(backend, each_backend, db_snapshot):
    before = db_snapshot(each_backend)
    with pytest.raises(ValueError, match="execution_id"):
        backend.executions.request_wake("nobody", 5)
    assert db_snapshot(each_backend) == before


@pytest.mark.parametrize("ended_by", ["release", "expiry"])
def test_wakes_requested_during_a_delivery_are_still_owed_after_a_release_or_expiry(backend, clock, ended_by):
    backend.executions.admit("order-42", "charge")
    admitted_at = clock.now
    clock.advance(10)
    lease = claim_one(backend, duration=100)
    backend.executions.request_wake("order-42", clock.now + 5_000)
    backend.executions.request_wake("order-42", admitted_at - 7)  # earlier than the old due time
    if ended_by == "release":
        clock.advance(20)
        assert backend.executions.release(lease) == Released()
        ended_at = clock.now
    else:
        ended_at = lease.expires_at
        clock.now = ended_at

    record = backend.executions.get("order-42")
    assert (record.status, record.due_at, record.unacknowledged_deliveries) == ("admitted", admitted_at - 7, 1)
    assert nothing_claimable(backend, now=ended_at + default_delay(1) - 1)
    assert claim_one(backend, now=ended_at + default_delay(1)).token == 2


def test_wake_owed_after_expiry_with_an_acknowledged_suspension_before(backend, clock):
    backend.executions.admit("order-42", "charge")
    assert backend.executions.acknowledge(claim_one(backend), Suspended()) == Suspended()
    backend.executions.request_wake("order-42", clock.now + 10)
    clock.advance(10)
    old_due = clock.now
    lease = claim_one(backend, duration=100)
    backend.executions.request_wake("order-42", clock.now + 50)  # during the delivery

    clock.now = lease.expires_at
    record = backend.executions.get("order-42")
    assert (record.status, record.unacknowledged_deliveries) == ("suspended", 1)
    assert record.due_at == old_due  # the earliest of the old due time and the delivery's wakes
    assert claim_one(backend, now=lease.expires_at + default_delay(1)).token == 3


@pytest.mark.parametrize("outcome", [Completed('{"paid": true}'), Failed('{"type": "CardDeclined"}')],
                         ids=["completed", "failed"])
def test_terminal_executions_ignore_wakes(backend, clock, each_backend, db_snapshot, outcome):
    backend.executions.admit("order-42", "charge")
    assert backend.executions.acknowledge(claim_one(backend), outcome) == outcome
    record = backend.executions.get("order-42")
    before = db_snapshot(each_backend)
    clock.advance(10)

    assert backend.executions.request_wake("order-42", clock.now) is None
    backend.executions.request_wake("order-42", clock.now - 1_000)

    assert db_snapshot(each_backend) == before
    assert backend.executions.get("order-42") == record
    assert record.status == outcome.status
    assert (record.result_json, record.error_json) == (
        (outcome.result_json, None) if isinstance(outcome, Completed) else (None, outcome.error_json))
    assert record.due_at is None
    assert nothing_claimable(backend, now=clock.now + 10**9)


def test_admit_creates_an_admitted_execution_due_now_with_token_zero(backend, clock):
    record = backend.executions.admit("order-42", "charge", '{"amount": 5}')
    assert record == ExecutionRecord(
        execution_id="order-42", workflow="charge", input_json='{"amount": 5}', status="admitted", token=0,
        due_at=clock.now, lease_expires_at=None, unacknowledged_deliveries=0, result_json=None,
        error_json=None, created_at=clock.now, updated_at=clock.now,
    )
    assert backend.executions.get("order-42") == record
    assert backend.executions.admit("no-input", "charge").input_json == "null"


def test_admit_again_with_the_same_workflow_and_input_returns_the_stored_record_unchanged(
        backend, clock, each_backend, db_snapshot):
    backend.executions.admit("order-42", "charge", '{"amount": 5, "currency": "EUR"}')
    lease = claim_one(backend)
    stored = backend.executions.get("order-42")
    before = db_snapshot(each_backend)
    clock.advance(10)

    again = backend.executions.admit("order-42", "charge", '{"amount": 5, "currency": "EUR"}')
    # The same JSON value spelt differently is the same input.
    respelt = backend.executions.admit("order-42", "charge", '{"currency":"EUR","amount":5}')

    assert again == respelt == stored
    assert (again.status, again.token, again.input_json) == ("running", 1, '{"amount": 5, "currency": "EUR"}')
    assert db_snapshot(each_backend) == before
    assert backend.executions.renew(lease, duration=LEASE_MS).status == "renewed"


@pytest.mark.parametrize("workflow, input_json", [("refund", '{"amount": 5}'), ("charge", '{"amount": 6}'),
                                                  ("charge", "null")])
def test_admit_again_with_a_different_workflow_or_input_raises_execution_conflict(
        backend, each_backend, db_snapshot, workflow, input_json):
    backend.executions.admit("order-42", "charge", '{"amount": 5}')
    before = db_snapshot(each_backend)

    with pytest.raises(ExecutionConflict) as raised:
        backend.executions.admit("order-42", workflow, input_json)

    assert isinstance(raised.value, ValueError)
    assert "order-42" in str(raised.value)
    assert db_snapshot(each_backend) == before


def test_an_id_of_exactly_255_characters_is_accepted(backend):
    long_id = "é" * 255
    assert backend.executions.admit(long_id, "charge").execution_id == long_id
    assert backend.executions.get(long_id).execution_id == long_id


# -- heap ------------------------------------------------------------------------------------


def test_write_step_after_a_redelivery_returns_the_value_recorded_by_the_earlier_delivery(backend, clock):
    backend.executions.admit("order-42", "charge")
    first = claim_one(backend)
    recorded = backend.heap.write_step(first, step_key="charge", step_attempt=0, done=True,
                                       step_response_json='"ch_1"')
    assert backend.executions.release(first) == Released()
    clock.advance(default_delay(1))
    second = claim_one(backend)

    replay = backend.heap.write_step(second, step_key="charge", step_attempt=0, done=True,
                                     step_response_json='"ch_2"')

    assert replay == recorded == HeapRecord("order-42", "charge", 0, True, '"ch_1"')
    assert backend.heap.steps("order-42") == [recorded]


def test_read_step_returns_the_highest_attempt(backend):
    backend.executions.admit("order-42", "charge")
    lease = claim_one(backend)
    assert backend.heap.read_step("order-42", "charge") is None
    for attempt, done in ((0, False), (2, True), (1, False)):
        backend.heap.write_step(lease, step_key="charge", step_attempt=attempt, done=done,
                                step_response_json=f'{{"attempt": {attempt}}}')
    backend.heap.write_step(lease, step_key="other", step_attempt=7, done=True, step_response_json="7")

    assert backend.heap.read_step("order-42", "charge") == HeapRecord("order-42", "charge", 2, True, '{"attempt": 2}')
    assert backend.heap.read_step("order-42", "other").attempt == 7
    assert backend.heap.read_step("order-42", "missing") is None
    assert backend.heap.read_step("nobody", "charge") is None
    assert [(s.step_key, s.attempt) for s in backend.heap.steps("order-42")] == [
        ("charge", 0), ("charge", 2), ("charge", 1), ("other", 7)]


def test_write_step_after_the_holder_acknowledged_returns_lost(backend, each_backend, db_snapshot):
    backend.executions.admit("order-42", "charge")
    lease = claim_one(backend)
    backend.heap.write_step(lease, step_key="a", step_attempt=0, done=True, step_response_json="1")
    assert backend.executions.acknowledge(lease, Suspended()) == Suspended()
    before = db_snapshot(each_backend)

    # Ended by the holder's own acknowledgement: even the same token is no longer current.
    assert backend.heap.write_step(lease, step_key="a", step_attempt=0, done=True, step_response_json="1") == LeaseLost()
    assert backend.heap.write_step(lease, step_key="b", step_attempt=0, done=True, step_response_json="1") == LeaseLost()
    assert db_snapshot(each_backend) == before


def test_an_expired_lease_nobody_claimed_since_still_holds_the_current_token(backend, clock):
    backend.executions.admit("order-42", "charge")
    lease = claim_one(backend, duration=100)
    clock.now = lease.expires_at + default_delay(1) + 50  # claimable, but nobody claims

    written = backend.heap.write_step(lease, step_key="charge", step_attempt=0, done=True,
                                      step_response_json='"ch_1"')
    assert written.status == "written"
    renewed = backend.executions.renew(lease, duration=100)
    assert renewed == Renewed(ExecutionLease("order-42", 1, clock.now + 100))
    record = backend.executions.get("order-42")
    assert (record.status, record.unacknowledged_deliveries) == ("running", 0)
    assert nothing_claimable(backend)


# -- claim order and limit -------------------------------------------------------------------


def test_claim_due_takes_the_earliest_due_at_first(backend, clock):
    start = clock.now
    for name, offset in (("late", 30), ("early", 10), ("middle", 20), ("future", 10_000)):
        backend.executions.admit(name, "w", now=start + offset)
    backend.executions.admit("woken", "w", now=start + 25)
    lease = claim_one(backend, now=start + 10)
    assert backend.executions.acknowledge(lease, Suspended(), now=start + 10) == Suspended()
    backend.executions.request_wake("early", start + 15)  # suspended, now due at +15
    backend.executions.request_wake("woken", start + 5)  # admitted at +25, woken for +5

    first = backend.executions.claim_due(limit=2, duration=LEASE_MS, now=start + 100)
    rest = backend.executions.claim_due(limit=10, duration=LEASE_MS, now=start + 100)

    assert [lease.execution_id for lease in first] == ["woken", "early"]
    assert [lease.execution_id for lease in rest] == ["middle", "late"]


def test_claim_due_respects_limit(backend, clock, each_backend, db_snapshot):
    for i in range(5):
        backend.executions.admit(f"e{i}", "w")
    before = db_snapshot(each_backend)
    assert backend.executions.claim_due(limit=0, duration=LEASE_MS) == []
    assert db_snapshot(each_backend) == before

    sizes = [len(backend.executions.claim_due(limit=2, duration=LEASE_MS)) for _ in range(4)]

    assert sizes == [2, 2, 1, 0]
    assert {r.status for r in backend.executions.list()} == {"running"}


def test_claim_due_skips_executions_not_yet_due(backend, clock):
    backend.executions.admit("later", "w", now=clock.now + 1_000)
    assert nothing_claimable(backend, now=clock.now + 999)
    assert claim_one(backend, now=clock.now + 1_000).execution_id == "later"


# -- lease history ---------------------------------------------------------------------------


def test_a_claim_of_many_executions_opens_one_delivery_in_the_history_for_each(backend, clock):
    for i in range(150):  # more than one statement's worth of history rows
        backend.executions.admit(f"order-{i}", "charge")
    leases = backend.executions.claim_due(limit=150, duration=LEASE_MS)
    assert len(leases) == 150
    for lease in leases:
        (record,) = backend.executions.history(lease.execution_id)
        assert (record.token, record.claimed_at, record.expires_at, record.ended_by) == (
            lease.token, clock.now, lease.expires_at, None)


def test_lease_history_records_acknowledged_released_expired_and_superseded_deliveries(backend, clock):
    backend.executions.admit("order-42", "charge")
    t0 = clock.now
    first = claim_one(backend, duration=100)  # token 1: expires, then superseded
    t1 = first.expires_at + default_delay(1)
    second = claim_one(backend, duration=100, now=t1)  # token 2: renewed once, then released
    renewed = backend.executions.renew(second, duration=200, now=t1 + 50)
    t2 = t1 + 60
    assert backend.executions.release(renewed.lease, now=t2) == Released()
    t3 = t2 + default_delay(2)
    third = claim_one(backend, duration=100, now=t3)  # token 3: acknowledged suspended
    assert backend.executions.acknowledge(third, Suspended(), now=t3 + 5) == Suspended()
    backend.executions.request_wake("order-42", t3 + 10)
    fourth = claim_one(backend, duration=100, now=t3 + 10)  # token 4: expired, not yet claimed again

    history = backend.executions.history("order-42", now=fourth.expires_at)
    rows = [(h.token, h.claimed_at, h.expires_at, h.renewals, h.ended_at, h.ended_by, h.outcome) for h in history]
    assert rows == [
        (1, t0, t0 + 100, 0, t0 + 100, "superseded", None),
        (2, t1, t1 + 250, 1, t2, "released", None),
        (3, t3, t3 + 100, 0, t3 + 5, "acknowledged", "suspended"),
        (4, t3 + 10, t3 + 110, 0, t3 + 110, "expired", None),
    ]
    assert all(h.execution_id == "order-42" and h.holder for h in history)
    live = backend.executions.history("order-42", now=fourth.expires_at - 1)[-1]
    assert (live.ended_at, live.ended_by) == (None, None)

    clock.now = fourth.expires_at + default_delay(1)
    fifth = claim_one(backend)
    assert backend.executions.acknowledge(fifth, Failed('"declined"')).status == "failed"
    history = backend.executions.history("order-42")
    assert [(h.token, h.ended_by, h.outcome) for h in history[3:]] == [
        (4, "superseded", None), (5, "acknowledged", "failed")]


# -- the backend itself ----------------------------------------------------------------------


def test_the_default_redelivery_delay_is_one_second_doubling_up_to_five_minutes(backend, clock):
    backend.executions.admit("order-42", "charge")
    lease = claim_one(backend)
    observed = []
    for n in range(1, 12):
        assert backend.executions.release(lease) == Released()
        released_at = clock.now
        assert nothing_claimable(backend, now=released_at + default_delay(n) - 1)
        clock.now = released_at + default_delay(n)
        lease = claim_one(backend)
        observed.append(clock.now - released_at)

    assert observed == [1000, 2000, 4000, 8000, 16000, 32000, 64000, 128000, 256000, 300000, 300000]


def durability_in_effect(backend) -> tuple:
    """What the backend's connection was told about flushing commits."""
    if isinstance(backend, SqliteBackend):
        raw = backend.connection.raw
        return raw.execute("PRAGMA synchronous").fetchone()[0], raw.execute("PRAGMA journal_mode").fetchone()[0]
    return backend.connection.execute("SHOW synchronous_commit").fetchone()


@pytest.mark.parametrize("durability, sqlite, postgres", [("normal", (1, "wal"), ("off",)),
                                                          ("full", (2, "wal"), ("on",))])
def test_both_durability_settings_run_the_whole_lifecycle(each_backend, clock, durability, sqlite, postgres):
    with open_backend(each_backend, clock=clock, durability=durability) as backend:
        assert durability_in_effect(backend) == (sqlite if isinstance(backend, SqliteBackend) else postgres)
        backend.executions.admit("order-42", "charge")
        lease = claim_one(backend)
        backend.heap.write_step(lease, step_key="charge", step_attempt=0, done=True, step_response_json='"ch"')
        assert backend.executions.acknowledge(lease, Completed('"ok"')) == Completed('"ok"')
    with open_backend(each_backend, clock=clock, durability=durability) as reopened:
        assert reopened.executions.get("order-42").status == "completed"
        assert reopened.heap.read_step("order-42", "charge").step_response_json == '"ch"'


def test_two_backends_on_the_same_file_in_one_process_see_each_others_writes(each_backend, clock):
    with open_backend(each_backend, clock=clock) as first, open_backend(each_backend, clock=clock) as second:
        first.executions.admit("order-42", "charge")
        assert second.executions.get("order-42").status == "admitted"
        lease = claim_one(second)
        assert first.executions.get("order-42").status == "running"
        assert nothing_claimable(first)
        first.heap.write_step(lease, step_key="charge", step_attempt=0, done=True, step_response_json='"ch"')
        assert second.heap.read_step("order-42", "charge").step_response_json == '"ch"'
        assert first.executions.acknowledge(lease, Completed('"ok"')) == Completed('"ok"')
        assert second.executions.acknowledge(lease, Completed('"again"')) == LeaseLost()
        assert second.executions.get("order-42").result_json == '"ok"'



# -- batched renewals (SPEC section 10) --------------------------------------------------------


def test_a_batch_of_renewals_renews_each_current_lease_and_refuses_only_the_stale_one(
        backend, clock, each_backend, db_snapshot):
    for i in range(4):
        backend.executions.admit(f"order-{i}", "charge")
    stale = backend.executions.claim_due(limit=1, duration=100)[0]
    clock.now = stale.expires_at + default_delay(1)
    leases = sorted(backend.executions.claim_due(limit=10, duration=100), key=lambda lease: lease.execution_id)
    current = next(lease for lease in leases if lease.execution_id == stale.execution_id)
    clock.now += 10

    replies = backend.executions.renew_many([leases[3], stale, leases[0], leases[1], leases[2]], duration=5_000)

    expected = [Renewed(ExecutionLease(lease.execution_id, lease.token, clock.now + 5_000)) for lease in leases]
    assert replies == [expected[3], LeaseLost(), *expected[:3]]
    assert backend.executions.get(stale.execution_id).lease_expires_at == clock.now + 5_000
    assert current.token == stale.token + 1
    for lease in leases:
        (*_, live) = backend.executions.history(lease.execution_id)
        assert (live.token, live.renewals, live.expires_at) == (lease.token, 1, clock.now + 5_000)


def test_a_batch_of_only_stale_renewals_changes_nothing(backend, clock, each_backend, db_snapshot):
    backend.executions.admit("order-42", "charge")
    stale = claim_one(backend, duration=100)
    assert backend.executions.acknowledge(stale, Suspended()) == Suspended()
    before = db_snapshot(each_backend)

    assert backend.executions.renew_many([stale, stale], duration=10_000) == [LeaseLost(), LeaseLost()]
    assert backend.executions.renew_many([], duration=10_000) == []
    assert db_snapshot(each_backend) == before


@pytest.mark.parametrize("leases, duration, now", [
    (None, 100, None), ("order-1", 100, None), ([("order-1", 1, 100)], 100, None), ([None], 100, None),
    ([], 0, None), ([], True, None), ([], 100, "now")])
def test_a_batch_of_renewals_with_bad_input_raises_and_renews_nothing(backend, each_backend, db_snapshot, leases,
                                                                      duration, now):
    backend.executions.admit("order-1", "charge")
    lease = claim_one(backend)
    before = db_snapshot(each_backend)
    with pytest.raises(ValueError):
        backend.executions.renew_many([lease, *leases] if isinstance(leases, list) else leases, duration=duration,
                                      now=now)
    assert db_snapshot(each_backend) == before


def test_a_batch_of_renewals_larger_than_one_transaction_keeps_its_order(backend, clock):
    from supervisor.ledger.tables.leases import RENEW_MANY_LEASES

    count = RENEW_MANY_LEASES + 7
    for i in range(count):
        backend.executions.admit(f"order-{i:05}", "charge")
    leases = backend.executions.claim_due(limit=count, duration=100)
    assert len(leases) == count
    replies = backend.executions.renew_many(leases[::-1], duration=1_000)
    assert [reply.lease.execution_id for reply in replies] == [lease.execution_id for lease in leases[::-1]]
    assert {reply.lease.expires_at for reply in replies} == {clock.now + 1_000}


# -- batched step writes (SPEC section 10) -----------------------------------------------------


def step(lease, key, response, *, attempt=0, done=True):
    from supervisor import StepWrite

    return StepWrite(lease, key, attempt, done, response)


def test_a_batch_of_step_writes_records_each_and_refuses_only_the_stale_one(backend, clock, each_backend):
    for i in range(3):
        backend.executions.admit(f"order-{i}", "charge")
    stale = backend.executions.claim_due(limit=1, duration=100)[0]
    clock.now = stale.expires_at + default_delay(1)
    leases = {lease.execution_id: lease for lease in backend.executions.claim_due(limit=10, duration=LEASE_MS)}
    a, b = leases["order-1"], leases["order-2"]
    writes = [step(a, "load", '"a"'), step(stale, "charge", '"stale"'), step(b, "load", '"b"'),
              step(a, "charge", '{"n": 1}', attempt=2, done=False)]

    replies = backend.heap.write_steps(writes)

    assert replies == [HeapRecord("order-1", "load", 0, True, '"a"'), LeaseLost(),
                       HeapRecord("order-2", "load", 0, True, '"b"'),
                       HeapRecord("order-1", "charge", 2, False, '{"n": 1}')]
    assert backend.heap.read_step(stale.execution_id, "charge") is None
    assert backend.heap.steps("order-1") == [replies[0], replies[3]]


def test_a_batch_of_step_writes_returns_what_is_already_recorded(backend, clock, each_backend, db_snapshot):
    backend.executions.admit("order-42", "charge")
    lease = claim_one(backend)
    first = backend.heap.write_step(lease, step_key="charge", step_attempt=0, done=True, step_response_json='"ch_1"')
    before = db_snapshot(each_backend)

    replies = backend.heap.write_steps([step(lease, "charge", '"ch_2"'), step(lease, "charge", '"ch_3"')])

    assert replies == [first, first]
    assert db_snapshot(each_backend) == before
    # Twice in one batch: written once, and both replies are the record that was written.
    both = backend.heap.write_steps([step(lease, "ship", '"x"'), step(lease, "ship", '"y"')])
    assert both[0] == both[1] == backend.heap.read_step("order-42", "ship")
    assert backend.heap.write_steps([]) == []


def test_a_batch_of_only_stale_step_writes_changes_nothing(backend, clock, each_backend, db_snapshot):
    backend.executions.admit("order-42", "charge")
    lease = claim_one(backend)
    backend.heap.write_step(lease, step_key="charge", step_attempt=0, done=True, step_response_json='"ch_1"')
    assert backend.executions.acknowledge(lease, Suspended()) == Suspended()
    before = db_snapshot(each_backend)

    assert backend.heap.write_steps([step(lease, "charge", '"ch_1"'), step(lease, "ship", '"x"')]) == [
        LeaseLost(), LeaseLost()]
    assert db_snapshot(each_backend) == before


@pytest.mark.parametrize("bad", [
    None, "charge", [None], [("lease", "charge", 0, True, '"x"')], ["lease-key", 0],
    [{"step_key": "x"}]], ids=["none", "str", "none item", "tuple item", "list item", "dict item"])
def test_a_batch_of_step_writes_with_bad_input_raises_and_writes_nothing(backend, each_backend, db_snapshot, bad):
    backend.executions.admit("order-1", "charge")
    lease = claim_one(backend)
    before = db_snapshot(each_backend)
    with pytest.raises(ValueError):
        backend.heap.write_steps([step(lease, "ok", '"x"'), *bad] if isinstance(bad, list) else bad)
    assert db_snapshot(each_backend) == before


@pytest.mark.parametrize("field, value", [
    ("step_key", ""), ("step_key", 7), ("step_attempt", -1), ("step_attempt", True), ("done", 1),
    ("step_response_json", "not json"), ("lease", None)])
def test_a_batch_of_step_writes_with_one_bad_field_raises_and_writes_nothing(backend, each_backend, db_snapshot,
                                                                             field, value):
    import dataclasses

    backend.executions.admit("order-1", "charge")
    lease = claim_one(backend)
    before = db_snapshot(each_backend)
    with pytest.raises(ValueError):
        backend.heap.write_steps([step(lease, "ok", '"x"'), dataclasses.replace(step(lease, "bad", '"y"'),
                                                                                 **{field: value})])
    assert db_snapshot(each_backend) == before


def test_a_batch_of_step_writes_larger_than_one_statement_keeps_its_order(backend, clock):
    from supervisor.ledger.tables.heap import WRITE_MANY_ROWS

    for i in range(3):
        backend.executions.admit(f"order-{i}", "charge")
    leases = backend.executions.claim_due(limit=3, duration=LEASE_MS)
    writes = [step(leases[i % 3], f"s{i}", str(i)) for i in range(WRITE_MANY_ROWS + 11)]
    replies = backend.heap.write_steps(writes)
    assert replies == [HeapRecord(w.lease.execution_id, w.step_key, 0, True, w.step_response_json) for w in writes]
