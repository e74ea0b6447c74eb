"""`yieldstar chaos`: supervisors under fire, and proof afterwards that nothing was lost.

    harness (this process)                       supervisors, each its own process group
    +------------------------------------+      +----------------------------------------+
    | admitter thread: admits the seeded |      | yieldstar supervise worker.chaos_app   |
    |   workload over the fault phase    |      |   +- worker  +- worker  +- worker ...  |
    | main loop, every 50 ms:            |      +----------------------------------------+
    |   tail steps.log: who is in a step |  SIGKILL / SIGSTOP / SIGCONT / SIGTERM, by pid
    |   inject the next planned fault ---|----> or by process group; a lock holder
    |   thaw, replace, reap supervisors  |      process takes the ledger's write lock
    |   progress line                    |
    +------------------------------------+
             |  after the fault phase: thaw everything, restore the fleet, wait until every
             v  execution is terminal, stop the supervisors gracefully, then run the checker
    checker (ledger + steps.log + external/*.log)  ->  report (JSON) + one-screen summary

Phases: (1) set up the work folder and a fresh ledger; (2) the fault phase, `duration_s` long,
during which the workload is admitted (over its first 85%) and faults are injected; (3) the
drain: no more faults, `supervisors` healthy supervisors, until every execution is terminal or
`drain_timeout_s` passes; (4) graceful stop, checks, report.

One `random.Random(seed)` draws the workload and the fault plan (kinds, gaps, durations, and
which of the candidate targets is hit), so a run can be replayed with the same seed. Timing
still varies from run to run (process scheduling decides which step is running when a fault
fires), so a replay hits the same kinds of faults at the same moments, not the same steps.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import psutil

from worker.chaos_app import COUNTER, MAILBOX, STEP_LOG

from ..errors import InvalidArgument, YieldstarError
from ..sqlite.backend import open_backend
from . import faults
from .checker import check
from .faults import ALL_KINDS, Fault, FaultKind, FaultPlan
from .fleet import FROZEN, ROOT, RUNNING, TICK_S, Fleet, SupervisorHandle
from .workload import Admitter, plan_workload

ADMIT_SHARE = 0.85  # the workload is admitted over this share of the fault phase
IN_STEP_PATIENCE_S = 2.0  # how long a fault waits for a target inside a step before taking any
GIVE_UP_S = 10.0  # how long a fault waits for any target at all before it is skipped


class ChaosInterrupted(YieldstarError):
    """Raised when a chaos run is told to stop (SIGINT, SIGTERM) before it finished; every
    process it started has been killed."""


@dataclass(frozen=True)
class ChaosConfig:
    seed: int = 1
    duration_s: float = 60.0
    supervisors: int = 3
    concurrency: int = 4
    executions: int = 1000
    lease_ms: int = 1500
    renew_ms: int = 300
    heartbeat_ms: int = 200
    faults: tuple = ALL_KINDS
    fault_interval_s: float = 1.2
    drain_timeout_s: float = 300.0
    grace_ms: int = 5000
    poll_ms: int = 100
    lenient_supervisors: Optional[int] = None  # run with fleet.LENIENT_MISSES; None: 1 if > 1 supervisor

    def __post_init__(self) -> None:
        for name in ("supervisors", "concurrency", "executions", "lease_ms", "renew_ms", "heartbeat_ms", "poll_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidArgument(f"{name} must be an int >= 1, got {value!r}")
        for name in ("duration_s", "fault_interval_s", "drain_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise InvalidArgument(f"{name} must be a number > 0, got {value!r}")
        if self.lenient_supervisors is None:
            object.__setattr__(self, "lenient_supervisors", 1 if self.supervisors > 1 else 0)
        if not isinstance(self.lenient_supervisors, int) or not 0 <= self.lenient_supervisors <= self.supervisors:
            raise InvalidArgument(f"lenient_supervisors must be an int in 0..supervisors ({self.supervisors}),"
                                  f" got {self.lenient_supervisors!r}")
        if self.renew_ms >= self.lease_ms:
            raise InvalidArgument(f"renew_ms ({self.renew_ms}) must be less than lease_ms ({self.lease_ms})")
        if self.heartbeat_ms * 3 >= self.lease_ms:
            raise InvalidArgument(f"three heartbeats ({3 * self.heartbeat_ms} ms) must fit in a lease"
                                  f" ({self.lease_ms} ms): a frozen worker must be found out before its lease ends")
        object.__setattr__(self, "faults", tuple(FaultKind(k) for k in self.faults))

    def as_dict(self) -> dict:
        d = asdict(self)
        d["faults"] = [k.value for k in self.faults]
        return d


# -- who is inside a step right now --------------------------------------------------------------

@dataclass
class OpenStep:
    execution_id: str
    token: int
    key: str
    pid: int
    begun_ns: int

    def as_dict(self) -> dict:
        return {"execution_id": self.execution_id, "token": self.token, "key": self.key, "pid": self.pid}


class StepWatcher:
    """Tails the step log: a `begin` line opens a step for its pid, any later line of that pid
    closes it."""

    def __init__(self, path: str):
        self.path = path
        self._offset = 0
        self._partial = b""
        self.open: dict[int, OpenStep] = {}

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            fields = raw.decode(errors="replace").split()
            if len(fields) < 6:
                continue
            pid = int(fields[3])
            if fields[0] == "begin":
                self.open[pid] = OpenStep(fields[1], int(fields[2]), fields[4], pid, int(fields[5]))
            else:
                self.open.pop(pid, None)

    def inside(self, process: psutil.Process) -> Optional[OpenStep]:
        """The step `process` is in now, if its begin line is its own (not an earlier holder of
        the pid's) and recent."""
        step = self.open.get(process.pid)
        if step is None or time.time_ns() - step.begun_ns > 30e9:
            return None
        try:
            if process.create_time() * 1e9 > step.begun_ns + 1e7:
                return None
        except psutil.Error:
            return None
        return step


# -- the run -------------------------------------------------------------------------------------

class Progress:
    """The progress line: carriage-return updated on a terminal, a line every few seconds otherwise."""

    def __init__(self, out: Callable[[str], None], tty: bool):
        self.out = out
        self.tty = tty
        self.every = 1.0 if tty else 5.0
        self._next = 0.0
        self._width = 0

    def show(self, line: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + self.every
        if self.tty:
            line = line[: shutil.get_terminal_size().columns - 1]  # a wrapped line cannot be redrawn
            sys.stdout.write("\r" + line.ljust(self._width))
            sys.stdout.flush()
            self._width = len(line)
        else:
            self.out(line)

    def done(self) -> None:
        if self.tty and self._width:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self._width = 0


# Fault kinds in the progress line, which must fit a terminal's width.
SHORT = {FaultKind.KILL_CHILD: "kc", FaultKind.FREEZE_CHILD: "sc", FaultKind.KILL_SUPERVISOR: "ks",
         FaultKind.FREEZE_SUPERVISOR: "ss", FaultKind.TERM_SUPERVISOR: "ts", FaultKind.HOLD_WRITE_LOCK: "lk"}


class ChaosRun:
    def __init__(self, config: ChaosConfig, folder: str, db_path: str, out: Callable[[str], None], tty: bool):
        self.config = config
        self.folder = folder
        self.db_path = db_path
        self.out = out
        self.rng = random.Random(config.seed)
        self.plan = FaultPlan(self.rng, config.faults, interval_s=config.fault_interval_s,
                              lease_s=config.lease_ms / 1000)
        self.anomalies: list[dict] = []
        self.fleet = Fleet(config, db_path, folder, self._anomaly)
        self.watcher = StepWatcher(os.path.join(folder, STEP_LOG))
        self.progress = Progress(out, tty)
        self.faults: list[Fault] = []
        self.by_kind: dict[str, int] = {k.value: 0 for k in config.faults}
        self.pending: list[tuple[float, Callable[[], None]]] = []  # (when, action): thaws
        self.lock_holders: list[subprocess.Popen] = []
        self.frozen_children_alive_at_thaw = 0
        self.skipped: dict[str, int] = {}  # faults given up for want of a target
        self.started = time.monotonic()
        self.phase = "setup"
        self.stop_signal: Optional[int] = None  # set by the signal handler, acted on by the loops
        self._journal = open(os.path.join(folder, "faults.jsonl"), "a")
        self._status = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=30)

    def request_stop(self, signum, _frame) -> None:
        self.stop_signal = signum

    def _check_stop(self) -> None:
        if self.stop_signal is not None:
            raise ChaosInterrupted(f"stopped by {signal.Signals(self.stop_signal).name} during the {self.phase}"
                                   f" phase; the work folder {self.folder} holds what happened so far")

    def _anomaly(self, kind: str, detail: str) -> None:
        self.anomalies.append({"kind": kind, "detail": detail, "at_s": round(time.monotonic() - self.started, 3)})
        self.out(f"\n!! {kind}: {detail}" if self.progress.tty else f"!! {kind}: {detail}")

    # -- status ----------------------------------------------------------------------------------

    def statuses(self) -> dict:
        try:
            rows = self._status.execute("SELECT status, count(*) FROM executions GROUP BY status").fetchall()
        except sqlite3.Error:
            return {}
        return dict(rows)

    def show_progress(self, admitted: int, *, force: bool = False) -> None:
        s = self.statuses()
        total = sum(s.values())
        kinds = " ".join(f"{SHORT[k]} {self.by_kind[k.value]}" for k in self.config.faults)
        frozen = sum(1 for h in self.fleet.handles if h.state == FROZEN)
        self.progress.show(
            f"[{self.phase} {time.monotonic() - self.started:4.0f}s] admitted {admitted}/{self.config.executions}"
            f" +{total - admitted}  completed {s.get('completed', 0)}  failed {s.get('failed', 0)}"
            f" | faults {len(self.faults)}: {kinds} | supervisors {len(self.fleet.members())}"
            + (f" ({frozen} frozen)" if frozen else ""), force=force)

    # -- faults ----------------------------------------------------------------------------------

    def _in_step_children(self, handles) -> list[tuple[SupervisorHandle, psutil.Process, OpenStep]]:
        found = []
        for h in handles:
            for child in h.workers():
                step = self.watcher.inside(child)
                if step is not None:
                    found.append((h, child, step))
        return found

    def try_inject(self, kind: FaultKind, waited_s: float) -> bool:
        """Inject `kind` now if a target is inside a step (or we waited long enough); False to
        try again on the next tick."""
        desperate = waited_s > IN_STEP_PATIENCE_S
        now = time.monotonic()
        if kind.hits_supervisor and len(self.fleet.running()) < min(2, self.config.supervisors):
            return False  # keep at least one healthy supervisor through every fault
        if kind == FaultKind.HOLD_WRITE_LOCK:
            if self.lock_holders:
                return False  # one lock holder at a time
            inside = self._in_step_children(self.fleet.running())
            step = self.plan.choose(inside)[2].as_dict() if inside else None
            if step is None and not desperate:
                return False
            seconds = self.plan.hold_lock_s()
            holder = faults.hold_write_lock(self.db_path, seconds, os.path.join(self.folder, "logs", "lock-holders.log"))
            self.lock_holders.append(holder)
            self._record(kind, {"pid": holder.pid}, step, {"seconds": round(seconds, 3)})
            return True
        # A lenient supervisor would not notice a frozen worker for many seconds: freeze only
        # workers whose supervisor is expected to kill and replace them.
        eligible = [h for h in self.fleet.running() if not (kind == FaultKind.FREEZE_CHILD and h.lenient)]
        inside = self._in_step_children(eligible)
        if not inside:
            if not desperate:
                return False
            targets = [(h, c, None) for h in eligible for c in h.workers()]
            if not targets:
                return False
            handle, child, step = self.plan.choose(targets)
        else:
            handle, child, step = self.plan.choose(inside)
        step_info = step.as_dict() if step else None
        target = {"supervisor": handle.number, "supervisor_pid": handle.pid, "worker_pid": child.pid,
                  "lenient": handle.lenient}
        if kind == FaultKind.KILL_CHILD:
            if not faults.kill(child):
                return False
            self._record(kind, target, step_info)
        elif kind == FaultKind.FREEZE_CHILD:
            if not faults.freeze(child):
                return False
            seconds = self.plan.freeze_child_s()
            self.pending.append((now + seconds, lambda: self._thaw_child(child)))
            self._record(kind, target, step_info, {"seconds": round(seconds, 3)})
        elif kind == FaultKind.KILL_SUPERVISOR:
            self.fleet.kill(handle)
            replacement = self.fleet.start_one(lenient=handle.lenient)
            self._record(kind, dict(target, replacement=replacement.number), step_info)
        elif kind == FaultKind.TERM_SUPERVISOR:
            self.fleet.terminate(handle)
            replacement = self.fleet.start_one(lenient=handle.lenient)
            self._record(kind, dict(target, replacement=replacement.number), step_info)
        elif kind == FaultKind.FREEZE_SUPERVISOR:
            if not faults.signal_group(handle.pid, signal.SIGSTOP):
                return False
            handle.state = FROZEN
            seconds = self.plan.freeze_supervisor_s()
            self.pending.append((now + seconds, lambda: self._thaw_supervisor(handle)))
            self._record(kind, target, step_info, {"seconds": round(seconds, 3)})
        return True

    def _thaw_child(self, child: psutil.Process) -> None:
        if faults.alive(child):
            self.frozen_children_alive_at_thaw += 1
            faults.thaw(child)

    def _thaw_supervisor(self, handle: SupervisorHandle) -> None:
        faults.signal_group(handle.pid, signal.SIGCONT)
        if handle.state == FROZEN:
            handle.state = RUNNING

    def _record(self, kind: FaultKind, target: dict, step: Optional[dict], params: Optional[dict] = None) -> None:
        fault = Fault(kind, time.monotonic() - self.started, target, step, params or {})
        self.faults.append(fault)
        self.by_kind[kind.value] += 1
        self._journal.write(json.dumps(fault.as_dict()) + "\n")
        self._journal.flush()

    def run_pending(self, *, all_now: bool = False) -> None:
        now = time.monotonic()
        due = [a for a in self.pending if all_now or a[0] <= now]
        self.pending = [a for a in self.pending if not (all_now or a[0] <= now)]
        for _, action in due:
            action()

    # -- phases ----------------------------------------------------------------------------------

    def fault_phase(self, admitter: Admitter) -> None:
        c = self.config
        self.phase = "faults"
        end = self.started + c.duration_s
        next_at = self.started + self.plan.gap()
        kind: Optional[FaultKind] = None
        while time.monotonic() < end:
            self._check_stop()
            self.fleet.reap()
            self.fleet.ensure(c.supervisors)
            self.watcher.poll()
            self.run_pending()
            self.lock_holders = [p for p in self.lock_holders if p.poll() is None]  # reap those done
            now = time.monotonic()
            if c.faults and now >= next_at:
                kind = kind or self.plan.next_kind()
                injected = self.try_inject(kind, now - next_at)
                if not injected and now - next_at > GIVE_UP_S:
                    self.skipped[kind.value] = self.skipped.get(kind.value, 0) + 1
                if injected or now - next_at > GIVE_UP_S:
                    kind = None
                    next_at = now + self.plan.gap()
            if admitter.error is not None:
                raise admitter.error
            self.show_progress(admitter.admitted)
            time.sleep(TICK_S)

    def drain(self, admitter: Admitter) -> bool:
        """No more faults: thaw everything, restore the fleet, and wait until every execution is
        terminal. True if they all are."""
        c = self.config
        self.phase = "drain"
        self.run_pending(all_now=True)
        admitter.join()
        if admitter.error is not None:
            raise admitter.error
        deadline = time.monotonic() + c.drain_timeout_s
        while time.monotonic() < deadline:
            self._check_stop()
            self.fleet.reap()
            self.fleet.ensure(c.supervisors)
            s = self.statuses()
            self.show_progress(admitter.admitted)
            if sum(s.values()) and sum(n for st, n in s.items() if st not in ("completed", "failed")) == 0:
                return True
            time.sleep(0.25)
        return False

    def cleanup(self, *, graceful: bool) -> None:
        for holder in self.lock_holders:
            if holder.poll() is None:
                holder.kill()
            holder.wait()
        self.run_pending(all_now=True)
        if graceful:
            self.fleet.stop_all()
        self.fleet.kill_all()
        self._journal.close()
        self._status.close()


def _fresh_ledger(db_path: str) -> None:
    with open_backend(db_path) as backend:
        if backend.executions.list(limit=1):
            raise InvalidArgument(f"--db {db_path} already holds executions; chaos needs a ledger of its own")
        backend.stores.get_or_create(COUNTER, "0")
        backend.stores.get_or_create(MAILBOX, "[]")


def run_chaos(config: ChaosConfig, *, folder: Optional[str] = None, db_path: Optional[str] = None,
              out: Callable[[str], None] = print, tty: bool = False) -> dict:
    """Run one chaos experiment and return its report (see `supervisor.chaos.report`).

    Args:
        folder: the work folder (ledger, logs, evidence); a new temporary one when None. It is kept.
        db_path: the ledger; `<folder>/ledger.db` when None. It must hold no executions yet.
        out: where lines of output go; `tty` makes the progress line update in place.
    """
    from .report import build_report, source_of

    folder = os.path.abspath(folder or tempfile.mkdtemp(prefix=f"yieldstar-chaos-{config.seed}-"))
    os.makedirs(os.path.join(folder, "logs"), exist_ok=True)
    db_path = os.path.abspath(db_path or os.path.join(folder, "ledger.db"))
    _fresh_ledger(db_path)
    began = time.time()
    run = ChaosRun(config, folder, db_path, out, tty)
    admissions = plan_workload(run.rng, config.executions, config.duration_s * ADMIT_SHARE, folder,
                               config.lease_ms / 1000)
    out(f"yieldstar chaos: seed {config.seed}, {config.duration_s:g} s of faults, {config.supervisors} supervisors"
        f" x {config.concurrency} workers, {config.executions} executions; work folder {folder}")
    admitter = Admitter(db_path, admissions, run.started)
    graceful = False
    timings = {}
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, run.request_stop)
    try:
        run.fleet.ensure(config.supervisors)
        admitter.start()
        run.fault_phase(admitter)
        timings["fault_phase_s"] = round(time.monotonic() - run.started, 1)
        drained = run.drain(admitter)
        timings["drain_s"] = max(0.0, round(time.monotonic() - run.started - timings["fault_phase_s"], 1))
        run.show_progress(admitter.admitted, force=True)
        run.progress.done()
        if not drained:
            out(f"drain timed out after {config.drain_timeout_s:g} s: some executions are not terminal")
        graceful = True
    finally:
        admitter.stop.set()
        run.progress.done()
        run.phase = "stop"
        run.cleanup(graceful=graceful)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    timings["total_s"] = round(time.monotonic() - run.started, 1)
    out("checking invariants...")
    result = check(db_path, folder)
    for anomaly in run.anomalies:
        result.violate(anomaly["kind"], None, anomaly["detail"])
    harness = {
        "supervisors_started": len(run.fleet.handles),
        "supervisor_exits": run.fleet.exits,
        "frozen_children_alive_at_thaw": run.frozen_children_alive_at_thaw,
        "faults_skipped": run.skipped,
        "admitted_by_harness": admitter.admitted,
        "anomalies": run.anomalies,
    }
    return build_report(config, result, harness=harness, timings=timings, folder=folder, db_path=db_path,
                        began=began, ended=time.time(), source=source_of(ROOT))
