"""The schedules table (SPEC section 12), on each backend: `admit_due` admits each tick once, with
its id and input, in the transaction that advances the schedule's cursor by compare-and-set; of
ticks missed, only the latest; a tick whose execution was purged is never admitted again; callers
racing on their own connections admit a tick once between them. Times come from `now=`."""

from __future__ import annotations

import json
import threading

import pytest

from supervisor import Completed, open_backend
from supervisor.ledger.errors import InvalidArgument
from supervisor.ledger.ticks import schedule_of, tick_id, tick_text

pytestmark = pytest.mark.timeout(60)

T0 = 1_796_000_000_000  # a whole multiple of every period below
EVERY_2 = schedule_of("tick", every=2)


def executions_of(backend, workflow: str) -> list[str]:
    return sorted(e.execution_id for e in backend.executions.list(limit=1000) if e.workflow == workflow)


def test_a_new_schedule_has_missed_nothing_its_first_tick_is_the_first_at_or_after_now(backend):
    (record,) = backend.schedules.admit_due([EVERY_2], now=T0 + 500)
    assert (record.name, record.spec, record.timezone, record.last_tick, record.next_tick, record.updated_at,
            record.admitted) == ("tick", "every 2s", None, None, T0 + 2000, T0 + 500, False)
    assert executions_of(backend, "tick") == []
    (record,) = backend.schedules.admit_due([EVERY_2], now=T0 + 1999)
    assert not record.admitted and record.next_tick == T0 + 2000
    # One that starts exactly on a tick admits it.
    on_tick = schedule_of("on.tick", every=2)
    (record,) = backend.schedules.admit_due([on_tick], now=T0)
    assert record.admitted and record.last_tick == T0 and record.next_tick == T0 + 2000


def test_a_due_tick_is_admitted_once_with_its_id_and_input_and_the_cursor_moves_on(backend):
    backend.schedules.admit_due([EVERY_2], now=T0 + 500)
    (record,) = backend.schedules.admit_due([EVERY_2], now=T0 + 2003)
    assert (record.admitted, record.last_tick, record.next_tick) == (True, T0 + 2000, T0 + 4000)
    execution = backend.executions.get(tick_id("tick", T0 + 2000))
    assert execution.execution_id == f"tick@{tick_text(T0 + 2000)}" and execution.execution_id.endswith("Z")
    assert execution.workflow == "tick" and execution.status == "admitted" and execution.due_at == T0 + 2003
    assert json.loads(execution.input_json) == {"scheduled_at": tick_text(T0 + 2000)}
    for now in (T0 + 2003, T0 + 2500, T0 + 3999):  # again before the next tick: nothing
        (record,) = backend.schedules.admit_due([EVERY_2], now=now)
        assert not record.admitted and record.last_tick == T0 + 2000
    assert executions_of(backend, "tick") == [tick_id("tick", T0 + 2000)]
    assert backend.schedules.list() == [record]


def test_of_the_ticks_missed_only_the_latest_is_admitted_then_it_continues_from_the_next(backend):
    backend.schedules.admit_due([EVERY_2], now=T0 + 500)
    backend.schedules.admit_due([EVERY_2], now=T0 + 2000)
    (record,) = backend.schedules.admit_due([EVERY_2], now=T0 + 21_000)  # ticks 4 s ... 20 s missed
    assert (record.admitted, record.last_tick, record.next_tick) == (True, T0 + 20_000, T0 + 22_000)
    backend.schedules.admit_due([EVERY_2], now=T0 + 22_000)
    assert executions_of(backend, "tick") == sorted(tick_id("tick", T0 + s * 1000) for s in (2, 20, 22))


def test_a_purged_tick_is_not_admitted_again(backend):
    backend.schedules.admit_due([EVERY_2], now=T0 + 500)
    backend.schedules.admit_due([EVERY_2], now=T0 + 2000)
    (lease,) = backend.executions.claim_due(limit=1, duration=30_000, now=T0 + 2001)
    assert lease.execution_id == tick_id("tick", T0 + 2000)
    assert backend.executions.acknowledge(lease, Completed("null"), now=T0 + 2002).status == "completed"
    assert backend.executions.purge(before=T0 + 3000, now=T0 + 3000) == 1
    assert backend.executions.get(tick_id("tick", T0 + 2000)) is None
    for now in (T0 + 2000, T0 + 3000, T0 + 3999):
        (record,) = backend.schedules.admit_due([EVERY_2], now=now)
        assert not record.admitted
    assert backend.executions.get(tick_id("tick", T0 + 2000)) is None
    (record,) = backend.schedules.admit_due([EVERY_2], now=T0 + 4000)
    assert record.admitted and executions_of(backend, "tick") == [tick_id("tick", T0 + 4000)]


def test_several_schedules_in_one_call_and_a_changed_spec_starts_its_cursor_again(backend):
    nightly = schedule_of("nightly", schedule="0 3 * * *", timezone="Europe/Paris")
    records = backend.schedules.admit_due([EVERY_2, nightly], now=T0 + 500)
    assert [r.name for r in records] == ["tick", "nightly"]
    assert records[1].spec == "0 3 * * *" and records[1].timezone == "Europe/Paris"
    assert tick_text(records[1].next_tick).endswith(("T02:00:00Z", "T01:00:00Z"))  # 03:00 in Paris
    backend.schedules.admit_due([EVERY_2], now=T0 + 2000)
    every_5 = schedule_of("tick", every=5)
    (record,) = backend.schedules.admit_due([every_5], now=T0 + 2500)
    assert (record.spec, record.last_tick, record.next_tick, record.admitted) == ("every 5s", T0 + 2000, T0 + 5000,
                                                                                   False)
    assert [r.name for r in backend.schedules.list()] == ["nightly", "tick"]


def test_admit_due_refuses_what_is_not_a_schedule(backend):
    for bad in ("tick", [("tick", 2)], None):
        with pytest.raises(InvalidArgument, match="schedules must be a collection of Schedule values"):
            backend.schedules.admit_due(bad, now=T0)
    assert backend.schedules.list() == []


def test_callers_racing_on_their_own_connections_admit_each_tick_once(each_backend):
    """Four callers, each on a backend of its own, call `admit_due` at the same instant for each
    of 30 ticks, half of them after a gap of missed ticks: each tick is admitted by exactly one."""
    callers = 4
    backends = [open_backend(each_backend) for _ in range(callers)]
    try:
        backends[0].schedules.admit_due([EVERY_2], now=T0 + 1)
        nows = [T0 + 2000 * (i + 1) + (2000 * 3 if i % 2 else 0) + 7 for i in range(30)]
        nows = sorted(set(nows))
        barrier = threading.Barrier(callers)
        admitted: list[list[int]] = [[] for _ in range(callers)]
        errors: list[BaseException] = []

        def race(number: int) -> None:
            try:
                for now in nows:
                    barrier.wait(timeout=20)
                    (record,) = backends[number].schedules.admit_due([EVERY_2], now=now)
                    if record.admitted:
                        admitted[number].append(record.last_tick)
            except BaseException as exc:  # reported by the test's thread
                errors.append(exc)
                barrier.abort()

        threads = [threading.Thread(target=race, args=(n,)) for n in range(callers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(45)
        assert not errors, errors
        won = sorted(tick for ticks in admitted for tick in ticks)
        expected = sorted({now // 2000 * 2000 for now in nows})
        assert won == expected  # each tick once, by one caller
        assert executions_of(backends[0], "tick") == sorted(tick_id("tick", t) for t in expected)
    finally:
        for each in backends:
            each.close()


def test_a_tick_goes_to_its_workflows_default_queue_and_priority(backend):
    backend.queues.declare("nightly-jobs", concurrency=1)
    backend.queues.record_defaults({"tick": ("nightly-jobs", 7)})
    backend.schedules.admit_due([EVERY_2], now=T0 + 500)
    (record,) = backend.schedules.admit_due([EVERY_2], now=T0 + 2003)
    assert record.admitted
    execution = backend.executions.get(tick_id("tick", T0 + 2000))
    assert (execution.queue, execution.key, execution.priority) == ("nightly-jobs", None, 7)


def test_forget_removes_the_schedules_named_and_refuses_what_is_not_names(backend):
    backend.schedules.admit_due([EVERY_2, schedule_of("other", every=3)], now=T0)
    assert backend.schedules.forget(["tick", "unknown"]) == 1
    assert [r.name for r in backend.schedules.list()] == ["other"]
    for bad in ("other", None, [""], [3]):
        with pytest.raises(InvalidArgument):
            backend.schedules.forget(bad)
    assert [r.name for r in backend.schedules.list()] == ["other"]
    # Recorded again (a supervisor of the older app), it starts as new: nothing missed.
    [record] = backend.schedules.admit_due([EVERY_2], now=T0 + 10_001)
    assert (record.last_tick, record.next_tick, record.admitted) == (None, T0 + 12_000, False)
