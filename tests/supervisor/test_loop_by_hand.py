"""The dispatcher loop, driven by hand: a worker freed while a claim is in flight is claimed for
at once, by a claim of its own, and no worker is claimed for twice; a lease found lost is settled
from its worker's report when one is already waiting in the pipe, and its worker killed otherwise.
With workers of several deliveries (`--workers`): claims fill the free slots in turn up to the
concurrency, a lost lease is a `Stop` to its worker alone, and a worker found dead while being
handed deliveries has them released. Routing: workers that report different workflows are
served only what every one of them runs, and a registration among the live supervisors that meets
a storage error is made again at the next round. Schedules: the ticks are asked for when due, the
loop wakes for the next one, and a storage error costs a backoff.

Real ledger threads on a real SQLite file; the workers are the supervisor's ends of socket pairs
(what the loop sends them is read back from the other ends).
"""

from __future__ import annotations

import socket
import subprocess
import time
from multiprocessing.connection import Connection

import pytest

from faults import APP, admit, wait_until
from supervisor import open_backend
from supervisor.dispatcher import Stats, SupervisorConfig
from supervisor.ledger.errors import StorageUnavailable
from supervisor.ledger.values import Completed, LeaseLost
from supervisor.ledger.ticks import schedule_of
from supervisor.ledger_calls import CALLS, AdmitTicks, LedgerCalls, Register, Renew, Reply, Wakeup
from supervisor.loop import ON_REPLY, DispatchLoop
from supervisor.pool import Child, ChildProcess, Delivery, Pool
from worker._runtime.protocol import Alive, Done, Run, Stop

pytestmark = pytest.mark.timeout(60)


def loop_by_hand(sqlite_path, config: SupervisorConfig):
    """A loop over `config.processes` idle workers of `config.slots` slots each (`loop.workers`:
    the other ends of their pipes); a generator, for a fixture to yield from."""
    exited = subprocess.Popen(["true"])  # stands in for the workers' processes, which the loop never waits on here
    exited.wait()
    pool = Pool(config.processes, app=APP, db_path=str(sqlite_path), durability="normal", heartbeat_s=1.0, misses=3,
                slots=config.slots)
    ends = []
    for _ in range(config.processes):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pool.children.append(Child(ChildProcess(exited), Connection(ours.detach()), exited.pid, ready=True,
                                   slots=config.slots))
        ends.append(Connection(theirs.detach()))
    calls = LedgerCalls(open_backend(str(sqlite_path)), "test-calls", gathering=True)
    renewals = LedgerCalls(open_backend(str(sqlite_path)), "test-renewals")
    loop = DispatchLoop(config, Stats(), pool, calls, renewals, signals=Wakeup(), stop_requests=lambda: 0)
    loop.workers = ends
    yield loop
    pool.shutdown(kill=True)  # the replacements a test made the loop start, too
    calls.close()
    renewals.close()
    for end in ends:
        end.close()


@pytest.fixture
def loop(sqlite_path):
    """A loop over two idle workers of one delivery each."""
    yield from loop_by_hand(sqlite_path, SupervisorConfig(concurrency=2, lease_ms=30_000))


@pytest.fixture
def shared_loop(sqlite_path):
    """A loop over two idle workers of 3 slots each, 5 deliveries at most in all (`--workers`)."""
    yield from loop_by_hand(sqlite_path, SupervisorConfig(concurrency=5, workers=2, lease_ms=30_000))


def handed(end: Connection) -> list[str]:
    """The executions the loop has handed to the worker at `end` so far."""
    out = []
    while end.poll(0):
        message = end.recv()
        if isinstance(message, Run):
            out.append(message.lease.execution_id)
    return out


def test_a_worker_freed_while_a_claim_is_in_flight_gets_a_claim_of_its_own(loop, sqlite_path, sqlite_ledger):
    for name in ("e1", "e2"):
        admit(sqlite_path, name, "sv.noop3")
    _, second = loop.pool.children
    second.delivery = Delivery(None, claimed_at=0, held_until=float("inf"))  # busy: not to be claimed for
    now = time.monotonic()
    loop.claim(now)
    assert (loop.claiming, loop.promised) == (1, 1)  # for the one idle worker

    second.delivery = None  # freed while the first claim is in flight
    loop.claim_wanted = True
    loop.claim(now)
    assert (loop.claiming, loop.promised) == (2, 2)  # a second claim, for the freed worker alone
    loop.claim(now)
    assert (loop.claiming, loop.promised) == (2, 2)  # and no third: every idle worker is claimed for
    loop.calls.flush()

    def settled():
        loop.take_replies(time.monotonic())
        return loop.claiming == 0

    wait_until(settled, message="both claims to come back")
    assert loop.promised == 0
    got = [handed(end) for end in loop.workers]
    assert sorted(got) == [["e1"], ["e2"]], got  # one execution each
    assert all(child.busy for child in loop.pool.children)


def running(loop, ledger, db) -> tuple:
    """The loop's first worker running a delivery of a fresh execution: (worker, its pipe's other
    end, the delivery)."""
    admit(db, "e1", "sv.noop3")
    (lease,) = ledger.executions.claim_due(limit=1, duration=30_000)
    worker = loop.pool.children[0]
    worker.delivery = Delivery(lease, claimed_at=lease.expires_at - 30_000, held_until=float("inf"))
    return worker, loop.workers[0], worker.delivery


def renewal_found_lost(loop, delivery) -> None:
    loop.on_renewed(Reply(Renew([delivery.lease], 30_000, about=[delivery]), [LeaseLost()]), time.monotonic())


def test_a_lost_lease_whose_worker_has_already_reported_is_settled_from_the_report(loop, sqlite_path, sqlite_ledger):
    """The worker's report (its write was refused: lost) came before the renewal that found the
    lease lost was read: the report settles the delivery, and the worker, idle, is kept."""
    worker, end, delivery = running(loop, sqlite_ledger, sqlite_path)
    end.send(Done("e1", delivery.lease.token, LeaseLost(), 5))
    renewal_found_lost(loop, delivery)
    assert any(child is worker for child in loop.pool.children), "a worker that had reported was killed"
    assert worker.delivery is None and not delivery.lost
    assert loop.stats.lost == 1


def test_a_lost_lease_whose_worker_is_still_running_it_has_its_worker_killed(loop, sqlite_path, sqlite_ledger):
    """Only an answer to a heartbeat is waiting: the worker is still inside the delivery, and
    is killed and replaced so that it stops at once."""
    worker, end, delivery = running(loop, sqlite_ledger, sqlite_path)
    end.send(Alive())
    renewal_found_lost(loop, delivery)
    assert not any(child is worker for child in loop.pool.children)
    assert delivery.lost and loop.stats.lost == 1


def test_every_kind_of_ledger_call_has_a_handler_for_its_reply():
    assert set(ON_REPLY) == set(CALLS)
    assert all(handler.__qualname__.startswith("DispatchLoop.on_") for handler in ON_REPLY.values())


# -- workers of several deliveries (`--workers`) -------------------------------------------------

def claimed_and_handed(loop, n: int) -> list[list[str]]:
    """Admit `n` executions, let the loop claim for its free slots, and return what each worker
    was handed."""
    for i in range(n):
        admit(loop.calls.backend.path, f"e{i}", "sv.noop3")
    loop.claim(time.monotonic())
    loop.calls.flush()

    def settled():
        loop.take_replies(time.monotonic())
        return loop.claiming == 0

    wait_until(settled, message="the claim to come back")
    return [[] if end.closed else handed(end) for end in loop.workers]


def test_claims_fill_the_free_slots_in_turn_and_never_pass_the_concurrency(shared_loop):
    got = claimed_and_handed(shared_loop, 8)
    assert [len(each) for each in got] == [3, 2], got  # 5 in all: spread, the first worker's 3 slots full
    assert shared_loop.running() == 5 and shared_loop.free_slots(time.monotonic()) == 0


def test_a_lost_lease_in_a_shared_worker_stops_that_delivery_alone(shared_loop, sqlite_ledger):
    claimed_and_handed(shared_loop, 2)  # one each
    (worker, _), ((lost,), (other,)) = shared_loop.pool.children, [
        list(child.deliveries.values()) for child in shared_loop.pool.children]
    renewal_found_lost(shared_loop, lost)
    end = shared_loop.workers[0]
    assert end.poll(5) and end.recv() == Stop(lost.lease.execution_id, lost.lease.token)
    assert any(child is worker for child in shared_loop.pool.children)  # not killed
    assert lost.lost and not other.lost
    end.send(Done(lost.lease.execution_id, lost.lease.token, LeaseLost(), 5))
    wait_until(lambda: shared_loop.receive(worker, time.monotonic()) or lost.key not in worker.deliveries)
    assert shared_loop.stats.lost == 1 and not other.lost


def test_a_shared_worker_found_dead_while_handed_deliveries_has_them_all_released(shared_loop, sqlite_ledger):
    shared_loop.workers[0].close()  # the first worker died: a send to it fails
    claimed_and_handed(shared_loop, 5)
    # Its 3 slots' deliveries could not be handed over, the second worker's 2 run: the loop went on
    # past the dead worker, replaced it, and gave the 3 leases back.
    assert shared_loop.running() == 2
    assert len(shared_loop.ending) == 3
    shared_loop.calls.flush()
    wait_until(lambda: (shared_loop.take_replies(time.monotonic()) or not shared_loop.ending),
               message="the 3 releases")
    assert sqlite_ledger.executions.stats().by_status.get("running", 0) == 2


# -- routing (`serving`) ---------------------------------------------------------------------------

def replies_taken(loop, done) -> None:
    wait_until(lambda: loop.take_replies(time.monotonic()) or done(), message="the replies")


def test_workers_that_report_different_workflows_are_served_only_what_every_one_runs(loop, sqlite_ledger, caplog):
    first, second = loop.pool.children
    loop.worker_serves(first, ("rt.a", "rt.b"))
    assert loop.workflows == {"rt.a", "rt.b"}
    replies_taken(loop, lambda: loop.registered)
    assert [s.workflows for s in sqlite_ledger.supervisors.live()] == [("rt.a", "rt.b")]

    # The app was edited on disk: a replacement worker registers another set.
    loop.worker_serves(second, ("rt.b", "rt.c"))
    assert loop.workflows == {"rt.b"}
    assert "claiming only what every worker runs: [rt.b]" in caplog.text
    replies_taken(loop, lambda: loop.registered)
    assert [s.workflows for s in sqlite_ledger.supervisors.live()] == [("rt.b",)]

    for name in ("rt.a", "rt.b", "rt.c"):
        admit(sqlite_ledger.path, f"e-{name}", name)
    loop.claim(time.monotonic())
    loop.calls.flush()
    replies_taken(loop, lambda: loop.claiming == 0)
    assert sorted(e for end in loop.workers for e in handed(end)) == ["e-rt.b"]
    assert {r.execution_id: r.status for r in sqlite_ledger.executions.list()} == {
        "e-rt.a": "admitted", "e-rt.b": "running", "e-rt.c": "admitted"}


def test_a_registration_that_meets_a_storage_error_is_made_again_at_the_next_round(loop, sqlite_ledger):
    loop.workflows = frozenset({"rt.a"})
    now = time.monotonic()
    failed = Reply(Register(loop.supervisor_id, ()), error=StorageUnavailable("disk full"))
    loop.registering = True
    loop.count_failures(failed)
    ON_REPLY[Register](loop, failed, now)  # as `take_replies` hands it on
    assert loop.fatal is None and not loop.registered and loop.stats.storage_errors == 1

    loop.renew(loop.next_renewal)  # the next renewal round registers it again
    replies_taken(loop, lambda: loop.registered)
    assert [(s.id, s.workflows) for s in sqlite_ledger.supervisors.live()] == [(loop.supervisor_id, ("rt.a",))]


def test_storage_errors_are_counted_in_the_metrics_by_ledger_method(loop):
    """`supervise --metrics`: each storage error a reply brings counts in
    `yieldstar_storage_errors_total`, labelled by the ledger method of its call."""
    from prometheus_client import CollectorRegistry

    from supervisor.metrics_server import PrometheusMetrics

    registry = CollectorRegistry()
    loop.metrics = PrometheusMetrics(registry)
    loop.registering = True
    for _ in range(2):
        loop.count_failures(Reply(Register(loop.supervisor_id, ()), error=StorageUnavailable("disk full")))
    loop.count_failures(Reply(Renew([], 30_000), error=StorageUnavailable("disk full")))
    assert registry.get_sample_value("yieldstar_storage_errors_total", {"call": Register.name}) == 2
    assert registry.get_sample_value("yieldstar_storage_errors_total", {"call": Renew.name}) == 1
    assert loop.stats.storage_errors == 3


# -- schedules (SPEC section 12) ---------------------------------------------------------------


def test_schedules_ticks_are_admitted_when_due_and_the_loop_wakes_for_the_next(loop, sqlite_ledger):
    """The first worker's schedules of served workflows are kept; an AdmitTicks goes out at once,
    its reply sets the wake-up for the next tick by the ledger's clock, and `deadline` includes it."""
    first, _ = loop.pool.children
    loop.worker_serves(first, ("sc.tick",))
    every_2, other = schedule_of("sc.tick", every=2), schedule_of("not.served", every=1)
    now = time.monotonic()
    loop.worker_schedules(first, (every_2, other), now)
    assert loop.schedules == (every_2,)  # only the served workflow's
    loop.admit_ticks(now)
    assert loop.ticking and loop.ticks_deadline() is None
    loop.admit_ticks(now)  # one in flight at a time
    loop.calls.flush()
    replies_taken(loop, lambda: not loop.ticking)
    (record,) = sqlite_ledger.schedules.list()
    assert record.name == "sc.tick" and record.next_tick % 2000 == 0
    assert 0 < loop.next_ticks_at - now <= 2.0 + 0.5  # the next tick, not a poll
    assert loop.deadline(now) <= loop.next_ticks_at


def test_an_admit_ticks_that_meets_a_storage_error_is_made_again_after_a_backoff(loop, sqlite_ledger):
    first, _ = loop.pool.children
    loop.worker_serves(first, ("sc.tick",))
    loop.worker_schedules(first, (schedule_of("sc.tick", every=1),), time.monotonic())
    now = time.monotonic()
    failed = Reply(AdmitTicks(loop.schedules, timed=True), error=StorageUnavailable("disk full"))
    loop.ticking = True
    loop.count_failures(failed)
    ON_REPLY[AdmitTicks](loop, failed, now)  # as `take_replies` hands it on
    assert loop.fatal is None and not loop.ticking and loop.stats.storage_errors == 1
    assert loop.next_ticks_at == pytest.approx(now + 0.05)
    loop.admit_ticks(now)
    assert not loop.ticking  # not before the backoff
    loop.admit_ticks(loop.next_ticks_at)
    loop.calls.flush()
    replies_taken(loop, lambda: not loop.ticking)
    assert [r.name for r in sqlite_ledger.schedules.list()] == ["sc.tick"]


def test_a_stopping_loop_admits_no_more_ticks(loop):
    first, _ = loop.pool.children
    loop.worker_serves(first, ("sc.tick",))
    now = time.monotonic()
    loop.worker_schedules(first, (schedule_of("sc.tick", every=1),), now)
    loop.grace_deadline = now + 10
    loop.admit_ticks(now)
    assert not loop.ticking and loop.ticks_deadline() is None


# -- queues (SPEC section 12) ----------------------------------------------------------------------


def test_an_idle_loop_behind_a_saturated_queue_claims_less_and_less_often_then_at_once_when_a_slot_frees(
        loop, sqlite_ledger):
    """Due work that a queue's limit holds back makes every claim find nothing: the loop waits
    5 ms, then twice as long each time up to its poll interval, instead of claiming in a loop;
    a claim that finds work again starts the waits over."""
    loop.workflows = frozenset({"wf"})
    sqlite_ledger.queues.declare("narrow", concurrency=1)
    for i in range(4):
        sqlite_ledger.executions.admit(f"n-{i}", "wf", queue="narrow")
    [held] = sqlite_ledger.executions.claim_due(limit=1, duration=60_000)  # another supervisor's
    poll_s = loop.cfg.poll_ms / 1000
    for blocked in range(1, 10):
        loop.claim(max(time.monotonic(), loop.next_poll))
        loop.calls.flush()
        replies_taken(loop, lambda: loop.claiming == 0)  # found nothing: it asks when work is ready
        loop.calls.flush()
        before = time.monotonic()
        replies_taken(loop, lambda: loop.blocked_polls == blocked)  # "now", yet held back
        after = time.monotonic()
        expected = min(poll_s, 0.005 * 2 ** (blocked - 1))
        assert loop.next_poll - after - 0.001 <= expected <= loop.next_poll - before + 0.001, blocked
    assert not any(end.poll(0) for end in loop.workers)  # nothing was handed out

    sqlite_ledger.executions.acknowledge(held, Completed("null"))
    loop.claim(max(time.monotonic(), loop.next_poll))
    loop.calls.flush()
    replies_taken(loop, lambda: loop.claiming == 0)
    assert sorted(e for end in loop.workers for e in handed(end)) == ["n-1"]
    assert loop.blocked_polls == 0
