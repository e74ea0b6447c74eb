"""Group commit: `executions.acknowledge_and_claim`, several acknowledgements and a claim in one
transaction (the supervisor's batch), on both backends; and the supervisor's ledger thread,
which gathers what is queued into such batches."""

from __future__ import annotations

import re
import select
import threading
import time

import pytest

from supervisor import Completed, ExecutionLease, Failed, LeaseLost, Suspended, open_backend
from supervisor.ledger_calls import Acknowledge, Claim, LedgerCalls, NextReadyAt

LEASE_MS = 30_000


def admitted_and_claimed(backend, clock, *ids) -> list[ExecutionLease]:
    for execution_id in ids:
        backend.executions.admit(execution_id, "w")
        clock.advance(1)
    leases = backend.executions.claim_due(limit=len(ids), duration=LEASE_MS)
    assert [lease.execution_id for lease in leases] == list(ids)
    return leases


def test_a_stale_acknowledgement_in_a_batch_is_lease_lost_alone_and_the_rest_are_applied(backend, clock):
    a, c = admitted_and_claimed(backend, clock, "a", "c")
    backend.executions.admit("b", "w")
    (b,) = backend.executions.claim_due(limit=1, duration=1_000)
    clock.advance(1_000 + 1_000)  # b's short lease expires, and after the redelivery delay another holder claims b
    (b_again,) = backend.executions.claim_due(limit=10, duration=LEASE_MS)
    assert (b_again.execution_id, b_again.token) == ("b", b.token + 1)

    replies, leases = backend.executions.acknowledge_and_claim(
        [(a, Completed('"done"')), (b, Failed('{"message": "late"}')), (c, Suspended())], limit=0, duration=LEASE_MS)

    assert replies == [Completed('"done"'), LeaseLost(), Suspended()]
    assert leases == []
    assert backend.executions.get("a").status == "completed"
    assert backend.executions.get("a").result_json == '"done"'
    record = backend.executions.get("b")  # the current holder's delivery is untouched
    assert (record.status, record.token, record.error_json) == ("running", b_again.token, None)
    assert backend.executions.get("c").status == "suspended"
    assert backend.executions.acknowledge(b_again, Completed("1")) == Completed("1")


def test_the_claim_in_a_batch_takes_the_due_executions_once_the_acknowledgements_are_applied(backend, clock):
    (parent,) = admitted_and_claimed(backend, clock, "parent")
    (child,) = admitted_and_claimed(backend, clock, "child")
    backend.executions.await_outcome("child", "parent")
    backend.executions.acknowledge(parent, Suspended())
    backend.executions.admit("next", "w")

    # The child's ending wakes its parent in the same transaction, so the claim sees it due.
    replies, leases = backend.executions.acknowledge_and_claim(
        [(child, Completed("42"))], limit=5, duration=LEASE_MS)

    assert replies == [Completed("42")]
    assert sorted(lease.execution_id for lease in leases) == ["next", "parent"]
    by_id = {lease.execution_id: lease for lease in leases}
    assert by_id["parent"].token == parent.token + 1
    assert by_id["next"].expires_at == clock.now + LEASE_MS
    for lease in leases:
        record = backend.executions.get(lease.execution_id)
        assert (record.status, record.token) == ("running", lease.token)
    assert backend.executions.claim_due(limit=5, duration=LEASE_MS) == []


def test_a_batch_records_each_ending_in_the_history_and_wakes_the_waiters_of_the_executions_it_ends(
        backend, clock):
    parents = admitted_and_claimed(backend, clock, "p1", "p2", "p3")
    children = admitted_and_claimed(backend, clock, "c1", "c2", "c3")
    for parent, child in zip(parents, children):
        backend.executions.await_outcome(child.execution_id, parent.execution_id)
        backend.executions.acknowledge(parent, Suspended())

    replies, leases = backend.executions.acknowledge_and_claim(
        [(children[0], Completed("1")), (children[1], Failed('{"type": "E"}')), (children[2], Suspended())],
        limit=5, duration=LEASE_MS)

    assert replies == [Completed("1"), Failed('{"type": "E"}'), Suspended()]
    assert sorted(lease.execution_id for lease in leases) == ["p1", "p2"]  # c3 only suspended: p3 waits on
    assert backend.executions.waiting_for("p3")[0].kind == "execution"
    ended = [backend.executions.history(child.execution_id)[-1] for child in children]
    assert [(r.token, r.ended_at, r.ended_by, r.outcome) for r in ended] == [
        (child.token, clock.now, "acknowledged", outcome) for child, outcome in zip(
            children, ("completed", "failed", "suspended"))]


def test_a_claim_limit_in_a_batch_is_honoured_oldest_first(backend, clock):
    for execution_id in ("x1", "x2", "x3"):
        backend.executions.admit(execution_id, "w")
        clock.advance(1)
    replies, leases = backend.executions.acknowledge_and_claim([], limit=2, duration=LEASE_MS)
    assert replies == []
    assert [lease.execution_id for lease in leases] == ["x1", "x2"]
    assert backend.executions.get("x3").status == "admitted"


def test_the_same_lease_twice_in_a_batch_is_applied_once(backend, clock):
    (lease,) = admitted_and_claimed(backend, clock, "twice")
    replies, _ = backend.executions.acknowledge_and_claim(
        [(lease, Completed("1")), (lease, Completed("2"))], limit=0, duration=LEASE_MS)
    assert replies == [Completed("1"), LeaseLost()]
    assert backend.executions.get("twice").result_json == "1"


def test_a_batch_of_more_acknowledgements_than_one_statement_takes_fences_each_by_its_own_token(backend, clock):
    """70 acknowledgements (more than PostgreSQL's one statement takes, and than one history
    statement ends): every 10th is stale, one current lease comes twice, and the replies, rows and
    history are each acknowledgement's own, in the order given."""
    ids = [f"e{i:02}" for i in range(70)]
    leases = admitted_and_claimed(backend, clock, *ids)
    stale = [ExecutionLease(lease.execution_id, lease.token - 1, lease.expires_at) for lease in leases[::10]]
    outcomes = {lease.execution_id: (Completed(str(i)) if i % 3 else Failed(f'{{"n": {i}}}') if i % 2 else Suspended())
                for i, lease in enumerate(leases)}
    batch = [(lease, outcomes[lease.execution_id]) for lease in leases[1:]]
    batch[40:40] = [(lease, Completed('"stale"')) for lease in stale]  # token 0 of e00, e10, ...
    batch.append((leases[5], Completed('"again"')))
    batch.insert(0, (leases[0], outcomes["e00"]))
    clock.advance(7)

    replies, claimed = backend.executions.acknowledge_and_claim(batch, limit=0, duration=LEASE_MS)

    assert claimed == []
    expected = [LeaseLost() if lease.token == 0 or (lease == leases[5] and outcome == Completed('"again"'))
                else outcome for lease, outcome in batch]
    assert replies == expected
    for i, lease in enumerate(leases):
        record = backend.executions.get(lease.execution_id)
        outcome = outcomes[lease.execution_id]
        assert (record.status, record.token) == (outcome.status, lease.token)
        assert record.result_json == getattr(outcome, "result_json", None)
        assert record.error_json == getattr(outcome, "error_json", None)
        (history,) = backend.executions.history(lease.execution_id)
        assert (history.ended_at, history.ended_by, history.outcome) == (clock.now, "acknowledged", outcome.status)


@pytest.mark.parametrize("bad, message", [
    ("not pairs", "acknowledgements must be a sequence of (lease, outcome) pairs"),
    ("a lone lease", "acknowledgements[2] must be a (lease, outcome) pair"),
    ("third outcome bad", "outcome must be Suspended(), Completed(result_json) or Failed(error_json)"),
    ("bad json", "outcome.result_json"),
    ("negative limit", "limit"),
    ("zero duration", "duration"),
    ("a fractional token", "lease must hold a str execution_id and a 64-bit int token"),
    ("a token beyond 64 bits", "lease must hold a str execution_id and a 64-bit int token"),
    ("an int id", "lease must hold a str execution_id"),
])
def test_bad_input_to_a_batch_is_a_value_error_and_changes_nothing(
        backend, clock, each_backend, db_snapshot, bad, message):
    one, two, three = admitted_and_claimed(backend, clock, "one", "two", "three")
    backend.executions.admit("waiting", "w")
    good = [(one, Completed("1")), (two, Suspended())]
    acknowledgements, limit, duration = {
        "not pairs": ("not pairs", 1, LEASE_MS),
        "a lone lease": (good + [(three,)], 1, LEASE_MS),
        "third outcome bad": (good + [(three, "done")], 1, LEASE_MS),
        "bad json": (good + [(three, Completed("{not json"))], 1, LEASE_MS),
        "negative limit": (good, -1, LEASE_MS),
        "zero duration": (good, 1, 0),
        "a fractional token": (good + [(ExecutionLease("three", 0.5, three.expires_at), Completed("3"))], 1, LEASE_MS),
        "a token beyond 64 bits": (good + [(ExecutionLease("three", 2**63, three.expires_at), Completed("3"))], 1,
                                   LEASE_MS),
        "an int id": (good + [(ExecutionLease(3, three.token, three.expires_at), Completed("3"))], 1, LEASE_MS),
    }[bad]
    before = db_snapshot(each_backend)
    with pytest.raises(ValueError, match=re.escape(message)):
        backend.executions.acknowledge_and_claim(acknowledgements, limit=limit, duration=duration)
    assert db_snapshot(each_backend) == before


def test_a_claim_limit_beyond_32_bits_claims_every_due_execution(backend, clock):
    admitted_and_claimed(backend, clock, "held")
    for execution_id in ("x1", "x2"):
        backend.executions.admit(execution_id, "w")
    assert [lease.execution_id for lease in backend.executions.claim_due(limit=2**40, duration=LEASE_MS)] == [
        "x1", "x2"]
    backend.executions.admit("x3", "w")
    _, leases = backend.executions.acknowledge_and_claim([], limit=2**40, duration=LEASE_MS)
    assert [lease.execution_id for lease in leases] == ["x3"]


# -- the supervisor's ledger thread --------------------------------------------------------------

def replies_of(calls: LedgerCalls, count: int, timeout: float = 10.0) -> list:
    """The next `count` replies of the ledger thread, in order, waiting for them until `timeout`."""
    replies, deadline = [], time.monotonic() + timeout
    while len(replies) < count:
        assert time.monotonic() < deadline, f"{len(replies)} of {count} replies after {timeout} s"
        if select.select([calls], [], [], 0.1)[0]:
            calls.drain()
        replies.extend(calls.replies())
    return replies


def test_the_ledger_thread_makes_what_is_queued_behind_a_slow_call_in_one_transaction(each_backend):
    with open_backend(each_backend) as setup:
        for n in range(5):
            setup.executions.admit(f"e{n}", "w")
        leases = setup.executions.claim_due(limit=4, duration=LEASE_MS)
    calls = LedgerCalls(open_backend(each_backend), "test-batches")
    executions = calls.backend.executions
    batches, release = [], threading.Event()
    first_call_started = threading.Event()
    real_acknowledge, real_batch = executions.acknowledge, executions.acknowledge_and_claim_deliveries

    def slow_acknowledge(*args, **kwargs):  # the first call stands for a slow round trip
        first_call_started.set()
        assert release.wait(10)
        return real_acknowledge(*args, **kwargs)

    def counted_batch(acknowledgements, **kwargs):
        batches.append((len(acknowledgements), kwargs["limit"]))
        return real_batch(acknowledgements, **kwargs)

    executions.acknowledge, executions.acknowledge_and_claim_deliveries = slow_acknowledge, counted_batch
    try:
        calls.submit(Acknowledge(leases[0], Completed("0")))
        assert first_call_started.wait(10)
        for lease in leases[1:]:
            calls.submit(Acknowledge(lease, Completed("1")))
        calls.submit(Claim(1, LEASE_MS))
        calls.submit(Claim(3, LEASE_MS))
        release.set()
        replies = replies_of(calls, 6)
    finally:
        release.set()
        assert calls.close()

    assert batches == [(3, 4)]  # three acknowledgements and both claims: one transaction
    assert [reply.error for reply in replies] == [None] * 6
    assert [reply.value for reply in replies[:4]] == [Completed("0")] + [Completed("1")] * 3
    first_claim, second_claim = replies[4].value, replies[5].value
    assert len(first_claim) == 1 and second_claim == []  # each claim gets leases up to its own limit
    assert first_claim[0].lease.execution_id == "e4"
    with open_backend(each_backend) as check:
        assert [check.executions.get(f"e{n}").status for n in range(5)] == ["completed"] * 4 + ["running"]


def test_the_ledger_thread_never_batches_a_call_made_as_of_a_given_time(each_backend, clock):
    with open_backend(each_backend, clock=clock) as setup:
        setup.executions.admit("e", "w")
    calls = LedgerCalls(open_backend(each_backend, clock=clock), "test-batches")
    batches = []
    real_batch = calls.backend.executions.acknowledge_and_claim_deliveries
    calls.backend.executions.acknowledge_and_claim_deliveries = lambda *a, **k: batches.append(a) or real_batch(*a, **k)
    try:
        calls.submit(Claim(1, LEASE_MS, now=clock.now))
        calls.submit(Claim(1, LEASE_MS, now=clock.now))
        replies = replies_of(calls, 2)
    finally:
        assert calls.close()
    assert batches == []
    assert [len(reply.value) for reply in replies] == [1, 0]


def test_calls_gathered_in_one_turn_of_the_loop_reach_the_thread_together(each_backend):
    with open_backend(each_backend) as setup:
        for n in range(4):
            setup.executions.admit(f"e{n}", "w")
        leases = setup.executions.claim_due(limit=3, duration=LEASE_MS)
    calls = LedgerCalls(open_backend(each_backend), "test-batches", gathering=True)
    batches = []
    real_batch = calls.backend.executions.acknowledge_and_claim_deliveries
    calls.backend.executions.acknowledge_and_claim_deliveries = lambda a, **k: batches.append((len(a), k["limit"])) or \
        real_batch(a, **k)
    try:
        for lease in leases:
            calls.submit(Acknowledge(lease, Suspended()))
        calls.submit(Claim(3, LEASE_MS))
        assert calls.pending == 4
        calls.flush()
        replies = replies_of(calls, 4)
    finally:
        assert calls.close()
    assert batches == [(3, 3)]
    assert [reply.value for reply in replies[:3]] == [Suspended()] * 3
    assert [claimed.lease.execution_id for claimed in replies[3].value] == ["e3"]


def test_a_timed_call_brings_the_ledgers_time_read_on_the_ledger_thread(each_backend, clock):
    # The supervisor's loop never reads the ledger's clock itself: on PostgreSQL that is a round
    # trip, which must not hold up its heartbeats. A timed call brings the time with its reply.
    with open_backend(each_backend, clock=clock) as setup:
        setup.executions.admit("later", "w", now=clock.now + 5_000)
    calls = LedgerCalls(open_backend(each_backend, clock=clock), "test-timed")
    try:
        calls.submit(NextReadyAt(timed=True))
        calls.submit(NextReadyAt())
        timed, untimed = replies_of(calls, 2)
    finally:
        assert calls.close()
    assert (timed.value, timed.clock_ms) == (clock.now + 5_000, clock.now)
    assert (untimed.value, untimed.clock_ms) == (clock.now + 5_000, None)


def test_a_first_delivery_is_claimed_with_its_workflow_and_input_and_a_later_one_without_its_input(backend, clock):
    """`claim_deliveries` and the batch give a worker what it needs to start a first delivery
    without reading the ledger; a later delivery (steps may be recorded) gets no input, and its
    worker reads the execution and its steps."""
    backend.executions.admit("a", "wf-a", '{"n": 1}')
    backend.executions.admit("b", "wf-b", '[2]')
    clock.advance(1)
    (a,) = backend.executions.claim_deliveries(limit=1, duration=LEASE_MS)
    assert (a.lease.execution_id, a.lease.token, a.workflow, a.input_json) == ("a", 1, "wf-a", '{"n": 1}')
    assert a.lease.expires_at == clock.now + LEASE_MS
    backend.heap.write_step(a.lease, step_key="s", step_attempt=1, done=True, step_response_json="1")
    backend.executions.release(a.lease)
    clock.advance(60_000)  # past the redelivery delay

    replies, claimed = backend.executions.acknowledge_and_claim_deliveries([], limit=2, duration=LEASE_MS)
    assert replies == []
    by_id = {each.lease.execution_id: each for each in claimed}
    assert (by_id["a"].lease.token, by_id["a"].workflow, by_id["a"].input_json) == (2, "wf-a", None)
    assert (by_id["b"].lease.token, by_id["b"].workflow, by_id["b"].input_json) == (1, "wf-b", "[2]")
    assert [step.step_key for step in backend.heap.steps("a")] == ["s"]  # what the second delivery reads


@pytest.mark.timeout(60)
def test_a_claim_says_each_executions_queue_and_when_it_became_due(backend, clock):
    """For the supervisor's claim-delay histogram (SPEC section 13): both backends give the
    queue and the due time as the claim found them, alone and in a batch."""
    backend.executions.admit("early", "w", queue="billing")
    clock.advance(250)
    backend.executions.admit("late", "w")
    due = {"early": clock.now - 250, "late": clock.now}
    clock.advance(1_000)
    (early,) = backend.executions.claim_deliveries(limit=1, duration=LEASE_MS)
    assert (early.lease.execution_id, early.queue, early.due_at) == ("early", "billing", due["early"])
    assert early.lease.expires_at - LEASE_MS - early.due_at == 1_250  # the claim delay
    clock.advance(1_000)
    replies, (late,) = backend.executions.acknowledge_and_claim_deliveries(
        [(early.lease, Completed("1"))], limit=5, duration=LEASE_MS)
    assert replies == [Completed("1")]
    assert (late.lease.execution_id, late.queue, late.due_at) == ("late", "default", due["late"])
    assert late.lease.expires_at - LEASE_MS - late.due_at == 2_000
    # A delivery again after its lease ran out was due since that lease's expiry, not since the
    # execution's first due time.
    clock.advance(LEASE_MS + 60_000)  # the lease runs out, and the redelivery delay passes
    (again,) = backend.executions.claim_deliveries(limit=1, duration=LEASE_MS)
    assert (again.lease.execution_id, again.lease.token, again.due_at) == ("late", 2, late.lease.expires_at)
