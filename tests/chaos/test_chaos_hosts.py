"""`yieldstar chaos --hosts N`: supervisors in network namespaces on the run's own PostgreSQL
server, with partitions, frozen hosts, server restarts and hosts' skewed wall clocks (issue 14).

The fast tests hand the checker a small ledger (as tests/chaos/test_chaos.py does) with a fleet journal
of hosts and the journal of a host fault, and show which lost leases a partition, a frozen host
or a server restart explains, and that one of another host, or over before the lease was at
risk, explains nothing; and that the per-host figures and the takeover time after a partition
come out of them. The slow test is a short real run on three hosts with every kind: it needs root
and `ip` (skipped with a message otherwise; under `CI=true` that skip is a failure, as in
tests/chaos/test_hosts_partition.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from faults import ROOT, needs, wait_until
from supervisor.chaos import ChaosConfig, FaultKind, run_chaos, summary_lines
from supervisor.chaos import hosts as chaos_hosts
from supervisor.chaos.capabilities import applicable_kinds, kinds_not_offered
from supervisor.chaos.report import summary_lines as summary_of
from supervisor.chaos.takeovers import _spread
from supervisor.chaos.watch import StepWatcher
from supervisor.cli import EXIT_INTERRUPTED
from supervisor.ledger.errors import InvalidArgument
from supervisor.chaos import netns as multihost
from test_chaos import (Ledger, assert_messages_taken_once, assert_queue_limits_bound, assert_the_page_tells_the_story,
                        fault, sound_history)
from worker.apps.chaos import digest

HOST_KINDS = ("partition", "frozen_host", "server_restart")


def host_fleet(ledger: Ledger, *supervisors: tuple) -> None:
    """The fleet journal and config.json of a `--hosts` run: `(number, pid, host, wall_skew_ms)`."""
    with open(os.path.join(ledger.folder, "supervisors.jsonl"), "w") as f:
        for number, pid, host, wall_skew in supervisors:
            f.write(json.dumps({"event": "start", "number": number, "pid": pid, "at_ms": 0, "skew_ms": 0,
                                "host": host, "wall_skew_ms": wall_skew}) + "\n")
    with open(os.path.join(ledger.folder, "config.json"), "w") as f:
        json.dump({"lease_ms": 1500, "renew_ms": 300}, f)


def host_fault(ledger: Ledger, kind: str, at_ms: int, supervisors: list, **params) -> None:
    with open(os.path.join(ledger.folder, "faults.jsonl"), "a") as f:
        f.write(json.dumps({"kind": kind, "at_s": 0, "at_ms": at_ms, "target": {"host": 0, "supervisors": supervisors},
                            "step": None, "params": params}) + "\n")


def taken_over(ledger: Ledger):
    """`sound_history` on two hosts: token 1 (host 0's supervisor 1, claimed at 1_000_000, never
    renewed, expired at 1_001_500) is superseded by token 2 (host 1's supervisor 2, at 1_006_500)."""
    sound_history(ledger)
    ledger.sql("UPDATE lease_history SET holder = 'h:' || (110 + token)")
    host_fleet(ledger, (1, 111, 0, 0), (2, 112, 1, 20_000))
    return ledger.check()


def kinds(result) -> set:
    return {v.kind for v in result.violations}


def test_a_lease_lost_while_its_host_was_cut_off_is_explained_and_timed(chaos_ledger):
    host_fault(chaos_ledger, "partition", 1_000_200, [1], seconds=2.0, healed_ms=1_002_200)
    result = taken_over(chaos_ledger)
    assert result.violations == [] and result.ok
    takeovers = result.figures["takeovers"]
    assert takeovers["explained"]["holder_partitioned"] == 1
    assert takeovers["takeover_after"]["partition"] == {"count": 1, "median_ms": 6300, "p99_ms": 6300,
                                                       "max_ms": 6300}
    hosts = result.figures["hosts"]
    assert hosts[0]["leases_held"] == 1 and hosts[0]["lost_to_partition"] == 1
    assert hosts[1]["leases_held"] == 1 and hosts[1]["lost_to_partition"] == 0
    lines = "\n".join(summary_of({"check": result.as_dict(), "config": None}))
    assert "after a partition: median 6300 ms, p99 6300 ms" in lines


def test_a_partition_of_another_host_or_one_healed_long_before_explains_nothing(chaos_ledger):
    host_fault(chaos_ledger, "partition", 1_000_200, [2], seconds=2.0, healed_ms=1_002_200)  # the claimer's host
    host_fault(chaos_ledger, "partition", 990_000, [1], seconds=1.0, healed_ms=991_000)  # over before the claim
    assert kinds(taken_over(chaos_ledger)) == {"superseded_while_alive"}


@pytest.mark.parametrize("kind, params", [("partition", {"seconds": 2.0, "healed_ms": 1_002_900}),
                                          ("frozen_host", {"seconds": 2.0, "processes": 3})])
def test_a_host_fault_after_the_renewal_that_was_due_explains_nothing(chaos_ledger, kind, params):
    # Renewed (claimed) at 1_000_000, due again at 1_000_300: a cut or a freeze at 1_000_900 came
    # too late to stop that renewal; the lease was lost to something else.
    host_fault(chaos_ledger, kind, 1_000_900, [1], **params)
    assert kinds(taken_over(chaos_ledger)) == {"superseded_while_alive"}


def test_a_worker_killed_on_a_host_that_was_cut_off_later_is_a_worker_fault(chaos_ledger):
    fault(chaos_ledger, "kill_child", 1_000_100, step={"execution_id": "e1", "token": 1, "key": "a", "pid": 4242})
    host_fault(chaos_ledger, "partition", 1_000_200, [1], seconds=2.0, healed_ms=1_002_200)
    result = taken_over(chaos_ledger)
    assert result.figures["takeovers"]["explained"]["worker_fault"] == 1
    assert result.figures["hosts"][0]["lost_to_partition"] == 0


def test_a_lease_lost_while_its_host_was_frozen_is_explained(chaos_ledger):
    host_fault(chaos_ledger, "frozen_host", 999_900, [1], seconds=2.5, processes=4)
    result = taken_over(chaos_ledger)
    assert result.violations == []
    assert result.figures["takeovers"]["explained"]["host_frozen"] == 1
    assert result.figures["hosts"][0]["lost_to_freeze"] == 1


def test_a_server_down_past_the_lease_explains_a_lost_lease_and_a_short_restart_does_not(chaos_ledger):
    host_fault(chaos_ledger, "server_restart", 1_000_100, [], began_ms=1_000_100, stopped_ms=1_000_300,
               started_ms=1_001_400)
    assert taken_over(chaos_ledger).figures["takeovers"]["explained"]["server_down"] == 1


def test_a_short_server_restart_early_in_the_lease_explains_nothing(chaos_ledger):
    # Down 100 ms, 600 ms after the claim (no session of its claim killed), then two renewal
    # intervals to reconnect: the renewal due at 1_000_300 had 1_200 ms to come.
    host_fault(chaos_ledger, "server_restart", 1_000_600, [], began_ms=1_000_600, stopped_ms=1_000_650,
               started_ms=1_000_700)
    assert kinds(taken_over(chaos_ledger)) == {"superseded_while_alive"}


def test_stale_operations_of_a_cut_off_host_are_counted_after_healing(chaos_ledger):
    host_fault(chaos_ledger, "partition", 1_000_200, [1], seconds=2.0, healed_ms=1_002_200)
    os.makedirs(os.path.join(chaos_ledger.folder, "logs"), exist_ok=True)
    with open(os.path.join(chaos_ledger.folder, "logs", "supervisor-001.log"), "w") as f:
        f.write("worker 4242: execution e1 token 1: write of step b refused: the lease is lost\n"
                "delivery execution=e1 token=1 outcome=lost\n")
    hosts = taken_over(chaos_ledger).figures["hosts"]
    assert hosts[0]["stale_refused_after_partition"] == 2 and hosts[1]["stale_refused_after_partition"] == 0


def test_a_hosts_skewed_wall_clock_moves_only_the_step_logs_times(chaos_ledger):
    # Host 1's wall clock runs 20 s ahead: its step log times are 20 s ahead, its ledger times are
    # the server's. The timer check takes the log's times back by the wall skew, not the ledger's.
    chaos_ledger.admit("e1", [["sleep", "t", 0]])
    lease = chaos_ledger.claim()
    until = chaos_ledger.clock.now + 500
    chaos_ledger.backend.heap.write_step(lease, step_key="t", step_attempt=1, done=True,
                                   step_response_json=json.dumps({"until": until}))
    chaos_ledger.clock.advance(600)
    chaos_ledger.log("saw", "e1", 1, 4242, "t", (chaos_ledger.clock.now + 20_000) * 1_000_000, digest(None))
    chaos_ledger.sql("UPDATE lease_history SET holder = 'h:112'")
    host_fleet(chaos_ledger, (2, 112, 1, 20_000))
    assert "timer_early" not in kinds(chaos_ledger.check())
    host_fleet(chaos_ledger, (2, 112, 1, 20_700))  # had the clock run 20.7 s ahead, the timer fired early
    assert "timer_early" in kinds(chaos_ledger.check())


def test_the_step_watcher_reads_a_skewed_hosts_lines_on_its_clock(tmp_path):
    log = tmp_path / "steps.log"
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a process started just now
    try:
        me = psutil.Process(worker.pid)
        ahead_ns = 25_000 * 1_000_000
        log.write_text(f"begin e1 1 {me.pid} k1 {time.time_ns() - ahead_ns}\n")  # a clock 25 s behind
        watcher = StepWatcher(str(log))
        watcher.poll()
        assert watcher.inside(me) is None  # older than the process, by the harness's clock: not its line
        assert watcher.inside(me, skew_ms=-25_000).key == "k1"
    finally:
        worker.kill()
        worker.wait()


def test_takeover_times_are_spread_by_nearest_rank():
    assert _spread([]) == {"count": 0}
    assert _spread(list(range(1, 101))) == {"count": 100, "median_ms": 50, "p99_ms": 99, "max_ms": 100}
    assert _spread([7]) == {"count": 1, "median_ms": 7, "p99_ms": 7, "max_ms": 7}


# -- which kinds run where -------------------------------------------------------------------------

def test_host_kinds_are_offered_with_hosts_only(tmp_path, monkeypatch):
    assert set(HOST_KINDS) <= set(kinds_not_offered("postgres")) and "clock_skew" in kinds_not_offered("postgres")
    assert set(kinds_not_offered("postgres", hosts=2)) == {"hold_write_lock", "disk_full"}
    monkeypatch.setattr("supervisor.chaos.capabilities.wall_clock_shifted", lambda folder: None)
    config, left_out = applicable_kinds(ChaosConfig(hosts=2, supervisors=2), str(tmp_path))
    assert left_out == {}
    assert {k.value for k in config.faults} >= set(HOST_KINDS) | {"clock_skew", "connection_kill"}
    with pytest.raises(InvalidArgument, match=r"^partition does not run on a PostgreSQL ledger \(--hosts only"):
        applicable_kinds(ChaosConfig(faults=("partition",)), str(tmp_path), "postgresql://x@/y?host=/none")
    monkeypatch.setattr("supervisor.chaos.capabilities.wall_clock_shifted", lambda folder: "no gcc")
    config, left_out = applicable_kinds(ChaosConfig(hosts=2, supervisors=2), str(tmp_path))
    assert left_out == {"clock_skew": "no gcc"}


def test_each_host_runs_one_supervisor():
    with pytest.raises(InvalidArgument, match=r"supervisors \(3\) must equal hosts \(2\)"):
        ChaosConfig(hosts=2, supervisors=3)
    with pytest.raises(InvalidArgument, match="hosts must be an int in 0..64"):
        ChaosConfig(hosts=65, supervisors=65)


def test_hosts_without_root_says_why_and_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(chaos_hosts, "available", lambda: "creating network namespaces and veth pairs needs root")
    with pytest.raises(InvalidArgument, match="^--hosts cannot run here: creating network namespaces .* needs root"):
        run_chaos(ChaosConfig(hosts=2, supervisors=2, duration_s=1), folder=str(tmp_path / "chaos"))
    assert not (tmp_path / "chaos").exists()


@pytest.mark.timeout(60)
def test_the_cli_refuses_hosts_with_a_database_of_ones_own(tmp_path):
    done = subprocess.run([sys.executable, "-m", "supervisor.cli", "chaos", "--hosts", "2", "--db",
                           "postgresql://x@/y?host=/nonexistent", "--workdir", str(tmp_path / "chaos")],
                          capture_output=True, text=True, timeout=50, cwd=ROOT)
    assert done.returncode != 0
    why = multihost.available()
    expected = f"--hosts cannot run here: {why}" if why else "--hosts starts its own PostgreSQL server"
    assert expected in done.stderr, done.stderr


# -- a real run --------------------------------------------------------------------------------------

def _own_namespaces() -> list[str]:
    """This process's namespaces (`Hosts` names them after it): others may be running tests too."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    return [name for name in listed if name.startswith(f"ys-{os.getpid()}-")]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_short_chaos_run_on_three_hosts_loses_nothing(tmp_path, dump_on_hang):
    """Three hosts, one supervisor each (two workers), with partitions, frozen hosts, server
    restarts, killed sessions, hosts' skewed wall clocks and the process faults: about 45 s. (With
    two hosts, a fault that takes a supervisor out waits until both are healthy, and a slow start
    keeps one busy for many seconds: too few faults for a short run.)"""
    needs(multihost.available(), "multi-host chaos test")
    kinds = ("partition", "frozen_host", "server_restart", "connection_kill", "kill_child", "freeze_child",
             "kill_supervisor", "freeze_supervisor", "term_supervisor", "slow_start")
    from supervisor.chaos.wall_clock import available as wall_clock_available

    if wall_clock_available() is None:
        kinds += ("clock_skew",)
    config = ChaosConfig(seed=20261204, duration_s=30, hosts=3, supervisors=3, concurrency=2, executions=200,
                         faults=kinds, fault_interval_s=0.6, drain_timeout_s=60)
    lines = []
    report = run_chaos(config, folder=str(tmp_path / "chaos"), out=lines.append)
    check = report["check"]
    summary = "\n".join(summary_lines(report))
    assert check["violations"] == [] and check["total_violations"] == 0, summary
    assert check["executions"]["not_terminal"] == 0 and check["executions"]["admitted_by_harness"] == 200, summary
    assert report["ok"], summary
    injected = check["faults"]["by_kind"]
    assert injected.get("partition", 0) >= 1 and injected.get("frozen_host", 0) >= 1, injected
    assert injected.get("server_restart", 0) >= 1, injected
    assert set(check["hosts"]) == {0, 1, 2} and sum(h["leases_held"] for h in check["hosts"].values()) == \
        check["executions"]["deliveries"], summary
    assert_queue_limits_bound(check, summary)  # the claims of three hosts, each limit in one transaction
    page = assert_the_page_tells_the_story(report, [FaultKind(kind) for kind in injected])
    assert all(f">host {n}</text>" in page for n in range(3))  # a block of lanes per host
    assert_messages_taken_once(check, summary)  # sent over the server's Unix socket through every host fault
    # The server listened on the hosts' veths (and its Unix socket) only; all of it is gone now.
    harness = report["harness"]["hosts"]
    veths = {f"{v['database']}:5432" for v in harness["veths"].values()}
    assert set(harness["server_listening_on"]) == veths, harness
    assert _own_namespaces() == [], "a namespace of the run survived it"
    assert not [link for link in os.listdir("/sys/class/net") if link.startswith(f"ys{os.getpid():x}s")]
    survivors = [p.pid for p in psutil.process_iter(["cwd"]) if (p.info["cwd"] or "").startswith(str(tmp_path))]
    assert survivors == []  # every supervisor and worker ran in the work folder
    assert os.path.getsize(harness["dump"]) > 0
    print(summary)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_interrupted_run_on_hosts_tears_everything_down(tmp_path):
    """SIGINT in the middle of the faults (a partition or a freeze may be in progress): the
    harness exits 130, and its namespaces, veths, server and processes are gone."""
    needs(multihost.available(), "multi-host chaos test")
    folder = tmp_path / "chaos"
    out = tmp_path / "out.txt"
    with open(out, "wb") as sink:
        harness = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "chaos", "--hosts", "2", "--concurrency",
                                    "2", "--duration", "60", "--executions", "100", "--fault-interval-ms", "300",
                                    "--faults", "partition,frozen_host,kill_child", "--workdir", str(folder)],
                                   stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        wait_until(lambda: (folder / "faults.jsonl").exists() and (folder / "faults.jsonl").read_text().strip(),
                   timeout=90, message="the first fault")
        harness.send_signal(signal.SIGINT)
        assert harness.wait(60) == EXIT_INTERRUPTED, out.read_text()
    finally:
        if harness.poll() is None:
            harness.kill()
    text = out.read_text()
    assert "stopped by SIGINT during the faults phase" in text and "hosts, server and namespaces removed" in text, text
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"ys-{harness.pid}-" not in listed
    assert not [link for link in os.listdir("/sys/class/net") if link.startswith(f"ys{harness.pid:x}s")]
    assert not [run for run in os.listdir(multihost.RUNS) if run.startswith(f"{harness.pid}-")]
    assert [p.pid for p in psutil.process_iter(["cwd"]) if (p.info["cwd"] or "").startswith(str(folder))] == []
