"""Many deliveries per worker process (`supervise --workers`, SPEC section 10), with real
processes and real signals.

A worker that runs several deliveries keeps each one's lease, token and fenced writes: a lost
lease or a cancel stops that delivery alone, a delivery that will not stop gets its worker
replaced, and a worker killed costs each of its deliveries a redelivery (released at once), never
a recorded step run again. The workflows are those of `tests/apps/supervised_app.py`; each step
run leaves a line in the side-effect log, so a step run twice shows as two lines.
"""

from __future__ import annotations

import collections
import json
import os
import signal
from pathlib import Path

import pytest

from faults import (APP, admit, cli, freeze, freeze_group, gone, read_log, sigkill, step_tokens, thaw, thaw_group,
                    wait_gone, wait_until)
from supervisor.chaos.evidence import worker_ends
from supervisor.dispatcher import SupervisorConfig
from supervisor.ledger.errors import InvalidArgument

pytestmark = pytest.mark.usefixtures("dump_on_hang")


def statuses(ledger, ids) -> collections.Counter:
    return collections.Counter(ledger.executions.get(e).status for e in ids)


def runs(log_path, step_key: str, event: str = "end") -> collections.Counter:
    """How many times each execution's step `step_key` ran to `event`, from the side-effect log."""
    return collections.Counter(e.execution_id for e in read_log(log_path) if e.step_key == step_key
                               and e.event == event)


def waiting(log_path) -> set[str]:
    return {e.execution_id for e in read_log(log_path) if e.event == "waiting"}


def released_with_their_worker(supervisor) -> dict:
    """`(execution, token) -> (worker pid, why)` of the deliveries released with their worker, as
    the chaos harness reads the supervisor's log (`supervisor.chaos.evidence`): its reading of
    the loop's words checked against what a real supervisor logs."""
    ends = worker_ends((1, line) for line in supervisor.log().splitlines())
    return {key: (pid, why) for key, (_, pid, why) in ends.released.items()}


def all_waiting_in_one_worker(db, tmp_path, supervisors, n: int):
    """`n` executions of `sv.async_gate` admitted, and one supervisor with one worker of `n`
    slots running them, all waiting at the gate at once: (supervisor, worker pid, ids, log, gate)."""
    log, gate = str(tmp_path / "effects.log"), tmp_path / "gate"
    ids = [f"e{i}" for i in range(n)]
    for execution_id in ids:
        admit(db, execution_id, "sv.async_gate", {"log": log, "gate": str(gate)})
    supervisor = supervisors.start(db, concurrency=n, workers=1)
    (worker,) = supervisor.workers()
    wait_until(lambda: waiting(log) == set(ids), timeout=30, message=f"all {n} deliveries waiting at once")
    assert {e.pid for e in read_log(log)} == {worker}  # all of them in the one worker
    return supervisor, worker, ids, log, gate


# -- the options ------------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("args, says", [
    (("--concurrency", "300"), "--workers"),
    (("--concurrency", "20000", "--workers", "4"), "at most 10000"),
    (("--concurrency", "1000", "--workers", "257"), "workers must be an int from 1 to 256"),
])
def test_workers_and_concurrency_out_of_bounds_are_refused_in_one_line_before_any_ledger(sqlite_path, args, says):
    result = cli(sqlite_path, "supervise", APP, *args)
    assert result.returncode == 2, result
    assert says in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not os.path.exists(sqlite_path)


def test_the_config_says_how_many_processes_and_slots():
    with pytest.raises(InvalidArgument, match="--workers"):
        SupervisorConfig(concurrency=257)
    with pytest.raises(ValueError, match="workers must be an int from 1 to 256"):
        SupervisorConfig(concurrency=300, workers=0)
    assert (SupervisorConfig(concurrency=256).processes, SupervisorConfig(concurrency=256).slots) == (256, 1)
    config = SupervisorConfig(concurrency=10_000, workers=256)
    assert (config.processes, config.slots) == (256, 40)
    config = SupervisorConfig(concurrency=10, workers=4)
    assert (config.processes, config.slots) == (4, 3)  # and at most 10 at once in all
    config = SupervisorConfig(concurrency=2, workers=3)
    assert (config.processes, config.slots) == (3, 1)  # P processes, as asked; at most 2 at once in all



@pytest.mark.timeout(90)
def test_more_workers_than_concurrency_start_as_asked_and_run_at_most_concurrency_at_once(
        sqlite_path, sqlite_ledger, tmp_path, supervisors):
    log, gate = str(tmp_path / "effects.log"), tmp_path / "gate"
    ids = [f"e{i}" for i in range(6)]
    for execution_id in ids:
        admit(sqlite_path, execution_id, "sv.async_gate", {"log": log, "gate": str(gate)})
    supervisor = supervisors.start(sqlite_path, concurrency=2, workers=4)
    assert len(supervisor.workers()) == 4  # P processes, as SPEC section 10 says
    wait_until(lambda: len(waiting(log)) >= 2, timeout=30, message="two deliveries waiting at the gate")
    Path(gate).touch()
    wait_until(lambda: statuses(sqlite_ledger, ids) == {"completed": 6}, timeout=30, message="all 6 completed")
    # Never more than 2 deliveries at once, by the ledger's own history of every delivery.
    spans = [(lease.claimed_at, lease.ended_at) for e in ids for lease in sqlite_ledger.executions.history(e)]
    most = max(sum(1 for start, end in spans if start <= at < end) for at, _ in spans)
    assert len(spans) == 6 and most <= 2, spans
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(20) == 0

# -- crashes ----------------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_a_worker_holding_20_deliveries_killed_has_all_20_delivered_again_and_no_step_run_twice(
        each_backend, each_ledger, tmp_path, supervisors):
    db = each_backend
    supervisor, worker, ids, log, gate = all_waiting_in_one_worker(db, tmp_path, supervisors, 20)
    sigkill(worker)
    wait_gone([worker])
    # Released at once, not left to expire: each is claimed again under token 2.
    supervisor.wait_log("releasing it", count=20)
    assert released_with_their_worker(supervisor) == {(e, 1): (worker, "exited") for e in ids}
    wait_until(lambda: len(waiting(log)) == 20 and
               all(n == 2 for n in runs(log, "hold", "waiting").values()) and len(runs(log, "hold", "waiting")) == 20,
               timeout=30, message="all 20 redelivered and waiting again")
    gate.touch()
    wait_until(lambda: statuses(each_ledger, ids) == {"completed": 20}, timeout=30, message="all 20 completed")

    for execution_id in ids:
        assert [key for key, _, _ in step_tokens(db, execution_id)] == ["before", "hold", "after"]
        result = json.loads(each_ledger.executions.get(execution_id).result_json)
        assert result["token"] == 2 and result["pid"] != worker
    # A recorded step is replayed, never run again; the step cut short ran twice, recorded once.
    assert runs(log, "before") == {e: 1 for e in ids}
    assert runs(log, "after") == {e: 1 for e in ids}
    assert runs(log, "hold") == {e: 1 for e in ids}
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(20) == 0


@pytest.mark.timeout(90)
def test_a_frozen_worker_of_5_deliveries_is_replaced_and_all_5_delivered_again(sqlite_path, sqlite_ledger,
                                                                              tmp_path, supervisors):
    supervisor, worker, ids, log, gate = all_waiting_in_one_worker(sqlite_path, tmp_path, supervisors, 5)
    freeze(worker)
    try:
        # Silent past the tolerance (3 x 200 ms): killed, replaced, and its deliveries released.
        supervisor.wait_log("silent for", timeout=10)
        wait_gone([worker])
        supervisor.wait_log("releasing it", count=5)
        assert released_with_their_worker(supervisor) == {(e, 1): (worker, "silent") for e in ids}
    finally:
        if not gone(worker):
            thaw(worker)
    wait_until(lambda: len(runs(log, "hold", "waiting")) == 5 and set(runs(log, "hold", "waiting").values()) == {2},
               timeout=30, message="all 5 redelivered and waiting again")
    gate.touch()
    wait_until(lambda: statuses(sqlite_ledger, ids) == {"completed": 5}, timeout=30, message="all 5 completed")
    assert runs(log, "before") == {e: 1 for e in ids}
    for execution_id in ids:
        assert json.loads(sqlite_ledger.executions.get(execution_id).result_json)["token"] == 2
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(20) == 0


@pytest.mark.timeout(60)
def test_a_killed_supervisor_stops_every_delivery_of_its_workers(sqlite_path, tmp_path, supervisors):
    supervisor, worker, *_ = all_waiting_in_one_worker(sqlite_path, tmp_path, supervisors, 5)
    sigkill(supervisor.pid)
    wait_gone([supervisor.pid, worker], timeout=5)  # its worker goes with it, and every delivery with that


# -- stopping one delivery ----------------------------------------------------------------------

@pytest.mark.timeout(90)
def test_a_cancel_of_one_of_10_deliveries_in_one_worker_stops_it_alone(each_backend, each_ledger, tmp_path,
                                                                       supervisors):
    db = each_backend
    supervisor, worker, ids, log, gate = all_waiting_in_one_worker(db, tmp_path, supervisors, 10)
    assert cli(db, "cancel", "e3", "--reason", "operator test").returncode == 0
    supervisor.wait_log("telling worker pid")
    wait_until(lambda: "execution=e3 token=1 outcome=lost" in supervisor.log(), timeout=10,
               message="the cancelled delivery to report that it stopped")
    gate.touch()
    others = [e for e in ids if e != "e3"]
    wait_until(lambda: statuses(each_ledger, others) == {"completed": 9}, timeout=30, message="the 9 others completed")

    assert each_ledger.executions.get("e3").status == "cancelled"
    assert [key for key, _, _ in step_tokens(db, "e3")] == ["before"]
    assert "e3" not in runs(log, "hold")  # its task was cancelled while it waited
    assert supervisor.workers() == [worker]  # the same worker process ran them all, and runs on
    for execution_id in others:
        result = json.loads(each_ledger.executions.get(execution_id).result_json)
        assert (result["token"], result["pid"]) == (1, worker)
    assert runs(log, "after") == {e: 1 for e in others}
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(20) == 0


@pytest.mark.timeout(90)
def test_a_stopped_sync_delivery_finds_its_next_write_refused_and_its_worker_runs_on(each_backend, each_ledger,
                                                                                     tmp_path, supervisors):
    db, log, gate = each_backend, str(tmp_path / "effects.log"), tmp_path / "gate"
    admit(db, "sync", "sv.hold", {"log": log, "gate": str(gate)})
    siblings = [f"s{i}" for i in range(3)]
    for execution_id in siblings:
        admit(db, execution_id, "sv.async_gate", {"log": log, "gate": str(gate)})
    # A tolerance of 50 heartbeats (10 s): time enough for the sync step to end and meet its stop.
    supervisor = supervisors.start(db, concurrency=4, workers=1, extra=["--heartbeat-misses", "50"])
    (worker,) = supervisor.workers()
    wait_until(lambda: waiting(log) == set(siblings + ["sync"]), timeout=30, message="all 4 waiting at once")
    assert cli(db, "cancel", "sync").returncode == 0
    supervisor.wait_log("telling worker pid")
    gate.touch()  # the sync step returns, and its write is refused: the delivery stops there
    wait_until(lambda: "execution=sync token=1 outcome=lost" in supervisor.log(), timeout=10,
               message="the sync delivery to report that it stopped")
    wait_until(lambda: statuses(each_ledger, siblings) == {"completed": 3}, timeout=30, message="the 3 others completed")
    assert runs(log, "hold")["sync"] == 1 and [key for key, _, _ in step_tokens(db, "sync")] == ["before"]
    assert each_ledger.executions.get("sync").status == "cancelled"
    assert supervisor.workers() == [worker] and "killing" not in supervisor.log()
    for execution_id in siblings:
        assert json.loads(each_ledger.executions.get(execution_id).result_json)["pid"] == worker
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(20) == 0


@pytest.mark.timeout(90)
def test_a_sync_delivery_that_ignores_its_stop_gets_its_worker_replaced_and_its_siblings_delivered_again(
        sqlite_path, sqlite_ledger, tmp_path, supervisors):
    log, gate = str(tmp_path / "effects.log"), tmp_path / "gate"
    admit(sqlite_path, "stubborn", "sv.stubborn", {"log": log, "seconds": 60, "stubborn_tokens": [1]})
    siblings = [f"s{i}" for i in range(3)]
    for execution_id in siblings:
        admit(sqlite_path, execution_id, "sv.async_gate", {"log": log, "gate": str(gate)})
    supervisor = supervisors.start(sqlite_path, concurrency=4, workers=1)
    (worker,) = supervisor.workers()
    wait_until(lambda: waiting(log) == set(siblings) and runs(log, "stubborn", "begin"), timeout=30,
               message="the stubborn step and its 3 siblings running at once")

    assert cli(sqlite_path, "cancel", "stubborn").returncode == 0
    # Its step sleeps on: it is told to stop, does not, and its worker is replaced within the
    # heartbeat tolerance (3 x 200 ms), its siblings released at once.
    supervisor.wait_log("killing and replacing the worker, and releasing its 3 other deliveries", timeout=10)
    wait_gone([worker])
    supervisor.wait_log("releasing it", count=4)  # the stubborn one too: a release refused, as it is cancelled
    assert released_with_their_worker(supervisor) == {(e, 1): (worker, "sibling_unstoppable")
                                                      for e in siblings + ["stubborn"]}
    gate.touch()
    wait_until(lambda: statuses(sqlite_ledger, siblings) == {"completed": 3}, timeout=30,
               message="the 3 siblings completed")
    assert sqlite_ledger.executions.get("stubborn").status == "cancelled"
    assert not runs(log, "stubborn")  # never ended, never recorded
    for execution_id in siblings:
        result = json.loads(sqlite_ledger.executions.get(execution_id).result_json)
        assert result["token"] == 2 and result["pid"] != worker
    assert runs(log, "before") == {e: 1 for e in siblings + ["stubborn"]}
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(20) == 0


@pytest.mark.timeout(90)
def test_a_paused_supervisor_resumes_to_stop_its_stale_deliveries_without_killing_their_worker(
        each_backend, each_ledger, tmp_path, supervisors):
    db, log, gate = each_backend, str(tmp_path / "effects.log"), tmp_path / "gate"
    ids = [f"e{i}" for i in range(3)]
    for execution_id in ids:
        admit(db, execution_id, "sv.async_gate", {"log": log, "gate": str(gate), "hold_tokens": [1]})
    # Its worker waits 50 heartbeats for it, so that it survives the pause and meets the fence.
    first = supervisors.start(db, concurrency=3, workers=1, extra=["--heartbeat-misses", "50"])
    (stale,) = first.workers()
    wait_until(lambda: waiting(log) == set(ids), timeout=30, message="all 3 waiting in one worker")
    freeze_group(first.pgid)  # the supervisor and its worker, as a paused host would be
    try:
        second = supervisors.start(db, concurrency=3)
        wait_until(lambda: statuses(each_ledger, ids) == {"completed": 3}, timeout=30, message="the takeover")
        gate.touch()  # the stale deliveries may now carry on...
    finally:
        thaw_group(first.pgid)
    # ...and each is stopped alone, or meets the fence at its next write: lost, never recorded.
    for execution_id in ids:
        first.wait_log(f"delivery execution={execution_id} token=1 outcome=lost", timeout=15)
    assert not gone(stale) and first.workers() == [stale]  # stopped, not killed
    for execution_id in ids:
        assert [(key, token) for key, _, token in step_tokens(db, execution_id)] == [
            ("before", 1), ("hold", 2), ("after", 2)]
        assert json.loads(each_ledger.executions.get(execution_id).result_json)["token"] == 2
    assert ("after", 1) not in [(e.step_key, e.token) for e in read_log(log)]
    assert first.popen.poll() is None and second.popen.poll() is None


# -- async and sync together --------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_async_and_sync_workflows_run_at_once_in_one_worker(each_backend, each_ledger, tmp_path, supervisors):
    db, log, gate = each_backend, str(tmp_path / "effects.log"), tmp_path / "gate"
    asynchronous = [f"a{i}" for i in range(3)]
    synchronous = [f"s{i}" for i in range(3)]
    for execution_id in asynchronous:
        admit(db, execution_id, "sv.async_gate", {"log": log, "gate": str(gate)})
    for execution_id in synchronous:
        admit(db, execution_id, "sv.hold", {"log": log, "gate": str(gate)})
    supervisor = supervisors.start(db, concurrency=6, workers=1)
    (worker,) = supervisor.workers()
    # All six wait at the gate at once: the sync ones on threads, the async ones on the loop.
    wait_until(lambda: waiting(log) == set(asynchronous + synchronous), timeout=30,
               message="3 async and 3 sync deliveries waiting at once")
    Path(gate).touch()
    wait_until(lambda: statuses(each_ledger, asynchronous + synchronous) == {"completed": 6}, timeout=30,
               message="all 6 completed")
    for execution_id in asynchronous + synchronous:
        result = json.loads(each_ledger.executions.get(execution_id).result_json)
        assert (result["token"], result["pid"]) == (1, worker)
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(20) == 0


# -- group commit ---------------------------------------------------------------------------------

def transactions_that_wrote(uri: str, sql: str) -> int:
    """How many transactions wrote the rows `sql` selects (their `xmin`, on PostgreSQL)."""
    import psycopg

    with psycopg.connect(uri) as conn:
        return conn.execute(sql).fetchone()[0]


@pytest.mark.timeout(120)
def test_the_step_writes_of_many_deliveries_of_one_worker_share_transactions_and_a_renewal_round_is_one(
        pg_uri, tmp_path, supervisors):
    # PostgreSQL says which transaction wrote each row (xmin): 40 deliveries of one worker that
    # end their `hold` steps at once commit them in far fewer than 40 transactions, and a
    # renewal round of their 40 leases is one transaction.
    from supervisor import open_backend

    n = 40
    supervisor, worker, ids, log, gate = all_waiting_in_one_worker(pg_uri, tmp_path, supervisors, n)
    with open_backend(pg_uri) as ledger:
        wait_until(lambda: all(ledger.executions.history(e)[-1].renewals >= 2 for e in ids), timeout=30,
                   message="two renewal rounds of every lease")
        renewal_rounds = transactions_that_wrote(
            pg_uri, "SELECT count(DISTINCT xmin::text) FROM executions WHERE status = 'running'")
        print(f"{n} leases last renewed in {renewal_rounds} transactions")
        assert renewal_rounds <= 2, renewal_rounds  # the last round; a round may be midway
        gate.touch()
        wait_until(lambda: statuses(ledger, ids) == {"completed": n}, timeout=30, message=f"all {n} completed")
    for key in ("hold", "after"):
        wrote = transactions_that_wrote(
            pg_uri, f"SELECT count(DISTINCT xmin::text) FROM steps WHERE step_key = '{key}'")
        print(f"{n} {key!r} steps written in {wrote} transactions")
        assert wrote < n // 2, (key, wrote)
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(20) == 0
