"""`yieldstar demo`: the order shop of RFC 002, acted out by real processes on a temporary ledger.

Act 1, a slow charge: the payment provider takes longer than several lease periods. The
supervisor keeps renewing, so the delivery keeps its lease: one claim, one charge.

Act 2, a frozen worker: supervisor A's worker charges the card, and A is frozen (SIGSTOP on its
whole process group) before the answer is recorded. The lease runs out; supervisor B claims the
order with a higher token, replays it, and asks the provider again with the same idempotency key
(the effect id), so nobody is charged twice. Then A is resumed: its late writes are refused.

Act 3, a killed supervisor: supervisor C is killed (SIGKILL) while its worker packs the order.
The orphaned worker stops at once (it writes nothing more); supervisor D takes over after the
lease expires and finishes the order.

Each act ends with verdicts read from the ledger, the provider's charges and the processes
themselves; the command exits 0 only if every verdict holds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import psutil

from worker.apps.demo_shop import PaymentProvider

from .ledger.backends import open_backend
from .ledger.errors import YieldstarError

LEASE_MS = 1500
RENEW_MS = 400
HEARTBEAT_MS = 200


@dataclass
class Verdict:
    text: str
    holds: bool


@dataclass
class Stage:
    """The temporary world an act runs in: folder, ledger, provider, supervisors it started."""

    folder: str
    out: Callable[[str], None]
    started: float = field(default_factory=time.monotonic)
    processes: list = field(default_factory=list)

    @property
    def db(self) -> str:
        return os.path.join(self.folder, "shop.db")

    @property
    def provider(self) -> PaymentProvider:
        return PaymentProvider(os.path.join(self.folder, "provider.jsonl"))

    def say(self, text: str) -> None:
        self.out(f"  [{time.monotonic() - self.started:5.1f}s] {text}")

    def supervisor(self, name: str, *extra: str) -> subprocess.Popen:
        """Start `yieldstar supervise` in a process group of its own (so it can be frozen whole)."""
        log = open(os.path.join(self.folder, f"supervisor-{name}.log"), "ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "supervisor.cli", "--db", self.db, "supervise", "worker.apps.demo_shop",
             "--concurrency", "1", "--lease-ms", str(LEASE_MS), "--renew-ms", str(RENEW_MS),
             "--heartbeat-ms", str(HEARTBEAT_MS), "--poll-ms", "100", *extra],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.processes.append((name, process))
        return process

    def workers_of(self, process: subprocess.Popen) -> list[psutil.Process]:
        try:
            return psutil.Process(process.pid).children()
        except psutil.Error:
            return []

    def log_of(self, name: str) -> str:
        with open(os.path.join(self.folder, f"supervisor-{name}.log"), errors="replace") as f:
            return f.read()

    def wait(self, what: str, condition: Callable[[], object], timeout: float = 30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            for name, process in self.processes:
                if process.poll() is not None and process.returncode != -signal.SIGKILL:
                    last = self.log_of(name).strip().splitlines()[-1:] or ["(no output)"]
                    raise DemoFailed(f"supervisor {name} exited with code {process.returncode}: {last[0]}")
            time.sleep(0.02)
        raise DemoFailed(f"gave up waiting {timeout:.0f} s for {what}")

    def stop_all(self) -> None:
        for _, process in self.processes:
            try:
                os.killpg(process.pid, signal.SIGCONT)
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            process.wait()


class DemoFailed(YieldstarError):
    """Raised when an act could not be played out (a step never happened in time)."""


def _running(process: psutil.Process) -> bool:
    """Alive and not a zombie (an exited process nobody has reaped yet runs no code)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _history(backend, execution_id: str):
    return backend.executions.history(execution_id)


def _holder_pid(lease_record) -> int:
    return int(lease_record.holder.rsplit(":", 1)[1])


def _admit_order(stage: Stage, backend, order_id: int, **input) -> str:
    execution_id = f"order-{order_id}"
    payload = {"order_id": order_id, "provider": stage.provider.path, **input}
    backend.executions.admit(execution_id, "order", json.dumps(payload))
    stage.say(f"order {order_id} comes in: execution {execution_id} admitted")
    return execution_id


def _charges_for(stage: Stage, execution_id: str) -> list[dict]:
    return [c for c in stage.provider.charges() if c["idempotency_key"].startswith(execution_id + "/")]


def act_slow_charge(stage: Stage) -> list[Verdict]:
    backend = open_backend(stage.db)
    seconds = 3 * LEASE_MS / 1000
    a = stage.supervisor("A")
    stage.say(f"supervisor A started (pid {a.pid}); leases last {LEASE_MS} ms, renewed every {RENEW_MS} ms")
    eid = _admit_order(stage, backend, 42, charge_seconds=seconds)
    first = stage.wait("A to claim order-42", lambda: _history(backend, eid))[0]
    stage.say(f"A claims {eid} with token {first.token}; the provider takes {seconds:.1f} s to charge,"
              f" three lease periods")
    seen = 0
    deadline = time.monotonic() + 30
    while (record := backend.executions.get(eid)).status != "completed" and time.monotonic() < deadline:
        renewals = _history(backend, eid)[-1].renewals
        if renewals != seen:
            seen = renewals
            stage.say(f"A renews the lease (renewal {renewals}): still token {first.token}, still alive")
        time.sleep(0.05)
    history = _history(backend, eid)
    charges = _charges_for(stage, eid)
    stage.say(f"{eid} is {record.status} with token {record.token}; {len(history)} claim(s),"
              f" {history[-1].renewals} renewals; provider charges: {len(charges)}")
    backend.close()
    return [
        Verdict("the slow charge kept its lease: one claim, renewed, never handed to anyone else",
                record.status == "completed" and len(history) == 1 and history[0].renewals >= 2),
        Verdict("customer charged once", len(charges) == 1),
    ]


def act_frozen_worker(stage: Stage) -> list[Verdict]:
    backend = open_backend(stage.db)
    # A tolerates a long silence from its children and they from it, so that when A resumes its
    # worker carries on and tries to write, and the ledger, not a timer, is what stops it.
    a = stage.supervisor("A", "--heartbeat-misses", "100")
    stage.say(f"supervisor A started (pid {a.pid})")
    eid = _admit_order(stage, backend, 43, charge_seconds=0.2, pause_after_charging=1.0)
    first = stage.wait("A to claim order-43", lambda: _history(backend, eid))[0]
    stage.say(f"A claims {eid} with token {first.token}")
    charge = stage.wait("the provider to charge", lambda: _charges_for(stage, eid))[0]
    os.killpg(a.pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    stage.say(f"the provider charged {charge['charge_id']} for A's worker (pid {charge['pid']}); before the"
              f" answer is recorded, A and its worker freeze (SIGSTOP)")
    b = stage.supervisor("B")
    stage.say(f"supervisor B started (pid {b.pid}); A's lease runs out, nobody renews it")
    second = stage.wait("B to claim order-43", lambda: next(
        (h for h in _history(backend, eid) if h.token > first.token), None))
    stage.say(f"B claims {eid} with token {second.token} > {first.token}: token {first.token} is stale now")
    done = stage.wait("B to finish order-43", lambda: (r := backend.executions.get(eid)).status == "completed" and r)
    stage.say(f"B replays: the charge is an effect, so B asks the provider again with the same idempotency"
              f" key and gets {json.loads(done.result_json)['charge_id']} back; {eid} completed by token {done.token}")
    steps_before = backend.heap.steps(eid)
    # The worker thaws first, while its supervisor is still frozen: nothing but the ledger can
    # stop what it does next.
    os.kill(charge["pid"], signal.SIGCONT)
    stage.say(f"A's worker wakes up after {time.monotonic() - frozen_at:.1f} s, unaware, and carries on")
    refused = stage.wait("A's worker's late write to be refused",
                         lambda: f"{eid} token {first.token}: write of" in stage.log_of("A"), timeout=15)
    stage.say(f"it tries to record the charge with token {first.token}: the ledger refuses, and it stops")
    os.killpg(a.pid, signal.SIGCONT)
    stage.wait("A to give the delivery up", lambda: f"token={first.token} outcome=lost" in stage.log_of("A"))
    stage.say(f"supervisor A wakes up too and gives the delivery up: nothing is acknowledged with token {first.token}")
    after = backend.executions.get(eid)
    steps_after = backend.heap.steps(eid)
    charges = _charges_for(stage, eid)
    stage.say(f"provider charges for {eid}: {len(charges)}")
    backend.close()
    return [
        Verdict("a higher token took over from the frozen worker", second.token == first.token + 1),
        Verdict("the frozen worker's writes were refused; the records are the current holder's",
                bool(refused) and steps_after == steps_before and after.token == done.token
                and after.result_json == done.result_json),
        Verdict("customer charged once", len(charges) == 1),
    ]


def act_killed_supervisor(stage: Stage) -> list[Verdict]:
    backend = open_backend(stage.db)
    ticks_path = os.path.join(stage.folder, "packing.ticks")
    c = stage.supervisor("C")
    stage.say(f"supervisor C started (pid {c.pid})")
    eid = _admit_order(stage, backend, 44, pack_ticks=30, ticks_path=ticks_path)
    first = stage.wait("C to claim order-44", lambda: _history(backend, eid))[0]
    stage.wait("C's worker to start packing", lambda: os.path.exists(ticks_path)
               and len(open(ticks_path).readlines()) >= 5)
    workers = stage.workers_of(c)
    c.kill()
    killed_at = time.time()
    stage.say(f"C's worker (pid {', '.join(str(w.pid) for w in workers)}) is packing {eid} under token"
              f" {first.token}; supervisor C is killed (SIGKILL)")
    gone = stage.wait("the orphaned worker to exit", lambda: not any(_running(w) for w in workers), timeout=10)
    exit_ms = (time.time() - killed_at) * 1000
    stage.say(f"the orphaned worker is gone {exit_ms:.0f} ms after its supervisor")
    d = stage.supervisor("D")
    stage.say(f"supervisor D started (pid {d.pid}); it waits for C's lease to run out")
    second = stage.wait("D to claim order-44", lambda: next(
        (h for h in _history(backend, eid) if h.token > first.token), None))
    stage.say(f"D claims {eid} with token {second.token}, replays load and charge from the records, packs again")
    done = stage.wait("D to finish order-44", lambda: (r := backend.executions.get(eid)).status == "completed" and r)
    with open(ticks_path) as f:
        ticks = [line.split() for line in f if line.strip()]
    orphan_pids = {str(w.pid) for w in workers}
    late = [t for t in ticks if t[0] in orphan_pids and float(t[1]) > killed_at + 0.05]
    charges = _charges_for(stage, eid)
    stage.say(f"{eid} completed by token {done.token}; ticks by the orphan after the kill: {len(late)};"
              f" provider charges: {len(charges)}")
    backend.close()
    return [
        Verdict(f"the orphaned worker stopped at once ({exit_ms:.0f} ms) and wrote nothing after",
                bool(gone) and not late),
        Verdict("another supervisor took over with a higher token and finished the order",
                done.token > first.token),
        Verdict("customer charged once", len(charges) == 1),
    ]


ACTS = {
    1: ("a charge slower than the lease", act_slow_charge),
    2: ("a worker frozen past its lease", act_frozen_worker),
    3: ("a supervisor killed mid-step", act_killed_supervisor),
}


def run_demo(acts: Optional[list[int]] = None, *, keep: bool = False, out: Callable[[str], None] = print) -> int:
    """Play the acts; return 0 if every verdict holds, else 1."""
    acts = acts or sorted(ACTS)
    folder = tempfile.mkdtemp(prefix="yieldstar-demo-")
    all_hold = True
    try:
        for number in acts:
            title, act = ACTS[number]
            out(f"\nAct {number}: {title}")
            stage = Stage(os.path.join(folder, f"act{number}"), out)
            os.makedirs(stage.folder)
            try:
                verdicts = act(stage)
            except DemoFailed as exc:
                verdicts = [Verdict(str(exc), False)]
            finally:
                stage.stop_all()
            for verdict in verdicts:
                all_hold &= verdict.holds
                out(f"  {'PASS' if verdict.holds else 'FAIL'}  {verdict.text}")
        out("")
        out("Every verdict holds." if all_hold else "Some verdicts do not hold: see above.")
    finally:
        if keep:
            out(f"The ledgers, the provider's charges and the supervisors' logs are kept in {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    return 0 if all_hold else 1
