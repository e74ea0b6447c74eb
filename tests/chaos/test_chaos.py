"""The chaos harness and its invariant checker.

The fast tests hand-make small ledgers (through the ledger API with a fake clock, then, where a
violation is needed, by editing rows the way a broken runtime would have written them) and show
that the checker passes a sound one and catches each kind of damage: a checker that cannot fail
proves nothing; a few of them run on both backends (`each_backend`), through the same reads. The
slow test is a short seeded chaos run with every fault kind of each backend: SQLite's, then
PostgreSQL's (on a throwaway server, a Unix socket only), `connection_kill` among them.
"""

from __future__ import annotations

import json
import os
import random
import re
import sqlite3
import subprocess
import sys
import threading
import time

import psutil
import pytest

from faults import ROOT, wait_until
from supervisor import Completed, Failed, Suspended, open_backend
from supervisor.chaos import ALL_KINDS, ChaosConfig, FaultKind, check, parse_kinds, run_chaos, summary_lines
from supervisor.chaos.checker import main as checker_main
from supervisor.chaos.cpu_waits import CPU_WAITS_LOG, CpuWaitSampler, read_cpu_waits
from supervisor.chaos.cpu_waits import available as cpu_waits_available
from supervisor.chaos.disk import LedgerDisk
from supervisor.chaos.faults import FaultPlan
from supervisor.chaos.capabilities import applicable_kinds
from supervisor.chaos.report import save
from supervisor.chaos.workload import KEYS, plan_workload
from supervisor.loop import RELEASE_LINE, RENEWAL_FOUND_LOST, STOP_LINE
from supervisor.ledger.backends import is_uri
from supervisor.ledger.errors import InvalidArgument, StorageError
from supervisor.chaos.watch import StepWatcher
from worker.apps.chaos import (
    COUNTER,
    IMPORT_DELAY_ENV,
    IMPORT_LOG_ENV,
    KEYED,
    LIMITED_QUEUES,
    MESSAGES,
    MIXED,
    MIXED_ASYNC,
    STEP_LOG,
    digest,
    external_shard,
)

LEASE = 1500


# -- hand-made ledgers -------------------------------------------------------------------------

class Ledger:
    """A small ledger written through the real API, driven by a fake clock, plus its evidence
    folder (step log, external system)."""

    def __init__(self, tmp_path, clock, target=None):
        self.folder = str(tmp_path)
        self.path = str(target or tmp_path / "ledger.db")
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
        """Edit rows as a broken runtime would have written them: `statement` is a template as the
        ledger's tables write theirs (`supervisor.ledger.dialect`), rendered for either backend."""
        if is_uri(self.path):
            import psycopg

            from supervisor.ledger.postgres.dialect import DIALECT

            with psycopg.connect(self.path) as conn:
                conn.execute(DIALECT.statements[statement], params or None)
            return
        from supervisor.ledger.sqlite.dialect import DIALECT

        conn = sqlite3.connect(self.path)
        with conn:
            conn.execute(DIALECT.statements[statement], params)
        conn.close()

    def check(self):
        return check(self.path, self.folder)


@pytest.fixture
def any_ledger(tmp_path, clock, each_backend):
    """A hand-made ledger on each backend in turn."""
    made = Ledger(tmp_path, clock, each_backend)
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


def test_a_sound_ledger_passes(any_ledger):
    ledger = any_ledger
    sound_history(ledger)
    result = ledger.check()
    assert result.violations == []
    assert result.ok
    assert result.figures["executions"]["completed"] == 1
    assert result.figures["leases"]["deliveries_by_end"] == {"acknowledged": 1, "superseded": 1}
    assert "PASS" in summary_lines({"check": result.as_dict()})[-1]


def test_the_checker_runs_on_its_own(any_ledger, capsys):
    ledger = any_ledger
    sound_history(ledger)
    assert checker_main([ledger.path, "--folder", ledger.folder]) == 0
    assert "RESULT: PASS" in capsys.readouterr().out
    ledger.sql("UPDATE lease_history SET ended_by = 'acknowledged', outcome = 'completed' WHERE token = 1")
    assert checker_main([ledger.path, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["violations_by_kind"] == {"stale_acknowledgement": 1}


def test_the_checker_names_a_ledger_it_cannot_read_in_one_line(tmp_path, capsys):
    missing = tmp_path / "none.db"
    assert checker_main([str(missing)]) == 2
    assert capsys.readouterr().err.splitlines() == [f"python -m supervisor.chaos: no ledger at {missing}"]
    assert not missing.exists()


def test_overlapping_leases_are_caught(any_ledger):
    ledger = any_ledger
    sound_history(ledger)
    # Token 2 claimed while token 1's lease was still live: two holders at once.
    ledger.sql("UPDATE lease_history SET claimed_at = (SELECT claimed_at + 500 FROM lease_history"
               " WHERE execution_id = 'e1' AND token = 1) WHERE execution_id = 'e1' AND token = 2")
    result = ledger.check()
    assert "lease_overlap" in kinds(result)
    assert not result.ok
    assert "FAIL" in summary_lines({"check": result.as_dict()})[-1]


def test_a_stale_acknowledgement_is_caught(any_ledger):
    ledger = any_ledger
    sound_history(ledger)
    # The superseded holder's completion recorded as the outcome, as a runtime without a fence would.
    ledger.sql("UPDATE lease_history SET ended_by = 'acknowledged', outcome = 'completed'"
               " WHERE execution_id = 'e1' AND token = 1")
    result = ledger.check()
    assert "stale_acknowledgement" in kinds(result)
    (violation,) = [v for v in result.violations if v.kind == "stale_acknowledgement"]
    assert "token 1" in violation.detail and "final token is 2" in violation.detail


def test_an_outcome_produced_by_an_older_holder_is_caught(chaos_ledger):
    sound_history(chaos_ledger)
    chaos_ledger.sql("UPDATE executions SET result_json = json_set(result_json, '$$.token', 1)"
                     " WHERE execution_id = 'e1'")
    assert "outcome_token" in kinds(chaos_ledger.check())


def test_a_duplicated_effect_is_caught(chaos_ledger):
    sound_history(chaos_ledger)
    effect_id = "e1/pay"
    chaos_ledger.backend.effects.begin(effect_id)
    chaos_ledger.backend.effects.settle(effect_id, json.dumps({"effect_id": effect_id, "receipt": "r1"}))
    path = external_shard(chaos_ledger.folder, effect_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:  # the external system ran it twice: an idempotency key was not honoured
        f.write(f"execute {effect_id} r1 4242 1 1\n")
        f.write(f"execute {effect_id} r2 4243 2 2\n")
    result = chaos_ledger.check()
    assert kinds(result) == {"effect_executed_twice"}
    assert result.figures["effects"]["max_executions_per_id"] == 2


def test_a_step_record_written_by_a_stale_holder_is_caught(chaos_ledger):
    chaos_ledger.admit("e1", [["run", "a", 0]])
    assert chaos_ledger.claim().token == 1
    chaos_ledger.clock.advance(LEASE + 5_000)
    second = chaos_ledger.claim()
    # Token 2 found no record of step a and ran it...
    chaos_ledger.log("begin", "e1", 2, 4243, "a", chaos_ledger.clock.now * 1_000_000)
    # ...but the record was written under token 1 after token 2's claim (forged: the fence refuses it).
    value = {"token": 1, "pid": 4242, "nonce": "late"}
    chaos_ledger.sql("INSERT INTO steps VALUES ('e1', 'a', 1, 1, $p, 1, $p)", json.dumps({"value": value}),
                     chaos_ledger.clock.now)
    chaos_ledger.log("end", "e1", 1, 4242, "a", chaos_ledger.clock.now * 1_000_000, "late")
    chaos_ledger.complete(second, {"a": digest(value)})
    assert "stale_step_write" in kinds(chaos_ledger.check())


def test_a_step_record_changed_after_it_was_seen_is_caught(chaos_ledger):
    sound_history(chaos_ledger)
    chaos_ledger.sql("UPDATE steps SET step_response_json = json_set(step_response_json, '$$.value.nonce', 'other')"
               " WHERE execution_id = 'e1' AND step_key = 'a'")
    assert {"step_value_changed", "step_value_unexplained"} <= kinds(chaos_ledger.check())


def test_lost_store_updates_and_stuck_executions_are_caught(any_ledger):
    ledger = any_ledger
    ledger.backend.stores.get_or_create(COUNTER, "0")
    ledger.admit("e1", [["inc", "i"]])
    lease = ledger.claim()
    receipt = ledger.backend.stores.change(COUNTER, execution_id="e1", step_key="i",
                                                 change=lambda n: (n + 1, n + 1))
    ledger.step(lease, "i", json.loads(receipt.result_json))
    ledger.complete(lease, {"i": digest(1)})
    ledger.admit("e2", [["run", "a", 0]])  # never delivered: stuck
    ledger.sql("UPDATE stores SET state_json = '2' WHERE name = $p", COUNTER)  # an increment applied twice
    result = ledger.check()
    assert {"counter_mismatch", "not_terminal"} <= kinds(result)
    assert not result.all_terminal and not result.ok


# -- failures, takeovers, shared ids, clocks ---------------------------------------------------

def error_json(type_: str, message: str) -> str:
    return json.dumps({"type": type_, "message": message, "traceback": None})


def fail(ledger: Ledger, eid: str, plan: list, error: str, *, fail_on_purpose: bool = False) -> None:
    ledger.backend.executions.admit(eid, "chaos.mixed", json.dumps({"dir": ledger.folder, "plan": plan,
                                                                    "fail": fail_on_purpose}))
    lease = ledger.claim()
    for key, step_error in (() if not plan or plan[0][0] != "retry" else [(plan[0][1], plan[0])]):
        ledger.backend.heap.write_step(lease, step_key=key, step_attempt=1, done=True,
                                             step_response_json=json.dumps({"error": {
                                                 "type": "RetryableError", "message": f"flaky step {key} (token 1)"},
                                                 "retry_at": None}))
    assert ledger.backend.executions.acknowledge(lease, Failed(error)).status == "failed"


def planned_failures(ledger: Ledger) -> None:
    """The failures chaos.mixed has on purpose: a deliberate one, and a flaky step out of retries."""
    fail(ledger, "f1", [["run", "a", 0]], error_json("ChaosFailure", "deliberate failure (token 1)"),
         fail_on_purpose=True)
    fail(ledger, "f2", [["retry", "r", 0, 0.4, 3, 0.1]], error_json(
        "ChaosFailure", "step 'r' failed after 3 attempt(s): RetryableError: flaky step r (token 1) (token 1)"))


def test_planned_failures_are_not_infrastructure_failures(chaos_ledger):
    planned_failures(chaos_ledger)
    result = chaos_ledger.check()
    assert result.violations == []
    assert result.figures["failures"] == {"failed": 2, "planned": 2, "step_errors": 1}


def test_an_execution_failed_by_the_storage_is_caught(chaos_ledger):
    planned_failures(chaos_ledger)
    # A full disk reported as the workflow's outcome, in each of the shapes it can take.
    fail(chaos_ledger, "s1", [["run", "a", 0]], error_json("StorageUnavailable", "database or disk is full"))
    fail(chaos_ledger, "s2", [["run", "a", 0]], error_json("OperationalError", "disk I/O error"))
    fail(chaos_ledger, "s3", [["inc", "i"]], error_json("ChaosFailure", "step 'i' failed after 1 attempt(s):"
                                                  " StorageBusy: database is locked (token 1)"))
    # not asked for:
    fail(chaos_ledger, "s4", [["run", "a", 0]], error_json("ChaosFailure", "deliberate failure (token 1)"))
    fail(chaos_ledger, "s5", [["run", "a", 0]], error_json("ReplayDiverged", "the workflow took another path"))
    result = chaos_ledger.check()
    assert kinds(result) == {"failed_by_infrastructure", "outcome_token"}  # s1, s2, s5 name no token either
    found = [v for v in result.violations if v.kind == "failed_by_infrastructure"]
    assert sorted(v.execution_id for v in found) == ["s1", "s2", "s3", "s4", "s5"]
    assert "names the storage" in next(v.detail for v in found if v.execution_id == "s1")
    assert result.figures["failures"]["planned"] == 2


def test_a_storage_error_recorded_as_a_step_error_is_caught(chaos_ledger):
    chaos_ledger.admit("e1", [["effect", "pay", 0, 0]])
    lease = chaos_ledger.claim()
    chaos_ledger.backend.heap.write_step(lease, step_key="pay", step_attempt=1, done=False,
                                         step_response_json=json.dumps({"error": {
                                             "type": "StorageUnavailable", "message": "database or disk is full"},
                                             "retry_at": 1}))
    chaos_ledger.complete(lease, {})
    result = chaos_ledger.check()
    assert kinds(result) == {"failed_by_infrastructure"}
    assert "step pay attempt 1 recorded StorageUnavailable" in result.violations[0].detail


def fleet(ledger: Ledger, *supervisors: tuple) -> None:
    """The fleet journal and config.json of a run: `(number, pid, skew_ms)` per supervisor."""
    with open(os.path.join(ledger.folder, "supervisors.jsonl"), "w") as f:
        for number, pid, skew in supervisors:
            f.write(json.dumps({"event": "start", "number": number, "pid": pid, "at_ms": 0, "skew_ms": skew}) + "\n")
    with open(os.path.join(ledger.folder, "config.json"), "w") as f:
        json.dump({"lease_ms": LEASE, "renew_ms": 300}, f)


def fault(ledger: Ledger, kind: str, at_ms: int, *, step=None, supervisor: int = 1, **params) -> None:
    target = {"supervisor": supervisor, "supervisor_pid": os.getpid(), "worker_pid": params.pop("worker_pid", 4242),
              "pid": params.pop("holder_pid", None), "replacement": params.pop("replacement", None),
              "in_steps": params.pop("in_steps", [])}
    with open(os.path.join(ledger.folder, "faults.jsonl"), "a") as f:
        f.write(json.dumps({"kind": kind, "at_s": 0, "at_ms": at_ms, "target": target, "step": step,
                            "params": params}) + "\n")


def hold_lock(ledger: Ledger, start_ms: int, end_ms: int, pid: int = 77) -> None:
    fault(ledger, "hold_write_lock", start_ms - 50, holder_pid=pid, seconds=(end_ms - start_ms) / 1000)
    os.makedirs(os.path.join(ledger.folder, "logs"), exist_ok=True)
    with open(os.path.join(ledger.folder, "logs", "lock-holders.log"), "a") as f:
        f.write(f"held {pid} {start_ms * 1_000_000}\nreleased {pid} {end_ms * 1_000_000}\n")


def takeover(ledger: Ledger):
    """`sound_history` (token 1, claimed at 1_000_000 and never renewed, is superseded: its lease
    expired at 1_001_500) under a one-supervisor fleet; the checker's verdict on it."""
    sound_history(ledger)
    fleet(ledger, (1, os.getpid(), 0))
    return ledger.check()


def test_a_lease_lost_by_a_live_holder_is_caught(chaos_ledger):
    result = takeover(chaos_ledger)
    assert kinds(result) == {"superseded_while_alive"}
    assert "token 1 of supervisor 1" in result.violations[0].detail
    assert result.figures["takeovers"]["unexplained"] == 1


def test_a_lease_lost_to_a_killed_or_frozen_worker_is_explained(chaos_ledger):
    fault(chaos_ledger, "kill_child", 1_000_300, step={"execution_id": "e1", "token": 1, "key": "a", "pid": 4242})
    result = takeover(chaos_ledger)
    assert result.violations == []
    assert result.figures["takeovers"]["explained"]["worker_fault"] == 1


def test_a_worker_frozen_just_before_it_was_handed_the_delivery_explains_the_takeover(chaos_ledger):
    fault(chaos_ledger, "freeze_child", 1_000_000 - 900, seconds=3)  # still frozen at the claim
    assert takeover(chaos_ledger).violations == []


def test_a_worker_frozen_just_after_it_moved_on_from_the_step_the_journal_names_explains_the_takeover(chaos_ledger):
    # The injector saw the worker on another execution's step; the signal landed once it had
    # been handed e1 (the step log shows only this worker on e1).
    fault(chaos_ledger, "freeze_child", 1_000_005, seconds=3, step={"execution_id": "e0", "token": 1, "key": "k2",
                                                             "pid": 4242})
    assert takeover(chaos_ledger).figures["takeovers"]["explained"]["worker_fault"] == 1


def test_a_worker_thawed_before_the_claim_explains_nothing(chaos_ledger):
    fault(chaos_ledger, "freeze_child", 1_000_000 - 3_900, seconds=3)
    assert kinds(takeover(chaos_ledger)) == {"superseded_while_alive"}


def test_a_worker_fault_between_steps_explains_only_its_own_delivery(chaos_ledger):
    fault(chaos_ledger, "freeze_child", 1_000_300, worker_pid=5151, seconds=3)  # the step log says 4242 ran it
    assert kinds(takeover(chaos_ledger)) == {"superseded_while_alive"}


def test_a_lease_lost_to_its_frozen_or_killed_supervisor_is_explained(chaos_ledger):
    fault(chaos_ledger, "freeze_supervisor", 1_000_800, seconds=2.5)
    assert takeover(chaos_ledger).figures["takeovers"]["explained"]["holder_frozen"] == 1


def test_a_supervisor_killed_after_its_lease_was_lost_explains_nothing(chaos_ledger):
    fault(chaos_ledger, "kill_supervisor", 1_003_000)
    assert kinds(takeover(chaos_ledger)) == {"superseded_while_alive"}


def test_a_lock_held_past_the_lease_explains_the_lost_lease(chaos_ledger):
    hold_lock(chaos_ledger, 1_000_200, 1_001_700)
    result = takeover(chaos_ledger)
    assert result.violations == []
    assert result.figures["takeovers"]["explained"]["stall"] == 1


def test_a_lock_shorter_than_the_lease_explains_nothing(chaos_ledger):
    hold_lock(chaos_ledger, 1_000_200, 1_000_900)  # 700 ms: the lease had 800 ms left after it
    assert kinds(takeover(chaos_ledger)) == {"superseded_while_alive"}


def shared_takeover(ledger: Ledger, *log_lines: str):
    """`takeover` in a run with `--workers 2`: each worker held several deliveries, and the
    supervisor logged `log_lines` (made with the loop's own templates)."""
    sound_history(ledger)
    fleet(ledger, (1, os.getpid(), 0))
    with open(os.path.join(ledger.folder, "config.json"), "w") as f:
        json.dump({"lease_ms": LEASE, "renew_ms": 300, "concurrency": 8, "workers": 2}, f)
    os.makedirs(os.path.join(ledger.folder, "logs"), exist_ok=True)
    with open(os.path.join(ledger.folder, "logs", "supervisor-001.log"), "a") as f:
        f.writelines(f"2026-12-05 07:00:00,000 yieldstar[{os.getpid()}] {line}\n" for line in log_lines)
    return ledger.check()


def test_a_delivery_of_a_killed_worker_that_held_several_is_explained_though_the_kill_aimed_at_another(
        chaos_ledger):
    # The injector saw worker 4242 inside a step of e0; it held e1 too, and its supervisor
    # released both when it found the worker killed.
    fault(chaos_ledger, "kill_child", 1_000_300, step={"execution_id": "e0", "token": 1, "key": "k1", "pid": 4242},
          in_steps=[["e0", 1]])
    why = "worker pid 4242 killed by SIGKILL mid-delivery"
    result = shared_takeover(chaos_ledger, RELEASE_LINE % ("e0", 1, why), RELEASE_LINE % ("e1", 1, why))
    assert result.violations == []
    assert result.figures["takeovers"]["explained"]["worker_fault"] == 1
    assert result.figures["takeovers"]["workers"]["released_with_their_worker"] == {"exited": 2}


def test_a_delivery_the_fault_journal_names_among_a_frozen_workers_many_is_explained(chaos_ledger):
    fault(chaos_ledger, "freeze_child", 1_000_300, seconds=3,
          step={"execution_id": "e0", "token": 1, "key": "k1", "pid": 4242}, in_steps=[["e0", 1], ["e1", 1]])
    assert shared_takeover(chaos_ledger).figures["takeovers"]["explained"]["worker_fault"] == 1


def test_a_delivery_superseded_while_its_worker_was_alive_and_heard_is_caught(chaos_ledger):
    # Worker 5151 of the same supervisor was killed with its deliveries; e1 ran on 4242, which
    # its supervisor still heard: it told 4242 to stop e1 once its renewal found the lease lost.
    fault(chaos_ledger, "kill_child", 1_000_300, worker_pid=5151,
          step={"execution_id": "e0", "token": 1, "key": "k1", "pid": 5151}, in_steps=[["e0", 1]])
    result = shared_takeover(chaos_ledger,
                             RELEASE_LINE % ("e0", 1, "worker pid 5151 killed by SIGKILL mid-delivery"),
                             STOP_LINE % ("e1", 1, RENEWAL_FOUND_LOST, 4242))
    assert kinds(result) == {"superseded_while_alive"}
    assert result.figures["takeovers"]["workers"]["stopped_one_at_a_time"] == {"lease_lost": 1}


def test_a_worker_named_by_its_supervisor_for_a_delivery_counts_beside_the_step_log(chaos_ledger):
    # The step log says 4242 ran e1, but its supervisor also told 6161 to stop it: a kill of 4242
    # alone does not explain it.
    fault(chaos_ledger, "kill_child", 1_000_300, step={"execution_id": "e0", "token": 1, "key": "k1", "pid": 4242})
    result = shared_takeover(chaos_ledger, STOP_LINE % ("e1", 1, RENEWAL_FOUND_LOST, 6161))
    assert kinds(result) == {"superseded_while_alive"}


def test_a_delivery_released_with_a_worker_replaced_for_a_sibling_that_would_not_stop_is_explained(chaos_ledger):
    why = "worker pid 4242 replaced: a delivery of it did not stop"
    result = shared_takeover(chaos_ledger, STOP_LINE % ("e0", 1, RENEWAL_FOUND_LOST, 4242),
                             RELEASE_LINE % ("e0", 1, why), RELEASE_LINE % ("e1", 1, why))
    assert result.violations == []
    assert result.figures["takeovers"]["explained"]["worker_replaced"] == 1
    assert result.figures["takeovers"]["workers"]["released_with_their_worker"] == {"sibling_unstoppable": 2}


def test_a_worker_replaced_by_another_supervisor_explains_nothing(chaos_ledger):
    why = "worker pid 4242 replaced: a delivery of it did not stop"
    sound_history(chaos_ledger)
    fleet(chaos_ledger, (1, os.getpid(), 0))
    os.makedirs(os.path.join(chaos_ledger.folder, "logs"), exist_ok=True)
    with open(os.path.join(chaos_ledger.folder, "logs", "supervisor-002.log"), "w") as f:
        f.write("2026-12-05 07:00:00,000 yieldstar[1] " + RELEASE_LINE % ("e1", 1, why) + "\n")
    assert kinds(chaos_ledger.check()) == {"superseded_while_alive"}


def effect_step(ledger: Ledger, eid: str, key: str, effect_id: str, receipt: str) -> None:
    ledger.admit(eid, [["effect", key, 0, 0]])
    lease = ledger.claim()
    if ledger.backend.effects.begin(effect_id).status != "settled":
        ledger.backend.effects.settle(effect_id, json.dumps({"effect_id": effect_id, "receipt": receipt}))
        verb = f"execute {effect_id} {receipt} 4242 1 1"
    else:
        verb = f"repeat {effect_id} 4242 1 1"
    path = external_shard(ledger.folder, effect_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        f.write(f"{verb} {eid} {key}\n")
    kept = json.loads(ledger.backend.effects.begin(effect_id).result_json)
    ledger.step(lease, key, kept)
    ledger.complete(lease, {key: digest(kept)})


def test_a_session_killed_as_the_claim_committed_explains_a_lease_never_renewed(chaos_ledger):
    # Its holder may have been told the claim failed: it never knew it held the lease.
    fault(chaos_ledger, "connection_kill", 1_000_000 + 120)
    result = takeover(chaos_ledger)
    assert result.violations == []
    assert result.figures["takeovers"]["explained"]["claim_unanswered"] == 1


def test_a_session_killed_later_in_the_delivery_explains_nothing(chaos_ledger):
    fault(chaos_ledger, "connection_kill", 1_000_000 + 900)  # the call it met was retried on a new connection
    assert kinds(takeover(chaos_ledger)) == {"superseded_while_alive"}


def test_a_late_kill_of_a_slow_started_worker_that_ran_the_delivery_explains_the_takeover(chaos_ledger):
    # The harness saw worker 4242 still loading the app; by the time its SIGKILL landed, the
    # worker had loaded it and run step a of the delivery (the step log says so): killed mid-delivery.
    fault(chaos_ledger, "slow_start", 1_000_000 - 3_000, supervisor=7, replacement=1,
          workers_killed=[{"pid": 4242, "at_ms": 1_000_000 - 100, "importing_for_ms": 3_800}])
    assert takeover(chaos_ledger).figures["takeovers"]["explained"]["worker_fault"] == 1


def test_a_slow_started_worker_killed_while_another_ran_the_delivery_explains_nothing(chaos_ledger):
    fault(chaos_ledger, "slow_start", 1_000_000 - 3_000, supervisor=7, replacement=1,
          workers_killed=[{"pid": 5151, "at_ms": 1_000_000 - 100, "importing_for_ms": 3_800}])
    assert kinds(takeover(chaos_ledger)) == {"superseded_while_alive"}


def cpu_waits(ledger: Ledger, pid: int, waits: list) -> None:
    """The harness's samples of `pid` (`cpu_waits`): `(true ms, ms its thread 1 waited for a CPU so far)`."""
    os.makedirs(os.path.join(ledger.folder, "logs"), exist_ok=True)
    with open(os.path.join(ledger.folder, CPU_WAITS_LOG), "a") as f:
        f.writelines(f"{at} {pid} 1:{waited} 2:0\n" for at, waited in waits)


def waiting(share: int, start: int = 1_000_000, end: int = 1_001_500) -> list:
    """Samples every 100 ms from `start` to `end` (by default token 1's lease), its thread kept
    off the CPU for `share` ms of each 100."""
    return [(start + 100 * k, 5 + share * k) for k in range((end - start) // 100 + 1)]


def test_a_lease_lost_by_a_holder_kept_off_the_cpu_is_explained_by_starvation(chaos_ledger):
    # 90 ms of every 100 waiting for a CPU, by the kernel's count: 1,260 ms of the lease for
    # certain (a wait counted in the first interval may have begun before it), 600 would do.
    cpu_waits(chaos_ledger, os.getpid(), waiting(90))
    result = takeover(chaos_ledger)
    assert result.violations == []
    assert result.figures["takeovers"]["explained"]["holder_starved"] == 1
    assert result.figures["takeovers"]["cpu_waits_sampled"]


def test_a_lease_lost_by_a_holder_that_got_the_cpu_is_still_caught(chaos_ledger):
    cpu_waits(chaos_ledger, os.getpid(), waiting(20))  # 280 ms of waiting: it could have renewed
    cpu_waits(chaos_ledger, 4343, waiting(95))  # another process starved: not the holder's evidence
    result = takeover(chaos_ledger)
    assert kinds(result) == {"superseded_while_alive"}
    assert "having waited for a CPU for 280 ms or more (600 would excuse it)" in result.violations[0].detail
    assert result.figures["takeovers"]["explained"]["holder_starved"] == 0


def test_a_supervisor_starved_just_before_its_last_renewal_explains_the_worker_that_left_it(chaos_ledger):
    # Kept off the CPU for 0.8 s up to 400 ms into the lease, the supervisor beat none of its
    # workers; the worker left for want of heartbeats, and the lease was left to expire.
    cpu_waits(chaos_ledger, os.getpid(), waiting(90, 999_600, 1_000_400))
    assert kinds(takeover(chaos_ledger)) == {"superseded_while_alive"}  # 270 ms of it after the renewal: not enough
    with open(os.path.join(chaos_ledger.folder, "logs", "supervisor-001.log"), "a") as f:
        f.write(f"2026-12-05 03:31:30,194 yieldstar[{os.getpid()}] execution e1 token 1: worker pid 4242 lost its"
                " supervisor (exit code 4) mid-delivery; its lease is left to expire\n")
    result = chaos_ledger.check()
    assert result.violations == []
    assert result.figures["takeovers"]["explained"]["holder_starved"] == 1


def test_a_wait_that_may_have_begun_before_the_lease_explains_nothing(chaos_ledger):
    # The kernel counts a wait when it ends: 1,400 ms counted at 1_000_100 may all have been
    # waited before the claim, and the holder never waited again.
    cpu_waits(chaos_ledger, os.getpid(), [(999_900, 0), (1_000_100, 1_400), (1_001_500, 1_400)])
    assert kinds(takeover(chaos_ledger)) == {"superseded_while_alive"}


def test_the_harness_journals_how_long_each_thread_waited_for_a_cpu(tmp_path):
    if not cpu_waits_available():
        pytest.skip("this kernel keeps no run-queue waits (/proc/<pid>/task/<tid>/schedstat)")
    (tmp_path / "logs").mkdir()
    sampler = CpuWaitSampler(str(tmp_path))
    sampler.sample([os.getpid(), 2 ** 22 + 1])  # the second is no process: left out
    sampler.close()
    ((at_ms, threads),) = read_cpu_waits(str(tmp_path)).samples[os.getpid()]
    assert threading.get_native_id() in threads
    assert abs(at_ms - time.time_ns() // 1_000_000) < 60_000


def test_effect_ids_of_one_execution_each_pass(chaos_ledger):
    effect_step(chaos_ledger, "cust", "7/charge", "cust/7/charge", "r1")
    effect_step(chaos_ledger, "cust/7", "charge", "cust%2F7/charge", "r2")
    result = chaos_ledger.check()
    assert result.violations == [] and result.ok
    assert result.figures["effects"]["owners_checked"] == 2


def test_an_effect_id_shared_by_two_executions_is_caught(chaos_ledger):
    # The encoding `execution/key` maps both to one id: the provider charged once, for two customers.
    effect_step(chaos_ledger, "cust", "7/charge", "cust/7/charge", "r1")
    effect_step(chaos_ledger, "cust/7", "charge", "cust/7/charge", "r2")
    result = chaos_ledger.check()
    assert kinds(result) == {"effect_id_shared"}
    assert "('cust', '7/charge'), ('cust/7', 'charge')" in result.violations[0].detail


def start_step(ledger: Ledger, eid: str, key: str, child: str, child_plan: list) -> None:
    ledger.admit(eid, [["child", key, child_plan]])
    lease = ledger.claim()
    child_id = ledger.backend.starts.start(child, "chaos.mixed", json.dumps({"dir": ledger.folder,
                                                                          "plan": child_plan}))
    ledger.step(lease, key, child_id)
    ledger.complete(lease, {key: digest(child_id)})
    if ledger.backend.executions.get(child_id).status != "completed":
        ledger.complete(ledger.claim(), {})


def test_a_start_id_shared_by_two_executions_is_caught(chaos_ledger):
    start_step(chaos_ledger, "cust", "7/ship", "cust/7/ship", [])
    start_step(chaos_ledger, "cust/7", "ship", "cust%2F7/ship", [["run", "k1", 0]])
    assert chaos_ledger.check().violations == []
    start_step(chaos_ledger, "cust/8", "ship", "cust/7/ship", [["inc", "k1"]])  # handed cust's child
    result = chaos_ledger.check()
    assert kinds(result) == {"start_id_shared"}
    details = sorted(v.detail for v in result.violations)
    assert details == ["child cust/7/ship was started by 2 steps: [('cust', '7/ship'), ('cust/8', 'ship')]",
                       "step ship started cust/7/ship, which runs another start's plan"]


def skewed_redelivery(ledger: Ledger, first_skew: int, second_skew: int, *, journal: tuple = None):
    """Token 1, held by a supervisor whose clock runs `first_skew` ahead, suspends at true time
    1_000_100; token 2 is claimed at true 1_000_150 by one `second_skew` ahead (a child's wake made
    the execution due at once, by a third clock). The ledger's times are each holder's own; the
    fleet journal says the skews were `journal` (by default, what they were)."""
    ledger.admit("e1", [["sleep", "t", 0]])
    (first,) = ledger.backend.executions.claim_due(limit=1, duration=LEASE, now=1_000_000 + first_skew)
    ledger.backend.executions.acknowledge(first, Suspended(), now=1_000_100 + first_skew)
    ledger.backend.executions.request_wake("e1", 1_000_150 + min(first_skew, second_skew) - 1)
    (second,) = ledger.backend.executions.claim_due(limit=1, duration=LEASE, now=1_000_150 + second_skew)
    ledger.backend.executions.acknowledge(second, Completed(json.dumps({"token": 2, "seen": {}})),
                                          now=1_000_200 + second_skew)
    ledger.sql("UPDATE lease_history SET holder = 'h:' || (110 + token)")
    first_journal, second_journal = journal or (first_skew, second_skew)
    fleet(ledger, (1, 111, first_journal), (2, 112, second_journal))
    return ledger.check()


def test_ledger_times_of_skewed_clocks_are_compared_in_true_time(chaos_ledger):
    result = skewed_redelivery(chaos_ledger, 400, -400)
    assert result.violations == [] and result.ok  # raw, token 2's claim is 650 ms before token 1's end


def test_a_claim_before_the_previous_delivery_ended_is_caught_across_clocks(chaos_ledger):
    # The same ledger, but the clocks were true: token 2 was claimed before token 1 was acknowledged.
    assert {"token_sequence", "lease_overlap"} <= kinds(skewed_redelivery(chaos_ledger, 400, -400, journal=(0, 0)))


def test_a_disk_full_burst_fails_ledger_writes_until_it_ends(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("disk_full mounts a tmpfs: it needs root")
    disk = LedgerDisk(str(tmp_path), 16)
    disk.mount()
    try:
        with open_backend(disk.db_path) as backend:
            disk.pin()
            assert os.path.exists(disk.db_path + "-shm")
            burst = disk.burst(1.0)
            wait_until(lambda: burst.full_ns, timeout=10, message="the tmpfs to be full")
            failed = None
            for n in range(1000):  # every commit must grow the -wal now, and cannot
                try:
                    backend.executions.admit(f"e{n}", "w", json.dumps("x" * 10_000))
                except StorageError as exc:
                    failed = exc
                    break
            assert failed is not None and failed.kind == "unavailable" and failed.transient, failed
            assert burst.freed_ns == 0, "the write failed while the disk was full"
            burst.join()
            assert burst.error is None and burst.wal_truncated
            backend.executions.admit("after", "w")  # the disk is free again
        disk.copy_out(str(tmp_path / "copy.db"))
    finally:
        assert disk.unmount() is None
    assert not os.path.ismount(disk.mount_point)
    copy = sqlite3.connect(tmp_path / "copy.db")
    assert copy.execute("SELECT count(*) FROM executions WHERE execution_id = 'after'").fetchone() == (1,)
    copy.close()
    assert os.stat(tmp_path / "copy.db").st_mode & 0o077 == 0


def test_a_slow_start_logs_the_import_of_the_app(tmp_path):
    log = tmp_path / "imports.log"
    env = dict(os.environ, **{IMPORT_DELAY_ENV: "300", IMPORT_LOG_ENV: str(log)})
    child = subprocess.run([sys.executable, "-c", "import worker.apps.chaos"], env=env, timeout=60)
    assert child.returncode == 0
    (importing, pid, began), (imported, same_pid, ended) = [line.split() for line in log.read_text().splitlines()]
    assert (importing, imported) == ("importing", "imported") and pid == same_pid
    assert int(ended) - int(began) >= 300_000_000


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
    assert {kind for kind, _, _ in faults[:len(FaultKind)]} == set(FaultKind)  # every kind in each round
    assert all(freeze > 1.5 for _, _, freeze in faults)  # frozen for longer than a lease


def test_with_workers_half_the_workload_is_async_and_the_plans_stay_those_of_the_seed(tmp_path):
    plain = plan_workload(random.Random(5), 200, 10.0, str(tmp_path), 1.5)
    mixed = plan_workload(random.Random(5), 200, 10.0, str(tmp_path), 1.5, with_async=True)
    assert [(a.execution_id, a.input, a.at_s) for a in plain] == [(a.execution_id, a.input, a.at_s) for a in mixed]
    assert {a.workflow for a in plain} == {MIXED, MESSAGES, *LIMITED_QUEUES}
    assert 60 <= sum(a.workflow == MIXED_ASYNC for a in mixed) <= 140
    assert all(a.workflow in LIMITED_QUEUES for a in mixed if a.execution_id.startswith("q"))


def test_one_execution_in_eight_goes_to_a_limited_queue_in_bursts_and_keyed_ones_share_a_few_keys(tmp_path,
                                                                                                   monkeypatch):
    from supervisor.chaos import workload as chaos_workload

    drawn = plan_workload(random.Random(5), 400, 30.0, str(tmp_path), 1.5)
    limited = [a for a in drawn if a.workflow in LIMITED_QUEUES]
    assert len(drawn) == 400 and len(limited) == 50 and {a.workflow for a in limited} == set(LIMITED_QUEUES)
    assert {a.queue for a in limited} == {queue.name for queue in LIMITED_QUEUES.values()}
    assert {a.key for a in limited if a.workflow == KEYED} == set(KEYS)
    assert {a.key for a in limited if a.workflow != KEYED} == {None}
    assert all(a.input["plan"][0][0] == "run" and a.input["plan"][0][2] >= 0.3 for a in limited)
    # The other executions are those the seed drew before limited queues were added.
    monkeypatch.setattr(chaos_workload, "limited_admissions", lambda *args: [])
    alone = plan_workload(random.Random(5), 400, 30.0, str(tmp_path), 1.5)
    assert [a for a in drawn if a.workflow not in LIMITED_QUEUES] == alone


def test_workers_lets_concurrency_go_above_256_and_is_bounded():
    with pytest.raises(InvalidArgument, match="at most 256: give workers"):
        ChaosConfig(concurrency=300)
    assert ChaosConfig(concurrency=300, workers=4).worker_processes == 4
    assert ChaosConfig(concurrency=8).worker_processes == 8
    for workers in (0, 257, True):
        with pytest.raises(InvalidArgument, match="workers must be an int in 1..256"):
            ChaosConfig(workers=workers)


def test_the_step_watcher_follows_each_delivery_of_a_worker_of_several(tmp_path):
    log = tmp_path / "steps.log"
    me = psutil.Process()
    now = time.time_ns()
    log.write_text(f"begin e1 1 {me.pid} a {now}\nbegin e2 1 {me.pid} b {now + 1}\nbegin e3 1 {me.pid} c {now + 2}\n"
                   f"saw e2 1 {me.pid} b {now + 3} d\n")
    watcher = StepWatcher(str(log))
    watcher.poll()
    assert [s.execution_id for s in watcher.inside_all(me)] == ["e3", "e1"]  # the latest first; e2 moved on
    assert watcher.inside(me).execution_id == "e3"


def test_the_plan_holds_locks_for_half_a_lease_to_two_and_skews_clocks_within_bounds():
    plan = FaultPlan(random.Random(3), ALL_KINDS, interval_s=1.0, lease_s=1.5)
    holds = [plan.hold_lock_s() for _ in range(200)]
    assert 0.75 <= min(holds) < 1.5 < max(holds) <= 3.0  # both shorter and longer than the lease
    assert all(0.03 <= plan.disk_full_s() <= 0.3 for _ in range(50))
    assert all(1000 <= plan.import_delay_ms() <= 4000 for _ in range(50))
    assert {plan.start_kills(4) for _ in range(50)} == {1, 2}
    skews = [plan.skew_ms(300) for _ in range(200)]
    assert all(75 <= abs(k) <= 300 for k in skews) and min(skews) < 0 < max(skews)
    config = ChaosConfig(lease_ms=1500, renew_ms=300)
    assert config.max_skew_ms == 300  # two clocks differ by at most half of lease - renewal interval


def test_fault_kinds_are_parsed_and_checked():
    assert parse_kinds(["kill_child,hold_write_lock"]) == (FaultKind.KILL_CHILD, FaultKind.HOLD_WRITE_LOCK)
    assert parse_kinds(["disk_full", "slow_start,clock_skew"]) == (FaultKind.DISK_FULL, FaultKind.SLOW_START,
                                                                  FaultKind.CLOCK_SKEW)
    assert parse_kinds([]) == tuple(FaultKind)
    assert parse_kinds(["none"]) == ()
    with pytest.raises(ValueError, match="unknown fault kind"):
        parse_kinds(["kill_everything"])


def test_kinds_this_host_cannot_inject_are_left_out_of_all_and_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # not root: no tmpfs for disk_full
    tight = dict(lease_ms=100, renew_ms=90, heartbeat_ms=30)  # no room for a clock skew
    config, left_out = applicable_kinds(ChaosConfig(**tight), str(tmp_path), None)
    assert set(left_out) == {"disk_full", "clock_skew"}
    assert "root" in left_out["disk_full"] and "no room" in left_out["clock_skew"]
    assert config.faults == tuple(k for k in ALL_KINDS if k not in (FaultKind.DISK_FULL, FaultKind.CLOCK_SKEW,
                                                                    FaultKind.CONNECTION_KILL) and not k.hits_host
                                  and k != FaultKind.SERVER_RESTART)
    with pytest.raises(InvalidArgument, match="disk_full cannot be injected here: it needs root"):
        applicable_kinds(ChaosConfig(faults=("disk_full", "kill_child")), str(tmp_path), None)
    with pytest.raises(InvalidArgument, match="clock_skew cannot be injected here"):
        applicable_kinds(ChaosConfig(faults=("clock_skew",), **tight), str(tmp_path), None)


def test_each_backend_is_offered_its_own_fault_kinds(tmp_path):
    """SQLite's kinds need the file (its write lock, its disk, its clock); connection_kill needs
    PostgreSQL's sessions. All of them means those of the ledger's backend; naming another's is
    an error."""
    uri = "postgresql://chaos@/nowhere?host=/nonexistent"  # deciding opens no connection
    config, left_out = applicable_kinds(ChaosConfig(), str(tmp_path), uri)
    assert left_out == {}
    assert config.faults == (FaultKind.KILL_CHILD, FaultKind.FREEZE_CHILD, FaultKind.KILL_SUPERVISOR,
                             FaultKind.FREEZE_SUPERVISOR, FaultKind.TERM_SUPERVISOR, FaultKind.SLOW_START,
                             FaultKind.CONNECTION_KILL)
    with pytest.raises(InvalidArgument, match=r"^hold_write_lock does not run on a PostgreSQL ledger \(SQLite only"):
        applicable_kinds(ChaosConfig(faults=("hold_write_lock", "kill_child")), str(tmp_path), uri)
    with pytest.raises(InvalidArgument, match=r"^connection_kill does not run on a SQLite ledger \(PostgreSQL only"):
        applicable_kinds(ChaosConfig(faults=("connection_kill",)), str(tmp_path), str(tmp_path / "ledger.db"))


@pytest.mark.timeout(120)
def test_chaos_refuses_a_postgres_database_that_holds_executions(pg_uri, tmp_path):
    with open_backend(pg_uri) as backend:
        backend.executions.admit("someone-elses", "w")
    done = subprocess.run([sys.executable, "-m", "supervisor.cli", "chaos", "--db", pg_uri, "--duration", "1",
                           "--faults", "none", "--workdir", str(tmp_path / "chaos")],
                          capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [f"yieldstar: --db {pg_uri} already holds executions; chaos needs a ledger"
                                        " of its own"], done.stderr
    with open_backend(pg_uri) as backend:  # untouched
        assert [r.execution_id for r in backend.executions.list()] == ["someone-elses"]


@pytest.mark.skipif(os.geteuid() != 0, reason="disk_full needs root (a tmpfs)")
def test_chaos_with_disk_full_refuses_a_work_folder_that_holds_a_ledger_before_it_starts(tmp_path):
    # With disk_full the ledger lives on a tmpfs and is copied to <folder>/ledger.db at the end:
    # a folder of an earlier run must be refused at once, not after the whole run.
    work = tmp_path / "chaos"
    work.mkdir()
    (work / "ledger.db").write_bytes(b"an earlier run's")
    done = subprocess.run([sys.executable, "-m", "supervisor.cli", "chaos", "--duration", "1",
                           "--faults", "disk_full", "--workdir", str(work)],
                          capture_output=True, text=True, timeout=100, cwd=ROOT)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [f"yieldstar: {work} already holds a ledger.db (of an earlier run?): with"
                                        " disk_full the run copies its ledger there at the end; give it a work"
                                        " folder of its own"], done.stderr
    assert (work / "ledger.db").read_bytes() == b"an earlier run's"
    assert sorted(p.name for p in work.iterdir()) == ["ledger.db", "logs"]  # nothing mounted, nothing run


# -- a real run ------------------------------------------------------------------------------------

def assert_queue_limits_bound(check_: dict, summary: str) -> None:
    """Each limited queue of the built-in workload ran, and no claim passed its limits: the most
    live leases of the capped queue reached its concurrency (the limit bound), none went beyond."""
    queues = check_["queues"]
    assert set(queues) == {queue.name for queue in LIMITED_QUEUES.values()}, summary
    for name, q in queues.items():
        assert q["executions"] >= 1 and 1 <= q["max_live"], summary
        if q["concurrency"] is not None:
            assert q["max_live"] == q["concurrency"], summary
        if q["per_key"] is not None:
            assert q["max_live_per_key"] == q["per_key"] and q["keys"] == len(KEYS), summary
        if q["rate"] is not None:
            assert 1 <= q["max_claims_in_window"] <= q["rate"][0], summary
    assert not {kind for kind in check_["violations_by_kind"] if kind.startswith("queue_")}, summary


def assert_the_page_tells_the_story(report: dict, kinds: list) -> str:
    """The report saved as the chaos command saves it: its JSON keeps a timeline, and the page
    beside it draws every supervisor, every kind of fault injected, and the deliveries of the
    executions that had takeovers, each takeover's cause linked to its mark. Returns the page."""
    lines = save(report)
    folder = report["work_folder"]
    assert lines[-1] == f"page     {os.path.join(folder, 'report.html')}"
    with open(os.path.join(folder, "report.json")) as f:
        timeline = json.load(f)["timeline"]
    assert len(timeline["supervisors"]) == report["harness"]["supervisors_started"]
    assert len(timeline["faults"]) == report["check"]["faults"]["total"]
    with open(os.path.join(folder, "report.html"), encoding="utf-8") as f:
        page = f.read()
    assert len(page.encode()) < 1_000_000, len(page)
    for kind in kinds:
        assert f'<g class="fault {kind.value}" id="f' in page, kind
    for s in timeline["supervisors"]:
        assert f"supervisor {s['n']} (pid {s['pid']})" in page
    takeovers = [d for e in timeline["executions"] for d in e["deliveries"] if "reason" in d]
    drawn = sum(1 for _ in re.finditer(r'<g class="delivery (superseded|expired)"', page))
    assert takeovers and len(takeovers) <= drawn
    for d in takeovers:
        if "cause" in d:
            assert f'<a href="#f{d["cause"]}"><g class="cause">' in page
    return page


def assert_messages_taken_once(check_: dict, summary: str) -> None:
    """The built-in workload's `chaos.messages` executions all completed, each having taken every
    message sent to it once, repeats of an id stored once; none lost, none taken twice."""
    m = check_["messages"]
    assert m["executions"] >= 1 and m["completed"] == m["executions"], summary
    assert m["stored"] == m["planned"] == m["taken"] >= 2, summary
    assert m["sends_returned"] >= m["planned"] and m["repeats_sent"] >= 1, summary
    # (Whether a message was sent before its execution's first delivery is up to the race
    # between the sender and the claims: counted, not required.)
    assert m["duplicates_refused"] >= 1, summary
    assert not {kind for kind in check_["violations_by_kind"] if kind.startswith("message_")}, summary


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_short_chaos_run_loses_nothing(tmp_path, each_backend, dump_on_hang):
    """Every fault kind of the backend (disk_full only as root), about 35 s in all: on SQLite
    the harness's own file, on PostgreSQL a fresh database, whose sessions connection_kill
    terminates. The limited queues' executions go through the same faults, and their claims keep
    to the limits."""
    on_postgres = is_uri(each_backend)
    config = ChaosConfig(seed=20261202, duration_s=25, supervisors=3, concurrency=3, executions=300,
                         fault_interval_s=0.65, drain_timeout_s=150)
    lines = []
    report = run_chaos(config, folder=str(tmp_path / "chaos"), db_path=each_backend if on_postgres else None,
                       out=lines.append)
    check_ = report["check"]
    summary = "\n".join(summary_lines(report))
    assert check_["violations"] == [], summary
    assert check_["executions"]["not_terminal"] == 0, summary
    assert check_["executions"]["admitted_by_harness"] == 300
    assert report["ok"], summary
    injected = check_["faults"]["by_kind"]
    elsewhere = ({"hold_write_lock", "disk_full", "clock_skew"} if on_postgres else {"connection_kill"}) | \
        {"partition", "frozen_host", "server_restart"}  # --hosts only
    assert set(report["harness"]["kinds_not_offered"]) == elsewhere
    expected = [k for k in FaultKind if k.value not in elsewhere and not (k == FaultKind.DISK_FULL and os.geteuid())]
    assert all(injected.get(kind.value, 0) >= 1 for kind in expected), injected
    assert not set(injected) & elsewhere, injected
    assert report["harness"]["workers_killed_while_starting"] >= 1, summary
    assert check_["takeovers"]["checked"], summary
    assert check_["takeovers"]["cpu_waits_sampled"] == cpu_waits_available(), summary
    if not on_postgres:  # PostgreSQL's ledger clock is the server's: no skew to give
        assert check_["takeovers"]["clocks"]["skewed"] >= 1, summary
    assert check_["effects"]["owners_checked"] == check_["effects"]["effect_ids"], summary
    assert_queue_limits_bound(check_, summary)
    assert_the_page_tells_the_story(report, expected)
    assert_messages_taken_once(check_, summary)
    assert not os.path.ismount(tmp_path / "chaos" / "ledger")
    # Nothing the run started survives it.
    ledger = each_backend if on_postgres else str(tmp_path / "chaos" / "ledger.db")
    survivors = []
    for process in psutil.process_iter(["cmdline"]):
        if ledger in " ".join(process.info["cmdline"] or []):
            survivors.append(process.pid)
    assert survivors == []


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_short_chaos_run_with_workers_loses_nothing(tmp_path, each_backend, dump_on_hang):
    """The same run with 8 deliveries in 2 workers per supervisor (`--workers 2`): half the
    workload async, so that a worker's deliveries share its event loop, the others on its
    threads; a kill or a freeze of a worker takes all of them."""
    on_postgres = is_uri(each_backend)
    config = ChaosConfig(seed=20261207, duration_s=25, supervisors=3, concurrency=8, workers=2, executions=300,
                         fault_interval_s=0.65, drain_timeout_s=150)
    report = run_chaos(config, folder=str(tmp_path / "chaos"), db_path=each_backend if on_postgres else None,
                       out=[].append)
    check_ = report["check"]
    summary = "\n".join(summary_lines(report))
    assert check_["violations"] == [], summary
    assert check_["executions"]["not_terminal"] == 0, summary
    assert report["ok"], summary
    assert "8 deliveries in 2 workers" in summary
    assert_queue_limits_bound(check_, summary)
    assert_messages_taken_once(check_, summary)
    injected = check_["faults"]["by_kind"]
    assert injected.get("kill_child", 0) >= 1 and injected.get("freeze_child", 0) >= 1, injected
    assert check_["takeovers"]["checked"] and sum(check_["takeovers"]["workers"]["released_with_their_worker"]
                                                  .values()) >= 2, summary  # a worker's deliveries went with it
    ledger = each_backend if on_postgres else str(tmp_path / "chaos" / "ledger.db")
    with open_backend(ledger) as backend:
        done = {(r.workflow, r.status) for r in backend.executions.list()}
    assert {(MIXED, "completed"), (MIXED_ASYNC, "completed")} <= done, done


def test_the_checker_counts_the_renewals_that_found_a_lease_lost_as_the_loop_logs_them(tmp_path):
    from supervisor.chaos.evidence import read_refusals
    from supervisor.loop import ENDED_IN_LEDGER, LOST_LINE, RENEWAL_FOUND_LOST, STOP_LINE

    os.makedirs(tmp_path / "logs")
    lines = [LOST_LINE % ("e-1", 7, RENEWAL_FOUND_LOST, 4242),
             LOST_LINE % ("e-2", 3, "some other reason", 4243),
             # a worker of several deliveries is told to stop one, by either finding
             STOP_LINE % ("e-3", 2, RENEWAL_FOUND_LOST, 4244),
             STOP_LINE % ("e-4", 5, ENDED_IN_LEDGER, 4244)]
    (tmp_path / "logs" / "supervisor-002.log").write_text(
        "".join(f"2026-12-05 07:00:00,000 WARNING supervisor: {line}\n" for line in lines))
    found, tracebacks = read_refusals(str(tmp_path))
    assert found == [("renewals", "e-1", 7, 2), ("renewals", "e-3", 2, 2), ("ended_in_ledger", "e-4", 5, 2)]
    assert tracebacks == 0
