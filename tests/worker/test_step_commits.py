"""The group commit of a worker's step writes (`worker._runtime.step_commits`): each write of a
batch keeps the rules of a single write, by its own delivery's door (`FencedWriter`)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from supervisor import HeapRecord, StepWrite
from supervisor.ledger.errors import StorageBusy
from worker._runtime.fenced import FencedWriter
from worker._runtime.step_commits import NOT_SENT, StepCommits
from worker._runtime.unwinding import RetryLater, StopDelivery

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def commits(sqlite_backend):
    started = StepCommits(sqlite_backend)
    yield started
    started.close()


def leases(backend, n):
    for i in range(n):
        backend.executions.admit(f"e{i}", "w")
    return sorted(backend.executions.claim_due(limit=n, duration=60_000), key=lambda lease: lease.execution_id)


def test_writes_queued_while_a_commit_is_in_flight_go_together_in_the_next_one(sqlite_backend, commits):
    held = leases(sqlite_backend, 20)
    gate, entered = threading.Event(), threading.Event()
    write_steps = sqlite_backend.heap.write_steps

    def slow_first_commit(writes):  # the first batch holds the writer while the others queue
        entered.set()
        gate.wait(10)
        return write_steps(writes)

    sqlite_backend.heap.write_steps = slow_first_commit
    first = commits.submit(StepWrite(held[0], "s", 0, True, '"0"'), lambda: True)
    assert entered.wait(10)
    rest = [commits.submit(StepWrite(lease, "s", 0, True, f'"{i}"'), lambda: True) for i, lease in
            enumerate(held[1:], 1)]
    gate.set()
    assert [f.result(10) for f in [first, *rest]] == [
        HeapRecord(lease.execution_id, "s", 0, True, f'"{i}"') for i, lease in enumerate(held)]
    assert (commits.writes, commits.transactions) == (20, 2)


def test_a_delivery_whose_supervisor_is_no_longer_heard_has_its_queued_write_not_sent(sqlite_backend, commits):
    (lease,) = leases(sqlite_backend, 1)
    heard = [True]
    writer = FencedWriter(sqlite_backend, lease, lambda: heard[0], commits)
    assert commits.submit(StepWrite(lease, "s", 0, True, '"x"'), lambda: False).result(10) is NOT_SENT
    heard[0] = False
    with pytest.raises(StopDelivery, match="no longer heard"):
        writer.write_step("s", 0, True, '"x"')
    assert sqlite_backend.heap.read_step(lease.execution_id, "s") is None


def test_a_storage_error_shuts_each_writer_of_the_batch(sqlite_backend, commits):
    held = leases(sqlite_backend, 2)
    writers = [FencedWriter(sqlite_backend, lease, commits=commits) for lease in held]

    def busy(writes):
        raise StorageBusy("the database is locked")

    sqlite_backend.heap.write_steps = busy
    for writer in writers:
        with pytest.raises(RetryLater):
            writer.write_step("s", 0, True, '"x"')
        assert writer.storage_failure is not None


def test_a_stale_write_is_refused_alone_and_stops_its_delivery_alone(sqlite_backend, commits):
    held = leases(sqlite_backend, 2)
    sqlite_backend.executions.release(held[0])
    stale, live = (FencedWriter(sqlite_backend, lease, commits=commits) for lease in held)
    with pytest.raises(StopDelivery, match="lease lost"):
        stale.write_step("s", 0, True, '"x"')
    assert live.write_step("s", 0, True, '"y"') == HeapRecord(held[1].execution_id, "s", 0, True, '"y"')


def test_one_bad_write_fails_alone(sqlite_backend, commits):
    held = leases(sqlite_backend, 2)
    bad = commits.submit(StepWrite(held[0], "s", 0, True, "not json"), lambda: True)
    good = commits.submit(StepWrite(held[1], "s", 0, True, '"y"'), lambda: True)
    assert good.result(10) == HeapRecord(held[1].execution_id, "s", 0, True, '"y"')
    with pytest.raises(ValueError):
        bad.result(10)


def test_an_async_delivery_awaits_its_write_while_the_loop_runs_on(sqlite_backend, commits):
    held = leases(sqlite_backend, 30)
    writers = [FencedWriter(sqlite_backend, lease, commits=commits) for lease in held]

    async def all_at_once():
        return await asyncio.gather(*(w.write_step_async("s", 0, True, f'"{i}"') for i, w in enumerate(writers)))

    records = asyncio.run(all_at_once())
    assert [r.step_response_json for r in records] == [f'"{i}"' for i in range(30)]
    assert commits.transactions < 30


def test_a_delivery_stopped_while_its_write_waited_for_a_batch_sends_nothing(sqlite_backend, commits):
    lease, other = leases(sqlite_backend, 2)
    writer = FencedWriter(sqlite_backend, lease, commits=commits)
    gate, entered = threading.Event(), threading.Event()
    write_steps = sqlite_backend.heap.write_steps

    def slow(writes):
        entered.set()
        gate.wait(10)
        return write_steps(writes)

    sqlite_backend.heap.write_steps = slow
    commits.submit(StepWrite(other, "s", 0, True, '"first"'), lambda: True)
    assert entered.wait(10)
    queued = writer._submit("s", 0, True, '"x"')
    writer.stopped_because = "cancelled"  # WorkflowRun.stop, from the worker's main thread
    gate.set()
    assert queued.result(10) is NOT_SENT
    assert sqlite_backend.heap.read_step(lease.execution_id, "s") is None
