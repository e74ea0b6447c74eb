"""The fault injectors of `yieldstar chaos`, and the seeded plan that says which fault comes when.

Every injector works on real processes with real signals. Pids are never trusted on their own:
a target is a `psutil.Process`, whose identity (pid and start time) psutil checks before it
signals, so a pid that was reused by an unrelated process is never hit.

| kind                | what happens                                                             |
| ------------------- | ------------------------------------------------------------------------ |
| `kill_child`        | SIGKILL one worker while it is inside a step                             |
| `freeze_child`      | SIGSTOP one worker inside a step; its supervisor should kill and replace it; SIGCONT later if it still exists |
| `kill_supervisor`   | SIGKILL a supervisor whose worker is inside a step (its workers are orphaned); a new one is started |
| `freeze_supervisor` | SIGSTOP a supervisor's whole process group for longer than a lease, then SIGCONT |
| `term_supervisor`   | SIGTERM a supervisor (graceful stop); a new one is started               |
| `hold_write_lock`   | another process takes the database's write lock (`BEGIN IMMEDIATE`) for seconds, then rolls back |
"""

from __future__ import annotations

import enum
import os
import random
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Optional

import psutil


class FaultKind(str, enum.Enum):
    KILL_CHILD = "kill_child"
    FREEZE_CHILD = "freeze_child"
    KILL_SUPERVISOR = "kill_supervisor"
    FREEZE_SUPERVISOR = "freeze_supervisor"
    TERM_SUPERVISOR = "term_supervisor"
    HOLD_WRITE_LOCK = "hold_write_lock"

    def __str__(self) -> str:
        return self.value

    @property
    def hits_supervisor(self) -> bool:
        return self in (FaultKind.KILL_SUPERVISOR, FaultKind.FREEZE_SUPERVISOR, FaultKind.TERM_SUPERVISOR)

    @property
    def hits_child(self) -> bool:
        return self in (FaultKind.KILL_CHILD, FaultKind.FREEZE_CHILD)


ALL_KINDS = tuple(FaultKind)


def parse_kinds(values) -> tuple[FaultKind, ...]:
    """Fault kinds from names, given separately or comma-separated; empty (or `all`) means all
    of them, `none` none (a control run)."""
    names = [n.strip() for v in values for n in str(v).split(",") if n.strip()]
    if not names or names == ["all"]:
        return ALL_KINDS
    if names == ["none"]:
        return ()
    known = {k.value: k for k in FaultKind}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown fault kind(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return tuple(dict.fromkeys(known[n] for n in names))


@dataclass
class Fault:
    """One injected fault, as the journal (`faults.jsonl`) records it."""

    kind: FaultKind
    at_s: float  # seconds since the fault phase began
    target: dict  # pids, and which supervisor
    step: Optional[dict]  # the step the target was inside: execution, token, key, pid
    params: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"kind": self.kind.value, "at_s": round(self.at_s, 3), "target": self.target, "step": self.step,
                "params": self.params}


class FaultPlan:
    """Which fault comes next, when, and how long it lasts: all drawn from one seeded RNG.

    Kinds come in rounds, each a shuffled sequence of every enabled kind, so even a short run
    injects each kind about equally often. Gaps between faults are exponential around
    `interval_s` (clipped to a fifth and three times that)."""

    def __init__(self, rng: random.Random, kinds, *, interval_s: float, lease_s: float):
        self.rng = rng
        self.kinds = tuple(kinds)
        self.interval_s = interval_s
        self.lease_s = lease_s
        self._round: list[FaultKind] = []

    def next_kind(self) -> FaultKind:
        if not self._round:
            self._round = list(self.kinds)
            self.rng.shuffle(self._round)
        return self._round.pop()

    def gap(self) -> float:
        mean = self.interval_s
        return min(max(self.rng.expovariate(1 / mean), mean / 5), mean * 3)

    def freeze_supervisor_s(self) -> float:
        """Longer than a lease, so that another supervisor takes over the frozen one's work."""
        return self.rng.uniform(1.3, 3.0) * self.lease_s

    def freeze_child_s(self) -> float:
        """How long before SIGCONT: its supervisor should have killed it well before."""
        return self.rng.uniform(1.5, 3.0) * self.lease_s

    def hold_lock_s(self) -> float:
        """Seconds, and well below the 15 s busy timeout of every ledger connection."""
        return self.rng.uniform(1.0, 4.0)

    def choose(self, items: list):
        return self.rng.choice(items)


# -- injectors -----------------------------------------------------------------------------------

def alive(process: psutil.Process) -> bool:
    """Still the same process, and not a zombie."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def send(process: psutil.Process, sig: int) -> bool:
    """Signal `process` if it is still the process it was; False if it is gone."""
    try:
        process.send_signal(sig)  # psutil refuses if the pid now names another process
        return True
    except psutil.Error:
        return False


def signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


LOCK_HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
conn.execute("BEGIN IMMEDIATE")
sys.stdout.write("held\\n"); sys.stdout.flush()
time.sleep(float(sys.argv[2]))
conn.execute("ROLLBACK")
"""


def hold_write_lock(db_path: str, seconds: float, log_path: str) -> subprocess.Popen:
    """Start another process that takes the ledger's write lock for `seconds`, then rolls back."""
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, db_path, f"{seconds:.3f}"],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def freeze(process: psutil.Process) -> bool:
    return send(process, signal.SIGSTOP)


def thaw(process: psutil.Process) -> bool:
    return send(process, signal.SIGCONT)


def kill(process: psutil.Process) -> bool:
    return send(process, signal.SIGKILL)
