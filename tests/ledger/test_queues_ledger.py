"""Queues and priority in the ledger (SPEC section 12), on each backend: the claim's order (priority,
then due time), and each queue limit (concurrency, per_key, rate) held by the claim itself; bad
input refused with the ledger unchanged; several processes claiming at once never exceed a limit,
as the lease history shows."""

from __future__ import annotations

import faulthandler
import json
import multiprocessing
import os
import time

import psutil
import pytest

from supervisor import (Completed, ExecutionConflict, ExecutionLease, InvalidArgument, LeaseLost, Released, Renewed,
                        open_backend)

LEASE_MS = 30_000


def claim_ids(backend, *, limit=10, now=None, workflows=None) -> list[str]:
    return [lease.execution_id for lease in
            backend.executions.claim_due(limit=limit, duration=LEASE_MS, now=now, workflows=workflows)]


def claim_leases(backend, *, limit=10, now=None):
    return backend.executions.claim_due(limit=limit, duration=LEASE_MS, now=now)


@pytest.mark.timeout(60)
def test_admit_records_queue_key_and_priority_and_a_repeat_with_others_conflicts(backend):
    record = backend.executions.admit("a", "wf", queue="email", key="user-1", priority=3)
    assert (record.queue, record.key, record.priority) == ("email", "user-1", 3)
    assert backend.executions.get("a") == record
    assert backend.executions.admit("a", "wf", queue="email", key="user-1", priority=3) == record
    for other in ({"queue": "default", "key": "user-1", "priority": 3}, {"queue": "email", "key": None, "priority": 3},
                  {"queue": "email", "key": "user-1", "priority": 0}):
        with pytest.raises(ExecutionConflict, match="queue"):
            backend.executions.admit("a", "wf", **other)
    plain = backend.executions.admit("b", "wf")
    assert (plain.queue, plain.key, plain.priority) == ("default", None, 0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("routed", [False, True])
def test_higher_priority_is_claimed_first_then_earliest_due(backend, clock, routed):
    workflows = {"wf", "other"} if routed else None
    backend.executions.admit("low-early", "wf", priority=0)
    clock.advance(1)
    backend.executions.admit("high-late", "wf", priority=5)
    clock.advance(1)
    backend.executions.admit("high-later", "other", queue="q2", priority=5)
    clock.advance(1)
    backend.executions.admit("negative", "wf", priority=-1)
    clock.advance(1)
    backend.executions.admit("mid", "other", queue="q2", priority=1)
    clock.advance(1)
    order = [claim_ids(backend, limit=1, workflows=workflows) for _ in range(5)]
    assert order == [["high-late"], ["high-later"], ["mid"], ["low-early"], ["negative"]]


@pytest.mark.timeout(60)
def test_a_claim_returns_its_leases_in_priority_order(backend, clock):
    backend.executions.admit("a", "wf", priority=0)
    clock.advance(1)
    backend.executions.admit("b", "wf", priority=2)
    clock.advance(1)
    backend.executions.admit("c", "wf", priority=1)
    assert claim_ids(backend, limit=2) == ["b", "c"]
    assert claim_ids(backend) == ["a"]


@pytest.mark.timeout(60)
def test_concurrency_limit_refuses_claims_beyond_it_until_a_lease_ends_or_expires(backend, clock):
    backend.queues.declare("q", concurrency=2)
    for i in range(6):
        backend.executions.admit(f"q-{i}", "wf", queue="q")
    backend.executions.admit("free", "wf")
    first = claim_leases(backend)
    assert sorted(lease.execution_id for lease in first) == ["free", "q-0", "q-1"]
    assert claim_ids(backend) == []
    by_id = {lease.execution_id: lease for lease in first}
    # An acknowledgement frees a slot, a release another.
    assert backend.executions.acknowledge(by_id["q-0"], Completed("null")) == Completed("null")
    assert claim_ids(backend) == ["q-2"]
    assert backend.executions.release(by_id["q-1"]) == Released()
    assert claim_ids(backend) == ["q-3"]  # q-1 waits out its redelivery delay
    assert claim_ids(backend) == []
    # A lease of a dead holder counts until it expires; then its slot is free.
    expires = max(lease.expires_at for lease in first)
    assert claim_ids(backend, now=expires - 1) == []
    assert sorted(claim_ids(backend, now=expires + 1)) == ["q-1", "q-4"]  # earliest due: q-1, released
    assert backend.executions.get("q-2", now=expires + 1).status == "admitted"


@pytest.mark.timeout(60)
def test_an_expired_lease_of_a_limited_queue_is_not_revived_by_a_late_renewal(backend, clock):
    backend.queues.declare("q", concurrency=1)
    backend.executions.admit("first", "wf", queue="q")
    backend.executions.admit("second", "wf", queue="q")
    backend.executions.admit("free", "wf")
    leases = {lease.execution_id: lease for lease in claim_leases(backend)}
    assert sorted(leases) == ["first", "free"]
    late = leases["first"].expires_at + 1
    assert claim_ids(backend, now=late) == ["second"]  # the expired lease's slot
    # Renewing it now would make two live leases of a queue of one: it is lost.
    assert backend.executions.renew(leases["first"], duration=LEASE_MS, now=late) == LeaseLost()
    assert backend.executions.renew_many([leases["first"]], duration=LEASE_MS, now=late) == [LeaseLost()]
    # In an unlimited queue, an expired lease nobody claimed since is still current.
    renewed = backend.executions.renew(leases["free"], duration=LEASE_MS, now=late)
    assert isinstance(renewed, Renewed)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("limit", [{"concurrency": 1}, {"per_key": 1}])
def test_a_claim_that_counted_an_expired_lease_free_ends_it_whatever_the_holders_clock(backend, clock, limit):
    """A claimer whose clock runs ahead counts a lease expired that its holder, whose clock runs
    behind, still sees live: the claim ends it, so the holder's renewal, writes and
    acknowledgement are refused, and the queue never holds two live leases."""
    backend.queues.declare("q", **limit)
    backend.executions.admit("first", "wf", queue="q", key="red")
    backend.executions.admit("second", "wf", queue="q", key="red")
    (first,) = claim_leases(backend, limit=1)
    ahead = first.expires_at + 1  # the claimer's clock; the lease's redelivery delay not yet passed
    assert claim_ids(backend, now=ahead) == ["second"]
    behind = first.expires_at - 10  # the holder's clock: its lease has 10 ms left
    assert backend.executions.renew(first, duration=LEASE_MS, now=behind) == LeaseLost()
    assert backend.executions.renew_many([first], duration=LEASE_MS, now=behind) == [LeaseLost()]
    clock.now = behind
    written = backend.heap.write_step(first, step_key="late", step_attempt=1, done=True, step_response_json="1")
    assert written == LeaseLost()
    assert backend.executions.acknowledge(first, Completed('"done"'), now=behind) == LeaseLost()
    record = backend.executions.get("first", now=ahead)
    assert (record.status, record.token, record.unacknowledged_deliveries) == ("admitted", 1, 1)
    (ended,) = backend.executions.history("first", now=ahead)
    assert (ended.ended_by, ended.ended_at) == ("expired", first.expires_at)
    assert backend.heap.steps("first") == []
    # Claimed again once the slot is free, as an expired lease would have been, with the next token.
    (second,) = backend.executions.history("second", now=ahead)
    backend.executions.acknowledge(ExecutionLease("second", second.token, second.expires_at), Completed("null"),
                                   now=ahead + 1)
    (again,) = claim_leases(backend, now=ahead + 10 * LEASE_MS)
    assert (again.execution_id, again.token) == ("first", 2)


@pytest.mark.timeout(60)
def test_a_saturated_queue_does_not_hold_up_other_queues(backend, clock):
    backend.queues.declare("slow", concurrency=1)
    for i in range(20):
        backend.executions.admit(f"slow-{i}", "wf", queue="slow", priority=9)
    clock.advance(1)
    for i in range(3):
        backend.executions.admit(f"fast-{i}", "wf", queue="fast")
    assert claim_ids(backend, limit=1) == ["slow-0"]
    assert claim_ids(backend, limit=1) == ["fast-0"]
    assert claim_ids(backend, limit=1, workflows={"wf"}) == ["fast-1"]


@pytest.mark.timeout(60)
def test_per_key_limit_counts_live_leases_per_key_and_ignores_executions_without_one(backend, clock):
    backend.queues.declare("k", per_key=1)
    for name, key in [("a-1", "A"), ("a-2", "A"), ("b-1", "B"), ("n-1", None), ("n-2", None), ("b-2", "B")]:
        backend.executions.admit(name, "wf", queue="k", key=key)
        clock.advance(1)
    leases = {lease.execution_id: lease for lease in claim_leases(backend)}
    assert sorted(leases) == ["a-1", "b-1", "n-1", "n-2"]
    assert claim_ids(backend) == []
    backend.executions.acknowledge(leases["a-1"], Completed("null"))
    assert claim_ids(backend) == ["a-2"]


@pytest.mark.timeout(60)
def test_rate_limit_holds_in_every_window(backend, clock):
    backend.queues.declare("r", rate=(2, 1.0))
    for i in range(7):
        backend.executions.admit(f"r-{i}", "wf", queue="r")
    start = clock.now
    first = claim_leases(backend, now=start)
    assert len(first) == 2
    for lease in first:
        backend.executions.acknowledge(lease, Completed("null"), now=start)
    assert claim_ids(backend, now=start + 999) == []
    assert len(claim_ids(backend, limit=1, now=start + 1000)) == 1
    assert len(claim_ids(backend, now=start + 1500)) == 1  # the window (500, 1500] held one
    assert claim_ids(backend, now=start + 1999) == []  # (999, 1999] holds two
    assert len(claim_ids(backend, now=start + 2000)) == 1  # (1000, 2000]: the one at 1500
    assert claim_ids(backend, now=start + 2000) == []


@pytest.mark.timeout(60)
def test_limits_combine_and_queues_list_shows_them_with_counts(backend, clock):
    backend.queues.declare("email", concurrency=3, per_key=1, rate=(10, 2.5))
    backend.executions.admit("e-1", "wf", queue="email", key="x")
    backend.executions.admit("e-2", "wf", queue="email", key="x")
    backend.executions.admit("e-3", "wf", queue="email", key="y")
    backend.executions.admit("later", "wf", now=clock.now + 60_000)  # not due yet
    assert sorted(claim_ids(backend)) == ["e-1", "e-3"]
    listed = {record.name: record for record in backend.queues.list()}
    assert set(listed) == {"default", "email"}
    email = listed["email"]
    assert (email.concurrency, email.per_key, email.rate) == (3, 1, (10, 2.5))
    assert (email.due, email.running, email.waiting) == (1, 2, 0)
    default = listed["default"]
    assert (default.concurrency, default.due, default.running) == (None, 0, 0)
    backend.queues.declare("email")  # no limits: unlimited
    assert claim_ids(backend) == ["e-2"]
    assert {r.name: r.concurrency for r in backend.queues.list()}["email"] is None


@pytest.mark.timeout(60)
@pytest.mark.parametrize("call, match", [
    (lambda b: b.queues.declare("q", concurrency=0), "concurrency"),
    (lambda b: b.queues.declare("q", concurrency=1.5), "concurrency"),
    (lambda b: b.queues.declare("q", per_key=-1), "per_key"),
    (lambda b: b.queues.declare("q", rate=(0, 1.0)), "rate"),
    (lambda b: b.queues.declare("q", rate=(1, 0)), "rate"),
    (lambda b: b.queues.declare("q", rate=(1, float("nan"))), "rate"),
    (lambda b: b.queues.declare("q", rate=5), "rate"),
    (lambda b: b.queues.declare("", concurrency=1), "name"),
    (lambda b: b.executions.admit("x", "wf", queue=""), "queue"),
    (lambda b: b.executions.admit("x", "wf", queue=3), "queue"),
    (lambda b: b.executions.admit("x", "wf", key=""), "key"),
    (lambda b: b.executions.admit("x", "wf", priority=1.0), "priority"),
    (lambda b: b.executions.admit("x", "wf", priority=2 ** 40), "priority"),
    (lambda b: b.queues.record_defaults({"wf": ("q", "high")}), "priority"),
])
def test_bad_queue_input_is_refused_and_changes_nothing(each_backend, clock, db_snapshot, call, match):
    with open_backend(each_backend, clock=clock) as backend:
        backend.queues.declare("q", concurrency=2)
        before = db_snapshot(each_backend)
        with pytest.raises(InvalidArgument, match=match):
            call(backend)
        assert db_snapshot(each_backend) == before


@pytest.mark.timeout(60)
def test_a_child_start_takes_its_workflows_recorded_default_queue(backend):
    backend.queues.record_defaults({"child": ("slow", 4)})
    backend.starts.start("s-1", "child")
    backend.starts.start("s-2", "plain")
    assert (backend.executions.get("s-1").queue, backend.executions.get("s-1").priority) == ("slow", 4)
    assert backend.executions.get("s-2").queue == "default"
    assert backend.queues.defaults_of("child") == ("slow", 4)
    assert backend.queues.defaults_of("plain") == ("default", 0)


@pytest.mark.timeout(60)
def test_a_start_made_before_any_record_of_the_defaults_takes_them_when_they_are_recorded(backend, clock):
    left = backend.executions.admit("left", "wf", queue=None, priority=None)
    named = backend.executions.admit("named", "wf", queue="mine", priority=None)
    ranked = backend.executions.admit("ranked", "wf", queue=None, priority=7)
    held = backend.executions.admit("held", "held-wf", queue=None, priority=None)
    backend.starts.start("child", "wf")
    assert [(r.queue, r.priority) for r in (left, named, ranked, held)] == [
        ("default", 0), ("mine", 0), ("default", 7), ("default", 0)]
    # A start that leaves them to the defaults accepts what the execution has.
    assert backend.executions.admit("left", "wf", queue=None, priority=None) == backend.executions.get("left")
    [lease] = backend.executions.claim_due(limit=1, duration=LEASE_MS, workflows=frozenset({"held-wf"}))
    backend.queues.record_defaults({"wf": ("narrow", 5), "held-wf": ("narrow", 5)})
    got = {eid: (backend.executions.get(eid).queue, backend.executions.get(eid).priority)
           for eid in ("left", "named", "ranked", "child", "held")}
    assert got == {"left": ("narrow", 5), "named": ("mine", 5), "ranked": ("narrow", 7), "child": ("narrow", 5),
                   "held": ("default", 0)}  # a live lease holds it where it was counted
    backend.executions.release(lease)
    backend.queues.record_defaults({"held-wf": ("narrow", 5)})
    assert (backend.executions.get("held").queue, backend.executions.get("held").priority) == ("narrow", 5)
    # Once moved, a later record of other defaults leaves them: they are the execution's own.
    backend.queues.record_defaults({"wf": ("wide", 1)})
    assert backend.executions.get("left").queue == "narrow"
    assert backend.executions.admit("late", "wf", queue=None, priority=None).queue == "wide"


def admit_leaving_defaults(ledger, count, barrier):
    with open_backend(ledger) as backend:
        barrier.wait(timeout=60)
        for i in range(count):
            backend.executions.admit(f"race-{os.getpid()}-{i}", "wf", queue=None, priority=None)


@pytest.mark.timeout(120)
def test_admits_racing_the_first_record_of_the_defaults_all_end_in_the_workflows_queue(each_backend):
    """On PostgreSQL an admit that found no defaults and a record of them take turns: no admit
    commits after the record without having seen it."""
    with open_backend(each_backend):
        pass
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(3)
    processes = [ctx.Process(target=admit_leaving_defaults, args=(str(each_backend), 150, barrier)) for _ in range(2)]
    for process in processes:
        process.start()
    try:
        with open_backend(each_backend) as backend:
            barrier.wait(timeout=60)
            while not backend.queues.list()[0].due:
                time.sleep(0.001)
            backend.queues.record_defaults({"wf": ("narrow", 2)})
            for process in processes:
                process.join(timeout=90)
            assert [process.exitcode for process in processes] == [0, 0]
            rows = backend.connection.execute("SELECT queue, priority, count(*) FROM executions GROUP BY queue,"
                                              " priority").fetchall()
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
    assert [tuple(row) for row in rows] == [("narrow", 2, 300)]


# -- several processes claiming at once ---------------------------------------------------------

LIMIT = 3
HOLD_MS = 40


def limited_claimer(ledger, index, barrier, out_path):
    """Claim from the limited queue until the backlog is done, holding each lease a moment."""
    faulthandler.dump_traceback_later(110, exit=True)
    with open_backend(ledger) as backend:
        barrier.wait(timeout=60)
        deadline = time.monotonic() + 90
        held = []
        while time.monotonic() < deadline:
            for lease in backend.executions.claim_due(limit=2, duration=60_000):
                held.append((lease, time.monotonic() + HOLD_MS / 1000))
            for lease, until in list(held):
                if time.monotonic() >= until:
                    backend.executions.acknowledge(lease, Completed("null"))
                    held.remove((lease, until))
            done = backend.queues.list()
            if not held and all(record.due == 0 and record.running == 0 for record in done):
                break
            time.sleep(0.002)
    with open(out_path, "w") as f:
        json.dump({"done": True}, f)


# The live leases of the queue as each claim's own transaction sees them, recorded by a trigger
# at every claim (a new token on a running row): exact on both backends, whatever the processes'
# clocks. (The lease history's times are each process's own estimate of the server's clock on
# PostgreSQL, a few ms apart from one process to another, so they cannot order a claim and an
# acknowledgement made in the same few ms by two processes.)
AUDIT_TABLE = "CREATE TABLE claim_audit (execution_id TEXT NOT NULL, live INTEGER NOT NULL)"
SQLITE_AUDIT = """
CREATE TRIGGER claim_audit AFTER UPDATE OF token ON executions WHEN new.status = 'running'
BEGIN INSERT INTO claim_audit SELECT new.execution_id, count(*) FROM executions
    WHERE queue = new.queue AND status = 'running' AND lease_expires_at > new.updated_at; END"""
POSTGRES_AUDIT = ["""
CREATE FUNCTION claim_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO claim_audit SELECT new.execution_id, count(*) FROM executions
        WHERE queue = new.queue AND status = 'running' AND lease_expires_at > new.updated_at;
    RETURN NULL;
END $$""", """
CREATE TRIGGER claim_audit AFTER UPDATE OF token ON executions FOR EACH ROW WHEN (new.status = 'running')
EXECUTE FUNCTION claim_audit()"""]


def add_claim_audit(backend, ledger) -> None:
    statements = [AUDIT_TABLE] + (POSTGRES_AUDIT if str(ledger).startswith("postgresql://") else [SQLITE_AUDIT])
    with backend.connection.write() as db:
        for statement in statements:
            db.execute(statement)


@pytest.mark.timeout(150)
def test_processes_claiming_at_once_never_exceed_the_concurrency_limit(each_backend, tmp_path):
    executions = 40
    with open_backend(each_backend) as backend:
        add_claim_audit(backend, each_backend)
        backend.queues.declare("narrow", concurrency=LIMIT)
        for i in range(executions):
            backend.executions.admit(f"n-{i:02d}", "wf", queue="narrow")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    processes = [ctx.Process(target=limited_claimer, args=(str(each_backend), i, barrier,
                                                            str(tmp_path / f"out-{i}.json"))) for i in range(4)]
    try:
        for process in processes:
            process.start()
        deadline = time.monotonic() + 120
        for process in processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
        assert [process.exitcode for process in processes] == [0] * 4
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
    for process in processes:
        assert not psutil.pid_exists(process.pid)
    with open_backend(each_backend) as backend:
        deliveries = [record for i in range(executions) for record in backend.executions.history(f"n-{i:02d}")]
        assert {backend.executions.get(f"n-{i:02d}").status for i in range(executions)} == {"completed"}
        audit = backend.connection.execute("SELECT execution_id, live FROM claim_audit").fetchall()
    assert len({record.holder for record in deliveries}) > 1  # they did claim at once
    assert len(audit) == len(deliveries) == executions
    assert max(live for _, live in audit) == LIMIT  # reached, never exceeded
    if not str(each_backend).startswith("postgresql://"):
        # One host's clock, read under the write lock: the history's times order every change.
        assert max_overlap(deliveries) <= LIMIT


def max_overlap(deliveries) -> int:
    """The most deliveries live at one instant: each from its claim to its end (an end at the
    instant of another's claim comes first)."""
    events = sorted([(record.ended_at, -1) for record in deliveries] + [(record.claimed_at, 1) for record in deliveries])
    live = most = 0
    for _, change in events:
        live += change
        most = max(most, live)
    return most


@pytest.mark.timeout(60)
def test_stats_oldest_due_is_the_longest_waiting_whatever_its_priority_or_its_queues_limit(backend, clock):
    backend.queues.declare("narrow", concurrency=1)
    backend.executions.admit("held", "wf", queue="narrow", now=1_000)
    backend.executions.admit("blocked", "wf", queue="narrow", now=2_000)
    backend.executions.admit("urgent", "wf", priority=9, now=3_000)
    assert [lease.execution_id for lease in backend.executions.claim_due(limit=1, duration=LEASE_MS, now=4_000)] == [
        "urgent"]
    [held] = backend.executions.claim_due(limit=1, duration=LEASE_MS, now=4_000)
    assert held.execution_id == "held"
    backend.executions.admit("late", "wf", priority=9, now=5_000)
    stats = backend.executions.stats(now=6_000)
    assert stats.oldest_due.execution_id == "blocked"  # held back by its queue, waiting since 2,000
    assert claim_ids(backend, now=6_000) == ["late"]  # what a claim takes is another
