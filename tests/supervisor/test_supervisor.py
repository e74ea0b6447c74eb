"""The supervisor with real child processes: the RFC's dispatcher tests, renewal, waking, the CLI.

Supervisors run as `yieldstar supervise` subprocesses (one in-process, in a thread, where no
signal is involved); the workflows are those of `tests/apps/supervised_app.py`. Every test
observes through the ledger and the workflows' side-effect logs, polling against deadlines.
The fault tests (crashes, kills, freezes, shutdown signals) are in `test_supervisor_faults.py`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from faults import (APP, HEARTBEAT_MS, POLL_MS, RENEW_MS, admit, cli, is_worker, max_overlap, no_two_live_leases,
                    process_tree, read_log, run_until_idle, sigkill, step_tokens, wait_gone, wait_until)
from supervisor import ExecutionRecord, HeapRecord
from supervisor.dispatcher import SupervisorConfig
from supervisor.ledger.sqlite.nudge import nudge_dir

pytestmark = pytest.mark.usefixtures("dump_on_hang")


def completed(ledger, *execution_ids: str) -> bool:
    return all(ledger.executions.get(e).status == "completed" for e in execution_ids)


# -- the RFC's dispatcher tests -------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_n_executions_due_with_concurrency_n_are_all_delivered_without_waiting_for_each_other(
        each_backend, each_ledger, tmp_path):
    n = 4
    ids = [f"meet-{i}" for i in range(n)]
    for execution_id in ids:
        # Each delivery completes only once all n have started: one that waited for another to
        # finish would time out and fail its execution.
        admit(each_backend, execution_id, "sv.rendezvous", {"dir": str(tmp_path / "met"), "n": n, "timeout": 20})
    deliveries = []
    run_until_idle(each_backend, APP, SupervisorConfig(
        concurrency=n, lease_ms=1500, renew_ms=RENEW_MS, heartbeat_ms=HEARTBEAT_MS, poll_ms=POLL_MS),
        on_delivery=lambda *delivery: deliveries.append(delivery))
    for execution_id in ids:
        record = each_ledger.executions.get(execution_id)
        assert record.status == "completed", record
        assert json.loads(record.result_json) == n
        assert [(h.token, h.ended_by) for h in each_ledger.executions.history(execution_id)] == [(1, "acknowledged")]
    assert sorted((d[0], d[1], d[2]) for d in deliveries) == [(e, 1, "completed") for e in ids]
    assert not [p for p in process_tree(os.getpid()) if is_worker(p)], "workers outlived their supervisor"


@pytest.mark.timeout(60)
def test_more_executions_due_than_concurrency_never_run_more_than_concurrency_at_once(
        each_backend, each_ledger, tmp_path, supervisors):
    log = tmp_path / "effects.log"
    ids = [f"busy-{i}" for i in range(8)]
    for execution_id in ids:
        admit(each_backend, execution_id, "sv.steps", {"log": str(log), "steps": 1, "sleep": 0.3})
    supervisor = supervisors.start(each_backend, concurrency=2, until_idle=True, ready=False)
    assert supervisor.wait(45) == 0
    assert completed(each_ledger, *ids)

    events = read_log(log)
    begins = {e.execution_id: e.time_ns for e in events if e.event == "begin"}
    ends = {e.execution_id: e.time_ns for e in events if e.event == "end"}
    assert sorted(begins) == sorted(ends) == sorted(ids)  # each step ran once
    assert max_overlap((begins[e], ends[e]) for e in ids) == 2  # used its concurrency, never more
    leases = [h for e in ids for h in each_ledger.executions.history(e)]
    assert len(leases) == len(ids)
    assert max_overlap((h.claimed_at, h.ended_at) for h in leases) <= 2


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_several_dispatchers_sharing_one_backend_never_give_an_execution_two_live_leases(
        each_backend, each_ledger, tmp_path, supervisors):
    log = tmp_path / "effects.log"
    started = [supervisors.start(each_backend, concurrency=2) for _ in range(3)]
    ids = [f"shared-{i}" for i in range(24)]
    for execution_id in ids:
        admit(each_backend, execution_id, "sv.steps", {"log": str(log), "steps": 2, "sleep": 0.02})
    wait_until(lambda: completed(each_ledger, *ids), timeout=60, interval=0.1, message="every execution to complete")

    holders = set()
    all_leases = []
    for execution_id in ids:
        history = each_ledger.executions.history(execution_id)
        no_two_live_leases(history)
        assert history[-1].ended_by == "acknowledged" and history[-1].outcome == "completed"
        steps = [(key, attempt) for key, attempt, _ in step_tokens(each_backend, execution_id)]
        assert steps == [("s0", 1), ("s1", 1)]
        holders.update(h.holder for h in history)
        all_leases.extend(history)
    assert len(holders) >= 2, f"only {holders} claimed anything"
    for holder in holders:  # and each dispatcher kept to its own concurrency
        assert max_overlap((h.claimed_at, h.ended_at) for h in all_leases if h.holder == holder) <= 2

    for supervisor in started:
        supervisor.signal(signal.SIGTERM)
    assert [s.wait(20) for s in started] == [0, 0, 0]


def retry_input(tmp_path, **options) -> dict:
    return {"count_file": str(tmp_path / "deliveries"), "log": str(tmp_path / "effects.log"),
            "gate": str(tmp_path / "gate"), **options}


def waiting(log, token: int):
    """The `waiting` event of the delivery with `token`, once its `hold` step has started."""
    return next((e for e in read_log(log) if e.event == "waiting" and e.token == token), None)


@pytest.mark.timeout(60)
def test_a_delivery_replying_retry_releases_its_lease_and_counts_one_unacknowledged_delivery(
        each_backend, each_ledger, tmp_path, supervisors):
    options = retry_input(tmp_path, retries=1, hold_tokens=[2])
    admit(each_backend, "retry-once", "sv.retry", options)
    supervisor = supervisors.start(each_backend, concurrency=1)

    wait_until(lambda: waiting(options["log"], 2), message="the second delivery")
    record = each_ledger.executions.get("retry-once")
    assert (record.status, record.token, record.unacknowledged_deliveries) == ("running", 2, 1)
    first, second = each_ledger.executions.history("retry-once")
    assert (first.ended_by, first.outcome) == ("released", None)
    assert second.ended_by is None
    assert second.claimed_at - first.ended_at >= each_ledger.redelivery_delay(1)
    assert step_tokens(each_backend, "retry-once") == [("before", 1, 2)]  # the retried delivery wrote nothing
    assert "asked to retry: simulated busy database on delivery 1" in supervisor.log()

    Path(options["gate"]).touch()
    wait_until(lambda: completed(each_ledger, "retry-once"))
    assert each_ledger.executions.get("retry-once").unacknowledged_deliveries == 0


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_delivery_replying_retry_several_times_in_a_row_waits_a_non_zero_non_decreasing_delay(
        each_backend, each_ledger, tmp_path, supervisors):
    admit(each_backend, "retry-thrice", "sv.retry", retry_input(tmp_path, retries=3, hold_tokens=[]))
    supervisors.start(each_backend, concurrency=1)
    wait_until(lambda: completed(each_ledger, "retry-thrice"), timeout=40)

    history = each_ledger.executions.history("retry-thrice")
    assert [(h.token, h.ended_by, h.outcome) for h in history] == [
        (1, "released", None), (2, "released", None), (3, "released", None), (4, "acknowledged", "completed")]
    waits = [after.claimed_at - before.ended_at for before, after in zip(history, history[1:])]
    for n, waited in enumerate(waits, start=1):
        assert waited >= each_ledger.redelivery_delay(n) > 0, waits
    assert waits == sorted(waits), waits
    with open(tmp_path / "deliveries") as f:
        assert f.read().split() == ["1", "2", "3", "4"]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_an_acknowledgement_after_several_retry_replies_resets_the_count_and_the_next_wake_is_not_delayed(
        each_backend, each_ledger, tmp_path, supervisors):
    # Two retries, then a delivery acknowledged suspended on a short durable timer, then the
    # delivery that completes: the timer's wake waits out no redelivery delay.
    options = retry_input(tmp_path, retries=2, nap=0.3, hold_tokens=[4])
    admit(each_backend, "retry-twice", "sv.retry", options)
    supervisors.start(each_backend, concurrency=1)
    wait_until(lambda: waiting(options["log"], 4), timeout=20, message="the delivery after the timer")
    record = each_ledger.executions.get("retry-twice")
    assert (record.status, record.token, record.unacknowledged_deliveries) == ("running", 4, 0)
    Path(options["gate"]).touch()
    wait_until(lambda: completed(each_ledger, "retry-twice"), timeout=20)

    history = each_ledger.executions.history("retry-twice")
    assert [(h.token, h.ended_by, h.outcome) for h in history] == [
        (1, "released", None), (2, "released", None), (3, "acknowledged", "suspended"),
        (4, "acknowledged", "completed")]
    nap = json.loads(each_ledger.heap.read_step("retry-twice", "nap").step_response_json)["until"]
    assert history[3].claimed_at - max(nap, history[2].ended_at) < each_ledger.redelivery_delay(1), \
        "the wake after the acknowledgement waited out a redelivery delay"
    assert each_ledger.executions.get("retry-twice").unacknowledged_deliveries == 0


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_lease_expiring_after_a_retry_reply_counts_both_unacknowledged_deliveries(each_backend, each_ledger, tmp_path,
                                                                                   supervisors):
    options = retry_input(tmp_path, retries=1, hold_tokens=[2, 3])
    admit(each_backend, "retry-expire", "sv.retry", options)
    supervisors.start(each_backend, concurrency=1)

    second = wait_until(lambda: waiting(options["log"], 2), message="the second delivery")
    sigkill(second.pid)  # its lease is left to expire
    wait_gone([second.pid])
    wait_until(lambda: waiting(options["log"], 3), message="the third delivery")
    record = each_ledger.executions.get("retry-expire")
    assert (record.status, record.token, record.unacknowledged_deliveries) == ("running", 3, 2)
    history = each_ledger.executions.history("retry-expire")
    assert [(h.token, h.ended_by) for h in history] == [(1, "released"), (2, "superseded"), (3, None)]
    assert history[1].ended_at == history[1].expires_at
    assert history[2].claimed_at - history[1].ended_at >= each_ledger.redelivery_delay(2)

    Path(options["gate"]).touch()
    wait_until(lambda: completed(each_ledger, "retry-expire"))
    assert each_ledger.executions.get("retry-expire").unacknowledged_deliveries == 0


# -- renewal ------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_step_longer_than_three_lease_periods_completes_with_one_claim(
        each_backend, each_ledger, tmp_path, supervisors):
    lease_ms = 1200
    log = tmp_path / "effects.log"
    admit(each_backend, "slow", "sv.steps", {"log": str(log), "steps": 1, "sleep": 3.2 * lease_ms / 1000})
    supervisor = supervisors.start(each_backend, concurrency=1, lease_ms=lease_ms, renew_ms=300, until_idle=True,
                                   ready=False)
    assert supervisor.wait(40) == 0

    record = each_ledger.executions.get("slow")
    assert (record.status, record.token, record.unacknowledged_deliveries) == ("completed", 1, 0)
    (lease,) = each_ledger.executions.history("slow")
    assert (lease.token, lease.ended_by, lease.outcome) == (1, "acknowledged", "completed")
    assert lease.renewals >= 3
    assert lease.ended_at - lease.claimed_at > 3 * lease_ms
    assert [e.event for e in read_log(log)] == ["begin", "end"]


# -- idle, waking -------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_until_idle_exits_0_once_every_execution_is_terminal(each_backend, each_ledger, tmp_path, supervisors):
    log = tmp_path / "effects.log"
    ids = [f"idle-{i}" for i in range(3)]
    for execution_id in ids:
        admit(each_backend, execution_id, "sv.noop3")
    admit(each_backend, "idle-nap", "sv.nap", {"seconds": 1.0, "log": str(log)})  # due again later: not idle yet
    # Not this app's: never claimed, never failed, and not waited for (routing, SPEC section 11).
    admit(each_backend, "idle-unknown", "sv.no-such-workflow")

    supervisor = supervisors.start(each_backend, concurrency=2, until_idle=True, ready=False)
    assert supervisor.wait(30) == 0
    assert completed(each_ledger, *ids, "idle-nap")
    foreign = each_ledger.executions.get("idle-unknown")
    assert foreign.status == "admitted" and foreign.token == 0 and foreign.error_json is None
    assert [e.event for e in read_log(log)] == ["begin", "end"]
    assert "idle: nothing running and nothing due" in supervisor.log()

    again = supervisors.start(each_backend, concurrency=1, until_idle=True, ready=False)  # nothing to do at all
    assert again.wait(30) == 0


@pytest.mark.timeout(60)
def test_start_and_wake_reach_an_idle_supervisor_well_under_its_poll_interval(
        each_backend, each_ledger, tmp_path, supervisors):
    poll_ms = 30_000  # after its first claim, only a nudge can make it claim again within the test
    supervisors.start(each_backend, concurrency=1, poll_ms=poll_ms)
    for i in range(3):
        requested = each_ledger.clock()
        result = cli(each_backend, "start", "sv.noop3", "--id", f"nudged-{i}")
        assert result.returncode == 0, result.stderr
        wait_until(lambda: completed(each_ledger, f"nudged-{i}"), timeout=10)
        (lease,) = each_ledger.executions.history(f"nudged-{i}")
        assert lease.claimed_at - requested < 3000

    # A workflow asleep for an hour, woken by hand: the wake is delivered at once.
    admit(each_backend, "nudged-sleeper", "sv.nap", {"seconds": 3600, "log": str(tmp_path / "effects.log")})
    wait_until(lambda: each_ledger.executions.get("nudged-sleeper").status == "suspended", timeout=10)
    requested = each_ledger.clock()
    result = cli(each_backend, "wake", "nudged-sleeper")
    assert result.returncode == 0, result.stderr
    wait_until(lambda: len(each_ledger.executions.history("nudged-sleeper")) == 2
               and each_ledger.executions.get("nudged-sleeper").status == "suspended", timeout=10)
    assert each_ledger.executions.history("nudged-sleeper")[1].claimed_at - requested < 3000


# -- the command line ---------------------------------------------------------------------------

def record_keys() -> set[str]:
    return {f.name[: -len("_json")] if f.name.endswith("_json") else f.name
            for f in dataclasses.fields(ExecutionRecord)}


def assert_clean_error(result, code=None) -> None:
    assert result.returncode != 0
    if code is not None:
        assert result.returncode == code
    assert result.stderr.strip(), "no message on stderr"
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout


@pytest.mark.timeout(90)
def test_cli_commands_over_a_supervised_run(each_backend, tmp_path, supervisors, db_snapshot):
    result = cli(each_backend, "start", "sv.noop3", "--id", "order-1", "--input", '{"order": 1}')
    assert (result.returncode, result.stdout) == (0, "order-1\n"), result.stderr
    again = cli(each_backend, "start", "sv.noop3", "--id", "order-1", "--input", '{ "order" : 1 }')
    assert (again.returncode, again.stdout) == (0, "order-1\n"), again.stderr  # same input, as JSON
    generated = cli(each_backend, "start", "sv.noop3")
    assert generated.returncode == 0 and generated.stdout.strip()
    generated_id = generated.stdout.strip()

    before = db_snapshot(each_backend)
    conflict = cli(each_backend, "start", "sv.noop3", "--id", "order-1", "--input", '{"order": 2}')
    assert_clean_error(conflict)
    assert "order-1" in conflict.stderr
    bad_json = cli(each_backend, "start", "sv.noop3", "--id", "order-3", "--input", "{not json")
    assert_clean_error(bad_json)
    assert "--input" in bad_json.stderr
    assert db_snapshot(each_backend) == before
    fresh = tmp_path / "fresh.db"
    assert_clean_error(cli(fresh, "start", "sv.noop3", "--input", "[1,"))
    assert not fresh.exists()

    for command in (["get", "nope"], ["get", "nope", "--json"], ["steps", "nope"], ["history", "nope"],
                    ["wake", "nope"]):
        unknown = cli(each_backend, *command)
        assert_clean_error(unknown, code=1)
        assert "nope" in unknown.stderr
    assert db_snapshot(each_backend) == before

    admitted = json.loads(cli(each_backend, "ls", "--status", "admitted", "--json").stdout)
    assert [r["execution_id"] for r in admitted] == [generated_id, "order-1"]  # newest first
    assert cli(each_backend, "ls", "--status", "completed", "--json").stdout.strip() == "[]"

    supervisor = supervisors.start(each_backend, concurrency=1, until_idle=True, ready=False)
    assert supervisor.wait(30) == 0
    assert "delivery execution=order-1 token=1 outcome=completed" in supervisor.log()

    got = cli(each_backend, "get", "order-1", "--json")
    assert got.returncode == 0, got.stderr
    record = json.loads(got.stdout)
    # `get` adds what a waiting execution waits for, and whether a live supervisor serves it
    assert set(record) == record_keys() | {"waiting_for", "served"}
    assert record["waiting_for"] == []  # a completed execution waits for nothing
    assert record["served"] is False  # its supervisor exited: it is no longer live
    assert (record["input"], record["result"], record["error"]) == ({"order": 1}, "ok", None)
    assert (record["status"], record["token"], record["unacknowledged_deliveries"]) == ("completed", 1, 0)
    text = cli(each_backend, "get", "order-1")
    assert text.returncode == 0 and "completed" in text.stdout

    listed = json.loads(cli(each_backend, "ls", "--status", "completed", "--json").stdout)
    assert {r["execution_id"] for r in listed} == {"order-1", generated_id}
    assert all(set(r) == record_keys() for r in listed)
    assert cli(each_backend, "ls", "--status", "admitted", "--json").stdout.strip() == "[]"
    assert_clean_error(cli(each_backend, "ls", "--status", "bogus"))

    steps = json.loads(cli(each_backend, "steps", "order-1", "--json").stdout)
    heap_keys = {f.name[: -len("_json")] if f.name.endswith("_json") else f.name
                 for f in dataclasses.fields(HeapRecord)} | {"status"}
    assert [set(s) for s in steps] == [heap_keys] * 3
    assert [(s["step_key"], s["attempt"], s["done"], s["step_response"]) for s in steps] == [
        ("one", 1, True, {"value": None}), ("two", 1, True, {"value": None}), ("three", 1, True, {"value": None})]

    history = cli(each_backend, "history", "order-1")
    assert history.returncode == 0 and "token=1" in history.stdout and "acknowledged" in history.stdout
    (lease,) = json.loads(cli(each_backend, "history", "order-1", "--json").stdout)
    assert (lease["token"], lease["ended_by"], lease["outcome"]) == (1, "acknowledged", "completed")

    assert cli(each_backend, "wake", "order-1").returncode == 0  # a terminal execution ignores wakes
    assert json.loads(cli(each_backend, "get", "order-1", "--json").stdout)["due_at"] is None
    cli(each_backend, "start", "sv.noop3", "--id", "later")
    woken = cli(each_backend, "wake", "later", "--at", "123")
    assert woken.returncode == 0, woken.stderr
    assert json.loads(cli(each_backend, "get", "later", "--json").stdout)["due_at"] == 123

    script = Path(sys.executable).parent / "yieldstar"
    if script.exists():  # the console script is the same command line
        shown = subprocess.run([str(script), "--db", str(each_backend), "get", "later", "--json"], capture_output=True,
                               text=True, timeout=30)
        assert shown.returncode == 0 and json.loads(shown.stdout)["execution_id"] == "later"


# -- files --------------------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_the_database_files_and_nudge_socket_are_owner_only(tmp_path, supervisors):
    db = tmp_path / "private.db"
    supervisor = supervisors.start(db, concurrency=1, umask=0o022)
    result = cli(db, "start", "sv.noop3", "--id", "one", umask=0o022)
    assert result.returncode == 0, result.stderr

    def mode(path) -> int:
        return stat.S_IMODE(os.stat(path).st_mode)

    for suffix in ("", "-wal", "-shm"):
        path = Path(f"{db}{suffix}")
        wait_until(path.exists, message=f"{path} to exist")
        assert mode(path) == 0o600, (path, oct(mode(path)))
    folder = Path(nudge_dir(str(db)))
    assert mode(folder) == mode(folder.parent) == 0o700
    socket_path = folder / f"{supervisor.pid}.sock"
    assert stat.S_ISSOCK(os.stat(socket_path).st_mode)
    assert mode(socket_path) == 0o600

    other = tmp_path / "created-by-start.db"
    assert cli(other, "start", "sv.noop3", umask=0o022).returncode == 0
    assert mode(other) == 0o600


# -- deploys (SPEC section 11) ------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_a_replay_that_diverges_under_new_code_ends_its_delivery_parked_and_runs_nothing(
        each_backend, each_ledger, tmp_path, supervisors):
    """The execution charges under step key `charge`, then waits; the code deployed meanwhile
    names the step `charge-v2`. Its next delivery, in a worker process, ends as
    `Suspended(diverged=...)`: the supervisor receives the detail over the pipe and logs it, the
    execution is not failed, and neither the renamed step nor any later one runs."""
    log, code = tmp_path / "effects.log", tmp_path / "code.txt"
    code.write_text("charge")
    admit(each_backend, "deploy-1", "sv.deploy", {"code": str(code), "log": str(log), "seconds": 3600})
    supervisor = supervisors.start(each_backend, concurrency=1)
    wait_until(lambda: each_ledger.executions.get("deploy-1").status == "suspended", message="the first delivery")
    code.write_text("charge-v2")  # the deploy

    assert cli(each_backend, "wake", "deploy-1").returncode == 0
    supervisor.wait_log("diverged from its recorded steps")

    assert ("execution deploy-1 token 2 diverged from its recorded steps and is parked: recorded step 'charge'"
            " was next, but the code reached 'charge-v2'") in supervisor.log()
    record = each_ledger.executions.get("deploy-1")
    assert record.status == "suspended" and record.error_json is None and record.token == 2
    assert [(e.event, e.step_key) for e in read_log(log)] == [("begin", "charge"), ("end", "charge")]
    assert [s.step_key for s in each_ledger.executions.get_with_steps("deploy-1")[1]] == ["charge", "cool-off"]

    # Parked, not failed: nothing claims it, and it says what it waits for.
    wait_until(lambda: [w.kind for w in each_ledger.executions.waiting_for("deploy-1")] == ["code"],
               message="the execution parked")
    (reason,) = each_ledger.executions.waiting_for("deploy-1")
    assert "'charge-v2'" in reason.detail and reason.at is None
    assert each_ledger.executions.get("deploy-1").due_at is None

    # The code that recorded it comes back (a rollback): a supervisor that starts with it makes
    # the parked execution due again; its replay meets its records, and it waits for its timer
    # again, parked no more. The charge never ran twice.
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait() == 0
    code.write_text("charge")
    restarted = supervisors.start(each_backend, concurrency=1)
    restarted.wait_log("unparked 1 execution:")
    wait_until(lambda: [w.kind for w in each_ledger.executions.waiting_for("deploy-1")] == ["timer"],
               message="replayed to its timer")
    record = each_ledger.executions.get("deploy-1")
    assert record.status == "suspended" and record.token == 3 and record.due_at is not None
    assert [(e.event, e.step_key) for e in read_log(log)] == [("begin", "charge"), ("end", "charge")]
