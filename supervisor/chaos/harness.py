"""`yieldstar chaos`: supervisors under fire, and proof afterwards that nothing was lost.

    harness (this process)                       supervisors, each its own process group
    +------------------------------------+      +----------------------------------------+
    | admitter thread: admits the seeded |      | yieldstar supervise worker.apps.chaos   |
    |   workload over the fault phase    |      |   +- worker  +- worker  +- worker ...  |
    | sender thread: sends messages to   |      |                                        |
    |   executions, as a client would    |      |                                        |
    | main loop, every 50 ms:            |      +----------------------------------------+
    |   tail steps.log: who is in a step |  SIGKILL / SIGSTOP / SIGCONT / SIGTERM, by pid
    |   tail imports.log: who is loading |  or by process group; a lock holder process
    |   inject the next planned fault ---|----> takes the ledger's write lock; a burst
    |   thaw, replace, reap supervisors  |      fills the ledger's tmpfs; a supervisor is
    |   progress line                    |      restarted slow, or with a skewed clock
    +------------------------------------+
    as root with disk_full: the ledger (and its -wal, -shm) lives on a tmpfs mounted in the work
    folder, copied off and unmounted at the end
    with --hosts N: each supervisor runs in a network namespace of its own, on the run's own
    PostgreSQL server (`chaos.hosts`); a partition takes a host's veth down, a frozen host is
    SIGSTOPped whole, the server is restarted; all of it torn down at the end
             |  after the fault phase: thaw everything, restore the fleet, wait until every
             v  execution is terminal, stop the supervisors gracefully, then run the checker
    checker (ledger + steps.log + external/*.log)  ->  report (JSON) + one-screen summary + page

Phases: (1) set up the work folder (and, for `disk_full`, the tmpfs) and a fresh ledger, and start
the supervisors, until each is supervising (on a loaded machine that takes seconds, which would
otherwise come off the fault phase); (2) the fault phase, `duration_s` long from then, during
which the workload is admitted (over its first 85%) and faults are injected; (3) the drain: no
more faults, `supervisors` healthy supervisors, until every execution is terminal or
`drain_timeout_s` passes; (4) graceful stop, copy the ledger off the tmpfs, checks, report.

The ledger is a SQLite file (the harness's own `<folder>/ledger.db` by default) or a PostgreSQL
database (`db_path` a `postgresql://` URI): the supervisors get it as their `--db`, and the
harness reads it through `ledger_reads`, the one module that knows the backend. Each backend has
its own fault kinds (`capabilities.BACKEND_ONLY`): the write lock, the full disk and the skewed
clock are a SQLite file's; `connection_kill` terminates PostgreSQL sessions. Either way the
ledger must hold no executions: one that does is refused, untouched.

With `hosts` (`--hosts N`), the harness makes N network-namespace hosts and starts its own
PostgreSQL server listening on their veths only (`chaos.hosts.RunHosts`), one supervisor in each
host; the kinds `partition`, `frozen_host` and `server_restart` join the others, and `clock_skew`
shifts a host's wall clock by seconds (the server's clock alone decides on PostgreSQL). It needs
root and `ip`; without them the run says why and does not start. The hosts, the server and the
namespaces are torn down at the end, on an interrupt as well; a dump of the database stays.

Fault kinds this host cannot inject are left out of a run that asked for all of them, with a
notice; naming one explicitly that cannot be injected is an error: `disk_full` needs root (it
mounts the tmpfs) and the harness's own ledger, `clock_skew` a runtime whose ledger clock a
skewed environment moves (`fleet.skewed_env`) and a lease with room for a skew.

One `random.Random(seed)` draws the workload and the fault plan (kinds, gaps, durations, and
which of the candidate targets is hit), so a run can be replayed with the same seed. Timing
still varies from run to run (process scheduling decides which step is running when a fault
fires), so a replay hits the same kinds of faults at the same moments, not the same steps.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import sqlite3
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import psutil

from worker.apps.chaos import COUNTER, MAILBOX, STEP_LOG
from worker._runtime.loading import check_app_name, is_app_path

from ..ledger.backends import is_uri, open_backend, shown
from ..ledger.errors import InvalidArgument, YieldstarError
from ..ledger.values import OUTCOME_STATUSES
from . import faults
from .capabilities import BACKEND_NAMES, applicable_kinds, kinds_not_offered
from .checker import check
from .config import ChaosConfig, per_supervisor
from .disk import Burst, LedgerDisk, size_mb
from .faults import Fault, FaultKind, FaultPlan
from . import hosts as hosts_faults
from .hosts import HostFaults, RunHosts
from .cpu_waits import CpuWaitSampler
from .fleet import EXITED, FROZEN, ROOT, RUNNING, STARTUP_PATIENCE_S, TICK_S, Fleet, SupervisorHandle
from .ledger_reads import ReadFailed, backend_kind, open_reader
from .progress import SHORT, Progress
from .watch import IMPORT_LOG, ImportWatcher, OpenStep, StepWatcher
from .sender import Sender
from .workload import CHAOS_APP, Admitter, app_workload, plan_workload

ADMIT_SHARE = 0.85  # the workload is admitted over this share of the fault phase
IN_STEP_PATIENCE_S = 2.0  # how long a fault waits for a target inside a step before taking any
GIVE_UP_S = 10.0  # how long a fault waits for any target at all before it is skipped
STARTUP_ALLOWANCE_S = 10.0  # beyond its import delays, for a slow-started pool to start


class ChaosInterrupted(YieldstarError):
    """Raised when a chaos run is told to stop (SIGINT, SIGTERM) before it finished; every
    process it started has been killed."""


@dataclass
class SlowStart:
    """A `slow_start` in progress: the replacement's workers are killed while they load the app."""

    target: dict  # the supervisor stopped, and its replacement
    step: Optional[dict]
    handle: SupervisorHandle  # the replacement
    delay_ms: int
    wanted: int  # workers to kill while they load the app
    offset: float  # how far into its import each is killed, as a share of the delay
    deadline: float  # monotonic: give up on more kills then
    at_s: float
    at_ms: int
    killed: list = field(default_factory=list)


@dataclass
class PendingBurst:
    """A `disk_full` burst in progress, journalled once it is over (with its real times)."""

    burst: Burst
    step: Optional[dict]
    at_s: float
    at_ms: int


class ChaosRun(HostFaults):
    def __init__(self, config: ChaosConfig, folder: str, db_path: str, out: Callable[[str], None], tty: bool,
                 disk: Optional[LedgerDisk] = None, hosts: Optional[RunHosts] = None):
        self.config = config
        self.hosts = hosts
        self.folder = folder
        self.db_path = db_path
        self.out = out
        self.disk = disk
        self.rng = random.Random(config.seed)
        self.plan = FaultPlan(self.rng, config.faults, interval_s=config.fault_interval_s,
                              lease_s=config.lease_ms / 1000)
        self.anomalies: list[dict] = []
        self.fleet = Fleet(config, db_path, folder, self._anomaly, skew=self._fleet_skew,
                           hosts=hosts.hosts if hosts else ())
        self.cut: dict = {}  # host index -> its partition in progress (`hosts.PendingHeal`)
        self.restarts: list = []  # `hosts.PendingRestart`
        self.watcher = StepWatcher(os.path.join(folder, STEP_LOG))
        self.cpu_waits = CpuWaitSampler(folder)
        self.imports = ImportWatcher(os.path.join(folder, IMPORT_LOG))
        self.slow_starts: list[SlowStart] = []
        self.bursts: list[PendingBurst] = []
        self.workers_killed_while_starting = 0
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
        self.reads = open_reader(db_path)
        # Before the first supervisor starts, every runtime session of the database is the
        # harness's own (its admitter's): `connection_kill` never takes one of those.
        self.own_sessions = ({s[0] for s in faults.runtime_sessions(self.reads)}
                             if FaultKind.CONNECTION_KILL in config.faults else set())

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
            rows = self.reads.rows("SELECT status, count(*) FROM executions GROUP BY status")
        except ReadFailed:
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
            + (f" ({frozen} frozen)" if frozen else "") + (f" ({len(self.cut)} cut off)" if self.cut else ""),
            force=force)

    # -- faults ----------------------------------------------------------------------------------

    def _fleet_skew(self) -> int:
        """The clock skew of a supervisor the fleet starts on its own (see `Fleet`)."""
        if FaultKind.CLOCK_SKEW not in self.config.faults:
            return 0
        return self.plan.fleet_skew_ms(self.config.max_skew_ms, hosts=bool(self.hosts))

    def _healthy(self) -> list[SupervisorHandle]:
        """Running supervisors that can take work now: not frozen, stopping, slow-starting, or cut
        off on a partitioned host."""
        starting = {s.handle.number for s in self.slow_starts}
        return [h for h in self.fleet.running()
                if h.number not in starting and not (h.host is not None and h.host.index in self.cut)]

    def _in_step_children(self, handles) -> list[tuple[SupervisorHandle, psutil.Process, OpenStep]]:
        found = []
        for h in handles:
            for child in h.workers():
                step = self.watcher.inside(child, skew_ms=h.wall_skew_ms)
                if step is not None:
                    found.append((h, child, step))
        return found

    def try_inject(self, kind: FaultKind, waited_s: float) -> bool:
        """Inject `kind` now if a target is inside a step (or we waited long enough); False to
        try again on the next tick."""
        # An app of the user's leaves no step log: no target is ever seen inside a step, so none is awaited.
        desperate = waited_s > IN_STEP_PATIENCE_S or self.config.app != CHAOS_APP
        if kind.hits_supervisor and len(self._healthy()) < min(2, self.config.supervisors):
            return False  # keep at least one healthy supervisor through every fault
        if kind.stalls_ledger:
            return self._stall(kind, desperate)
        if kind == FaultKind.CONNECTION_KILL:
            return self._kill_session(desperate)
        if kind == FaultKind.SERVER_RESTART:
            return self._restart_server(desperate)
        # A lenient supervisor would not notice a frozen worker for many seconds: freeze only
        # workers whose supervisor is expected to kill and replace them. A supervisor is
        # restarted only once it has started up (before, SIGTERM is not yet a graceful stop).
        eligible = [h for h in self._healthy() if not (kind == FaultKind.FREEZE_CHILD and h.lenient)
                    and not (kind.restarts_supervisor and not h.started_up())]
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
        if kind in (FaultKind.KILL_CHILD, FaultKind.FREEZE_CHILD) and self.config.workers:
            # A worker of several deliveries: the fault takes every one of them, and the journal
            # names those it was inside a step of (the checker knows the others from their
            # supervisor's log).
            target["in_steps"] = [[s.execution_id, s.token]
                                  for s in self.watcher.inside_all(child, skew_ms=handle.wall_skew_ms)]
        now = time.monotonic()
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
            replacement = self.fleet.replace(handle)
            self._record(kind, dict(target, replacement=replacement.number), step_info)
        elif kind == FaultKind.TERM_SUPERVISOR:
            self.fleet.terminate(handle)
            replacement = self.fleet.replace(handle)
            self._record(kind, dict(target, replacement=replacement.number), step_info)
        elif kind == FaultKind.FREEZE_SUPERVISOR:
            if not faults.signal_group(handle.pid, signal.SIGSTOP):
                return False
            handle.state = FROZEN
            seconds = self.plan.freeze_supervisor_s()
            self.pending.append((now + seconds, lambda: self._thaw_supervisor(handle)))
            self._record(kind, target, step_info, {"seconds": round(seconds, 3)})
        elif kind == FaultKind.SLOW_START:
            self._slow_start(handle, target, step_info)
        elif kind.hits_host:
            self._hit_host(kind, handle, target, step_info, now)
        elif kind == FaultKind.CLOCK_SKEW:
            skew = self.plan.host_skew_ms() if self.hosts else self.plan.skew_ms(self.config.max_skew_ms)
            self.fleet.terminate(handle)
            replacement = self.fleet.replace(handle, skew_ms=skew)
            self._record(kind, dict(target, replacement=replacement.number, replacement_pid=replacement.pid),
                         step_info, {"skew_ms": skew, "previous_skew_ms": handle.wall_skew_ms or handle.skew_ms,
                                     "wall_clock": bool(self.hosts)})
        return True

    def _stall(self, kind: FaultKind, desperate: bool) -> bool:
        """A held write lock or a full disk: one of each at a time, while a worker is in a step."""
        if (self.lock_holders if kind == FaultKind.HOLD_WRITE_LOCK else self.bursts):
            return False
        inside = self._in_step_children(self.fleet.running())
        step = self.plan.choose(inside)[2].as_dict() if inside else None
        if step is None and not desperate:
            return False
        if kind == FaultKind.HOLD_WRITE_LOCK:
            seconds = self.plan.hold_lock_s()
            holder = faults.hold_write_lock(self.db_path, seconds, os.path.join(self.folder, "logs", "lock-holders.log"))
            self.lock_holders.append(holder)
            self._record(kind, {"pid": holder.pid}, step, {"seconds": round(seconds, 3)})
        else:
            burst = self.disk.burst(self.plan.disk_full_s())
            self.bursts.append(PendingBurst(burst, step, time.monotonic() - self.started, time.time_ns() // 10**6))
        return True

    def _kill_session(self, desperate: bool) -> bool:
        """Terminate one runtime session of the PostgreSQL ledger: one busy in a statement or a
        transaction if there is one (or we waited long enough), never one of the harness's own.
        Any moment will do, a supervisor's start included: a supervisor and a worker wait a
        transient error out while they open the ledger, and retry their calls after."""
        try:
            sessions = [s for s in faults.runtime_sessions(self.reads) if s[0] not in self.own_sessions]
        except ReadFailed:
            return False
        busy = [s for s in sessions if s[2] not in ("idle", None)]
        if not busy and not (desperate and sessions):
            return False
        pid, application, state, query = self.plan.choose(busy or sessions)
        try:
            if not faults.terminate_session(self.reads, pid):
                return False  # it ended meanwhile
        except ReadFailed:
            return False
        self._record(FaultKind.CONNECTION_KILL, {"session_pid": pid, "application_name": application}, None,
                     {"state": state, "query": query, "sessions": len(sessions)})
        return True

    def _slow_start(self, handle: SupervisorHandle, target: dict, step: Optional[dict]) -> None:
        """Restart `handle` with an app that is slow to import; `_tend` kills its workers while
        they load it."""
        delay = self.plan.import_delay_ms()
        wanted = self.plan.start_kills(self.config.worker_processes)
        offset = self.plan.kill_offset()
        at_s, at_ms = time.monotonic() - self.started, time.time_ns() // 10**6
        self.fleet.terminate(handle)
        replacement = self.fleet.replace(handle, import_delay_ms=delay)
        # Killed workers are replaced and load the app again: time for them too, and a start.
        deadline = time.monotonic() + (wanted + 1) * delay / 1000 + STARTUP_ALLOWANCE_S
        self.slow_starts.append(SlowStart(dict(target, replacement=replacement.number, replacement_pid=replacement.pid),
                                          step, replacement, delay, wanted, offset, deadline, at_s, at_ms))

    def _sample_cpu_waits(self) -> None:
        """How long each supervisor and worker has waited for a CPU (`cpu_waits`): the checker's
        evidence that a holder was starved, not stuck."""
        self.cpu_waits.sample(pid for h in self.fleet.handles if h.state != EXITED
                              for pid in (h.pid, *h.workers_seen))

    def _tend(self) -> None:
        """Faults in progress: reap lock holders, journal bursts that ended, kill the workers of
        slow starts while they load the app."""
        self.lock_holders = [p for p in self.lock_holders if p.poll() is None]
        self._tend_restarts()
        for pending in [b for b in self.bursts if not b.burst.is_alive()]:
            self.bursts.remove(pending)
            self._end_burst(pending)
        if self.slow_starts:
            self.imports.poll()
        now_ns = time.time_ns()
        for start in list(self.slow_starts):
            killed = {k["pid"] for k in start.killed}
            # The template process imports the app for the workers it forks; killed, the workers
            # are started as fresh interpreters, each importing the app.
            for child in start.handle.loaders() if len(killed) < start.wanted else ():
                began = self.imports.importing_since(child)
                if began is None or child.pid in killed or now_ns - began < start.offset * start.delay_ms * 10**6:
                    continue
                if faults.kill(child):
                    start.killed.append({"pid": child.pid, "at_ms": now_ns // 10**6,
                                         "importing_for_ms": (now_ns - began) // 10**6})
                    self.workers_killed_while_starting += 1
                break  # one a tick: the kills spread over the pool's start
            if len(start.killed) >= start.wanted or time.monotonic() > start.deadline \
                    or start.handle.state != RUNNING:
                self._end_slow_start(start)

    def _end_burst(self, pending: PendingBurst) -> None:
        params = pending.burst.as_params()
        if pending.burst.error:
            self._anomaly("disk_full_failed", pending.burst.error)
        self._record(FaultKind.DISK_FULL, {"mount": self.disk.mount_point}, pending.step, params,
                     at_s=pending.at_s, at_ms=pending.at_ms)

    def _end_slow_start(self, start: SlowStart) -> None:
        self.slow_starts.remove(start)
        self._record(FaultKind.SLOW_START, start.target, start.step,
                     {"import_delay_ms": start.delay_ms, "wanted_kills": start.wanted, "workers_killed": start.killed},
                     at_s=start.at_s, at_ms=start.at_ms)

    def _thaw_child(self, child: psutil.Process) -> None:
        if faults.alive(child):
            self.frozen_children_alive_at_thaw += 1
            faults.thaw(child)

    def _thaw_supervisor(self, handle: SupervisorHandle) -> None:
        faults.signal_group(handle.pid, signal.SIGCONT)
        if handle.state == FROZEN:
            handle.state = RUNNING

    def _record(self, kind: FaultKind, target: dict, step: Optional[dict], params: Optional[dict] = None, *,
                at_s: Optional[float] = None, at_ms: Optional[int] = None) -> None:
        fault = Fault(kind, time.monotonic() - self.started if at_s is None else at_s, target, step, params or {},
                      time.time_ns() // 10**6 if at_ms is None else at_ms)
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

    def start_fleet(self) -> float:
        """Start the supervisors and wait until each is supervising (`STARTUP_PATIENCE_S` at most);
        the fault phase is timed from then. Returns the seconds it took."""
        self.fleet.ensure(self.config.supervisors)
        deadline = time.monotonic() + STARTUP_PATIENCE_S
        while time.monotonic() < deadline:
            self._check_stop()
            self.fleet.reap()
            self.fleet.ensure(self.config.supervisors)  # one that crashed at start is replaced (and reported)
            if all(h.started_up() for h in self.fleet.members()):
                break
            time.sleep(TICK_S)
        took = time.monotonic() - self.started
        self.started = time.monotonic()
        return took

    def fault_phase(self, admitter: Admitter, sender: Optional[Sender] = None) -> None:
        c = self.config
        self.phase = "faults"
        end = self.started + c.duration_s
        next_at = self.started + self.plan.gap()
        kind: Optional[FaultKind] = None
        while time.monotonic() < end:
            self._check_stop()
            self.fleet.reap()
            self.fleet.ensure(c.supervisors)
            self._sample_cpu_waits()
            self.watcher.poll()
            self.run_pending()
            self._tend()
            now = time.monotonic()
            if c.faults and now >= next_at:
                kind = kind or self.plan.next_kind()
                injected = self.try_inject(kind, now - next_at)
                if not injected and now - next_at > GIVE_UP_S:
                    self.skipped[kind.value] = self.skipped.get(kind.value, 0) + 1
                if injected or now - next_at > GIVE_UP_S:
                    kind = None
                    next_at = now + self.plan.gap()
            _raise_thread_errors(admitter, sender)
            self.show_progress(admitter.admitted)
            time.sleep(TICK_S)

    def drain(self, admitter: Admitter, sender: Optional[Sender] = None) -> bool:
        """No more faults: thaw everything, restore the fleet, and wait until every execution is
        terminal (the sender carries on with the messages still to send). True if they all are."""
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
            self._sample_cpu_waits()
            self._tend()
            _raise_thread_errors(admitter, sender)
            s = self.statuses()
            self.show_progress(admitter.admitted)
            if sum(s.values()) and sum(n for st, n in s.items() if st not in OUTCOME_STATUSES) == 0:
                return True
            time.sleep(0.25)
        return False

    def cleanup(self, *, graceful: bool) -> None:
        for holder in self.lock_holders:
            if holder.poll() is None:
                holder.kill()
            holder.wait()
        for pending in self.bursts:
            pending.burst.join()
            self._end_burst(pending)
        self.bursts = []
        for start in list(self.slow_starts):
            self._end_slow_start(start)
        self._tend_restarts(all_now=True)
        self.run_pending(all_now=True)
        if graceful:
            self.fleet.stop_all()
        self.fleet.kill_all()
        self.cpu_waits.close()
        self._journal.close()
        self.reads.close()


def _raise_thread_errors(admitter: Admitter, sender: Optional[Sender]) -> None:
    """What ended the admitter or the sender, if anything did: the run fails with it."""
    for thread in (admitter, sender):
        if thread is not None and thread.error is not None:
            raise thread.error


def _fresh_ledger(db_path: str):
    """The new ledger with the workload's stores, open: the admitter's backend. A ledger that
    already holds executions (a SQLite file or a PostgreSQL database) is refused, untouched.

    A SQLite file is opened before any other connection of this process to the file. Opening a backend
    checks the file through a descriptor of its own, and closing any descriptor of a file drops
    every POSIX lock the process holds on it, SQLite's included: a connection that lost its
    shared lock no longer stops another process's last close from deleting the -wal under it."""
    backend = open_backend(db_path)
    try:
        if backend.executions.list(limit=1):
            raise InvalidArgument(f"--db {shown(db_path)} already holds executions; chaos needs a ledger of its own")
        backend.stores.get_or_create(COUNTER, "0")
        backend.stores.get_or_create(MAILBOX, "[]")
    except BaseException:
        backend.close()
        raise
    return backend


def run_chaos(config: ChaosConfig, *, folder: Optional[str] = None, db_path: Optional[str] = None,
              out: Callable[[str], None] = print, tty: bool = False) -> dict:
    """Run one chaos experiment and return its report (see `supervisor.chaos.report`).

    Args:
        folder: the work folder (ledger, logs, evidence); a new temporary one when None. It is kept.
        db_path: the ledger: a SQLite path or a `postgresql://` URI; `<folder>/ledger.db` when None.
            It must hold no executions yet. With `disk_full`, the ledger lives on a tmpfs in the
            folder during the run, and is copied to `<folder>/ledger.db` at the end. The fault
            kinds of the other backend are not offered (`capabilities.BACKEND_ONLY`). None with
            `config.hosts`: the run makes its own server (and keeps a dump, `<folder>/ledger.dump`).
        out: where lines of output go; `tty` makes the progress line update in place.
    """
    if config.hosts:
        why = hosts_faults.available()
        if why is not None:
            raise InvalidArgument(f"--hosts cannot run here: {why}")
        if db_path is not None:
            raise InvalidArgument("--hosts starts its own PostgreSQL server, listening on the hosts' veths only;"
                                  " leave out --db")
    if is_app_path(config.app):
        check_app_name(config.app)
        config = dataclasses.replace(config, app=os.path.abspath(config.app))  # the supervisors run in the folder
    folder = os.path.abspath(folder or tempfile.mkdtemp(prefix=f"yieldstar-chaos-{config.seed}-"))
    os.makedirs(os.path.join(folder, "logs"), exist_ok=True)
    config, dropped = applicable_kinds(config, folder, db_path)
    for kind, why in dropped.items():
        out(f"yieldstar chaos: leaving out {kind}: {why}")
    disk = None
    if FaultKind.DISK_FULL in config.faults:
        if os.path.exists(os.path.join(folder, "ledger.db")):  # where the ledger is copied at the end
            raise InvalidArgument(f"{shown(folder)} already holds a ledger.db (of an earlier run?): with disk_full the"
                                  " run copies its ledger there at the end; give it a work folder of its own")
        disk = LedgerDisk(folder, size_mb(config.executions))
        disk.mount()
    backend = None
    hosts = RunHosts(config.hosts) if config.hosts else None
    try:
        if hosts:
            out(f"yieldstar chaos: making {config.hosts} hosts (network namespaces) and their PostgreSQL server")
            db_path = hosts.start()
        elif disk:
            db_path = disk.db_path
        elif not is_uri(db_path):
            db_path = os.path.abspath(db_path or os.path.join(folder, "ledger.db"))
        backend = _fresh_ledger(db_path)
        if disk:
            disk.pin()
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config.as_dict(), f, indent=2)
        return _run(config, folder, db_path, backend, disk, dropped, out, tty, hosts)
    finally:
        if backend is not None:
            backend.close()
        if hosts:
            trouble = hosts.stop(folder)
            out("yieldstar chaos: hosts, server and namespaces removed"
                + (f"; {trouble}" if trouble else f"; the database is dumped to {os.path.join(folder, 'ledger.dump')}"))
        if disk:
            trouble = disk.unmount()
            if trouble:
                out(f"yieldstar chaos: {trouble}")


def _run(config: ChaosConfig, folder: str, db_path: str, backend, disk: Optional[LedgerDisk],
         dropped: dict, out: Callable[[str], None], tty: bool, hosts: Optional[RunHosts] = None) -> dict:
    from .report import build_report, source_of

    began = time.time()
    run = ChaosRun(config, folder, db_path, out, tty, disk, hosts)
    if config.app == CHAOS_APP:
        admissions = plan_workload(run.rng, config.executions, config.duration_s * ADMIT_SHARE, folder,
                                   config.lease_ms / 1000, with_async=bool(config.workers))
    else:
        admissions = app_workload(config.app, run.rng, config.executions, config.duration_s * ADMIT_SHARE)
    out(f"yieldstar chaos: seed {config.seed}, {config.duration_s:g} s of faults, {config.supervisors} supervisors"
        f" x {per_supervisor(config.concurrency, config.workers)}, {config.executions} executions on {_backend_name(db_path)} ledger"
        f" {shown(db_path)}; work folder {folder}")
    listening = None
    if hosts:
        listening = hosts.listening()
        out(f"yieldstar chaos: {config.hosts} hosts, one supervisor each; the server listens on"
            f" {', '.join(listening)} (the hosts' veths) and its Unix socket, nowhere else")
    admitter = Admitter(backend, admissions, run.started)  # timed from the start of the fault phase
    sender = Sender(db_path, folder, admitter, run.started)
    fleet_began = time.monotonic()
    graceful = False
    timings = {}
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, run.request_stop)
    try:
        timings["startup_s"] = round(run.start_fleet(), 1)
        admitter.started = sender.started = run.started
        admitter.start()
        if sender.sends:
            sender.start()
        run.fault_phase(admitter, sender)
        timings["fault_phase_s"] = round(time.monotonic() - run.started, 1)
        drained = run.drain(admitter, sender)
        timings["drain_s"] = max(0.0, round(time.monotonic() - run.started - timings["fault_phase_s"], 1))
        run.show_progress(admitter.admitted, force=True)
        run.progress.done()
        if not drained:
            out(f"drain timed out after {config.drain_timeout_s:g} s: some executions are not terminal")
        graceful = True
    finally:
        admitter.stop.set()
        sender.stop.set()
        for thread in (admitter, sender):
            if thread.is_alive():
                thread.join()  # done with the ledger before anything closes or unmounts it
        run.progress.done()
        run.phase = "stop"
        run.cleanup(graceful=graceful)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        disk_figures = None
        if disk:
            disk_figures = {"tmpfs_mb": disk.size_mb, "used_mb_at_end": disk.used_mb()}
            ledger_on_tmpfs = db_path
            db_path = os.path.join(folder, "ledger.db")
            try:
                disk.copy_out(db_path)  # the ledger outlives the tmpfs: the checker and the reader need it
                out(f"ledger copied off the tmpfs ({ledger_on_tmpfs}) to {db_path}")
            except (OSError, sqlite3.Error) as exc:
                if graceful:
                    raise
                out(f"could not copy the ledger off the tmpfs: {exc}")
    timings["total_s"] = round(time.monotonic() - fleet_began, 1)
    out("checking invariants...")
    result = check(db_path, folder)
    for anomaly in run.anomalies:
        result.violate(anomaly["kind"], None, anomaly["detail"])
    harness = {
        "supervisors_started": len(run.fleet.handles),
        "supervisor_exits": run.fleet.exits,
        "frozen_children_alive_at_thaw": run.frozen_children_alive_at_thaw,
        "faults_skipped": run.skipped,
        "ledger_backend": _backend_name(db_path),
        "kinds_not_offered": kinds_not_offered(backend_kind(db_path), config.hosts),
        "kinds_left_out": dropped,
        "admitted_by_harness": admitter.admitted,
        "messages_sent_by_harness": sender.sent,
        "workers_killed_while_starting": run.workers_killed_while_starting,
        "disk": disk_figures,
        "hosts": {"count": config.hosts, "server_listening_on": listening,
                  "veths": {h.index: {"host": h.host_address, "database": h.db_address} for h in hosts.hosts},
                  "dump": os.path.join(folder, "ledger.dump")} if hosts else None,
        "anomalies": run.anomalies,
    }
    return build_report(config, result, harness=harness, timings=timings, folder=folder, db_path=shown(db_path),
                        began=began, ended=time.time(), source=source_of(ROOT))


def _backend_name(db_path: str) -> str:
    return BACKEND_NAMES[backend_kind(db_path)]
