"""The chaos harness and its invariant checker.

The fast tests hand-make small ledgers (through the ledger API with a fake clock, then, where a
violation is needed, by editing rows the way a broken runtime would have written them) and show
that the checker passes a sound one and catches each kind of damage: a checker that cannot fail
proves nothing. The slow test is a short seeded chaos run with every fault kind.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3

import psutil
import pytest

from supervisor import Completed, open_backend
from supervisor.chaos import ChaosConfig, FaultKind, check, parse_kinds, run_chaos, summary_lines
from supervisor.chaos.checker import main as checker_main
from supervisor.chaos.faults import FaultPlan
from supervisor.chaos.workload import plan_workload
from worker.chaos_app import COUNTER, STEP_LOG, digest, external_shard

LEASE = 1500


# -- hand-made ledgers -------------------------------------------------------------------------

class Ledger:
    """A small ledger written through the real API, driven by a fake clock, plus its evidence
    folder (step log, external system)."""

    def __init__(self, tmp_path, clock):
        self.folder = str(tmp_path)
        self.path = str(tmp_path / "ledger.db")
        self.clock = clock
        self.backend = open_backend(self.path, clock=clock)

    def admit(self, eid: str, plan: list) -> None:
        self.backend.executions.admit(eid, "chaos.mixed", json.dumps({"dir": self.folder, "plan": plan}))

    def claim(self):
        (lease,) = self.backend.executions.claim_due(limit=1, duration=LEASE)
        return lease

    def step(self, lease, key: str, value, *, attempt: int = 1):
        record = self.backend.heap.write_step(lease, step_key=key, step_attempt=attempt, done=True,
                                              step_response_json=json.dumps({"value": value}))
        return record

    def log(self, *fields) -> None:
        with open(os.path.join(self.folder, STEP_LOG), "a") as f:
            f.write(" ".join(str(x) for x in fields) + "\n")

    def run_step(self, lease, key: str, pid: int = 4242) -> dict:
        """A real-looking run of a `run` step: begin and end lines, then the recorded value."""
        value = {"token": lease.token, "pid": pid, "nonce": f"n{lease.token}{key}"}
        self.log("begin", lease.execution_id, lease.token, pid, key, self.clock.now * 1_000_000)
        self.log("end", lease.execution_id, lease.token, pid, key, self.clock.now * 1_000_000, value["nonce"])
        self.step(lease, key, value)
        self.log("saw", lease.execution_id, lease.token, pid, key, self.clock.now * 1_000_000, digest(value))
        return value

    def complete(self, lease, seen: dict) -> None:
        result = {"token": lease.token, "seen": seen}
        assert self.backend.executions.acknowledge(lease, Completed(json.dumps(result))).status == "completed"

    def sql(self, statement: str, *params) -> None:
        conn = sqlite3.connect(self.path)
        with conn:
            conn.execute(statement, params)
        conn.close()

    def check(self):
        return check(self.path, self.folder)


@pytest.fixture
def ledger(tmp_path, clock):
    made = Ledger(tmp_path, clock)
    yield made
    made.backend.close()


def sound_history(ledger: Ledger, eid: str = "e1") -> None:
    """Token 1 runs step a and is lost (its lease expires); token 2 replays a, runs b, completes."""
    ledger.admit(eid, [["run", "a", 0], ["run", "b", 0]])
    first = ledger.claim()
    a = ledger.run_step(first, "a")
    ledger.clock.advance(LEASE + 5_000)  # expired, and past the redelivery delay
    second = ledger.claim()
    assert second.token == 2
    ledger.log("saw", eid, 2, 4243, "a", ledger.clock.now * 1_000_000, digest(a))
    b = ledger.run_step(second, "b", pid=4243)
    ledger.complete(second, {"a": digest(a), "b": digest(b)})


def kinds(result) -> set:
    return set(result.violation_counts)


def test_a_sound_ledger_passes(ledger):
    sound_history(ledger)
    result = ledger.check()
    assert result.violations == []
    assert result.ok
    assert result.figures["executions"]["completed"] == 1
    assert result.figures["leases"]["deliveries_by_end"] == {"acknowledged": 1, "superseded": 1}
    assert "PASS" in summary_lines({"check": result.as_dict()})[-1]


def test_the_checker_runs_on_its_own(ledger, capsys):
    sound_history(ledger)
    assert checker_main([ledger.path, "--folder", ledger.folder]) == 0
    assert "RESULT: PASS" in capsys.readouterr().out
    ledger.sql("UPDATE lease_history SET ended_by = 'acknowledged', outcome = 'completed' WHERE token = 1")
    assert checker_main([ledger.path, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["violations_by_kind"] == {"stale_acknowledgement": 1}


def test_overlapping_leases_are_caught(ledger):
    sound_history(ledger)
    # Token 2 claimed while token 1's lease was still live: two holders at once.
    ledger.sql("UPDATE lease_history SET claimed_at = (SELECT claimed_at + 500 FROM lease_history"
               " WHERE execution_id = 'e1' AND token = 1) WHERE execution_id = 'e1' AND token = 2")
    result = ledger.check()
    assert "lease_overlap" in kinds(result)
    assert not result.ok
    assert "FAIL" in summary_lines({"check": result.as_dict()})[-1]


def test_a_stale_acknowledgement_is_caught(ledger):
    sound_history(ledger)
    # The superseded holder's completion recorded as the outcome, as a runtime without a fence would.
    ledger.sql("UPDATE lease_history SET ended_by = 'acknowledged', outcome = 'completed'"
               " WHERE execution_id = 'e1' AND token = 1")
    result = ledger.check()
    assert "stale_acknowledgement" in kinds(result)
    (violation,) = [v for v in result.violations if v.kind == "stale_acknowledgement"]
    assert "token 1" in violation.detail and "final token is 2" in violation.detail


def test_an_outcome_produced_by_an_older_holder_is_caught(ledger):
    sound_history(ledger)
    ledger.sql("UPDATE executions SET result_json = json_set(result_json, '$.token', 1) WHERE execution_id = 'e1'")
    assert "outcome_token" in kinds(ledger.check())


def test_a_duplicated_effect_is_caught(ledger):
    sound_history(ledger)
    effect_id = "e1/pay"
    ledger.backend.effects.begin(effect_id)
    ledger.backend.effects.settle(effect_id, json.dumps({"effect_id": effect_id, "receipt": "r1"}))
    path = external_shard(ledger.folder, effect_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:  # the external system ran it twice: an idempotency key was not honoured
        f.write(f"execute {effect_id} r1 4242 1 1\n")
        f.write(f"execute {effect_id} r2 4243 2 2\n")
    result = ledger.check()
    assert kinds(result) == {"effect_executed_twice"}
    assert result.figures["effects"]["max_executions_per_id"] == 2


def test_a_step_record_written_by_a_stale_holder_is_caught(ledger):
    ledger.admit("e1", [["run", "a", 0]])
    assert ledger.claim().token == 1
    ledger.clock.advance(LEASE + 5_000)
    second = ledger.claim()
    # Token 2 found no record of step a and ran it...
    ledger.log("begin", "e1", 2, 4243, "a", ledger.clock.now * 1_000_000)
    # ...but the record was written under token 1 after token 2's claim (forged: the fence refuses it).
    value = {"token": 1, "pid": 4242, "nonce": "late"}
    ledger.sql("INSERT INTO steps VALUES ('e1', 'a', 1, 1, ?, 1, ?)", json.dumps({"value": value}), ledger.clock.now)
    ledger.log("end", "e1", 1, 4242, "a", ledger.clock.now * 1_000_000, "late")
    ledger.complete(second, {"a": digest(value)})
    assert "stale_step_write" in kinds(ledger.check())


def test_a_step_record_changed_after_it_was_seen_is_caught(ledger):
    sound_history(ledger)
    ledger.sql("UPDATE steps SET step_response_json = json_set(step_response_json, '$.value.nonce', 'other')"
               " WHERE execution_id = 'e1' AND step_key = 'a'")
    assert {"step_value_changed", "step_value_unexplained"} <= kinds(ledger.check())


def test_lost_store_updates_and_stuck_executions_are_caught(ledger):
    ledger.backend.stores.get_or_create(COUNTER, "0")
    ledger.admit("e1", [["inc", "i"]])
    lease = ledger.claim()
    receipt = ledger.backend.stores.change(COUNTER, execution_id="e1", step_key="i", change=lambda n: (n + 1, n + 1))
    ledger.step(lease, "i", json.loads(receipt.result_json))
    ledger.complete(lease, {"i": digest(1)})
    ledger.admit("e2", [["run", "a", 0]])  # never delivered: stuck
    ledger.sql("UPDATE stores SET state_json = '2' WHERE name = ?", COUNTER)  # an increment applied twice
    result = ledger.check()
    assert {"counter_mismatch", "not_terminal"} <= kinds(result)
    assert not result.all_terminal and not result.ok


# -- the seeded plan -------------------------------------------------------------------------------

def test_the_same_seed_gives_the_same_workload_and_fault_plan(tmp_path):
    def draw(seed):
        rng = random.Random(seed)
        workload = plan_workload(rng, 50, 10.0, str(tmp_path), 1.5)
        plan = FaultPlan(rng, parse_kinds([]), interval_s=1.0, lease_s=1.5)
        return workload, [(plan.next_kind(), plan.gap(), plan.freeze_supervisor_s()) for _ in range(20)]

    assert draw(5) == draw(5)
    assert draw(5) != draw(6)
    workload, faults = draw(5)
    assert {kind for kind, _, _ in faults[:6]} == set(FaultKind)  # every kind in each round
    assert all(freeze > 1.5 for _, _, freeze in faults)  # frozen for longer than a lease


def test_fault_kinds_are_parsed_and_checked():
    assert parse_kinds(["kill_child,hold_write_lock"]) == (FaultKind.KILL_CHILD, FaultKind.HOLD_WRITE_LOCK)
    assert parse_kinds([]) == tuple(FaultKind)
    assert parse_kinds(["none"]) == ()
    with pytest.raises(ValueError, match="unknown fault kind"):
        parse_kinds(["kill_everything"])


# -- a real run ------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_short_chaos_run_loses_nothing(tmp_path, dump_on_hang):
    config = ChaosConfig(seed=20261202, duration_s=30, supervisors=3, concurrency=3, executions=300,
                         fault_interval_s=0.9, drain_timeout_s=150)
    lines = []
    report = run_chaos(config, folder=str(tmp_path / "chaos"), out=lines.append)
    check_ = report["check"]
    summary = "\n".join(summary_lines(report))
    assert check_["violations"] == [], summary
    assert check_["executions"]["not_terminal"] == 0, summary
    assert check_["executions"]["admitted_by_harness"] == 300
    assert report["ok"], summary
    injected = check_["faults"]["by_kind"]
    assert all(injected.get(kind.value, 0) >= 1 for kind in FaultKind), injected
    # Nothing the run started survives it.
    ledger = str(tmp_path / "chaos" / "ledger.db")
    survivors = []
    for process in psutil.process_iter(["cmdline"]):
        if ledger in " ".join(process.info["cmdline"] or []):
            survivors.append(process.pid)
    assert survivors == []


@pytest.fixture
def dump_on_hang():
    import faulthandler

    faulthandler.dump_traceback_later(235, exit=False)
    yield
    faulthandler.cancel_dump_traceback_later()
