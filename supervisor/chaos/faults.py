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
| `hold_write_lock`   | another process takes the write lock (`BEGIN IMMEDIATE`) for 0.5-2 leases, then rolls back |
| `disk_full`         | the tmpfs that holds the ledger is filled to 100% for 30-300 ms, then freed (root only) |
| `slow_start`        | a supervisor is restarted with an app that takes 1-4 s to import; 1-2 of its workers |
|                     | are SIGKILLed while they load it, before they report ready               |
| `clock_skew`        | a supervisor is restarted with its ledger clock ahead or behind (by a few hundred ms) |
| `connection_kill`   | (PostgreSQL) `pg_terminate_backend` of one runtime session (`application_name` |
|                     | `yieldstar...`), preferably one busy in a statement or a transaction      |
| `partition`         | (hosts) one host's veth goes down for 0.5-3 leases while a worker of it is mid-step, then up |
| `frozen_host`       | (hosts) SIGSTOP every process of one host for 1.3-3 leases, then SIGCONT  |
| `server_restart`    | (hosts) the run's PostgreSQL server: a fast shutdown, then a start        |

`hold_write_lock` and `disk_full` exist on a SQLite ledger only, `connection_kill` on PostgreSQL
only; `partition`, `frozen_host` and `server_restart` need `--hosts` (the run's own server and
network namespaces); `clock_skew` skews a SQLite ledger's clock, or, with `--hosts`, a host's wall
clock by seconds (`capabilities` says why each runs where it does).

Clocks are also a property of the fleet: with `clock_skew` enabled, about half of the supervisors
the harness starts run with a skewed clock (see `FaultPlan.skew_ms` for how far).
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
    DISK_FULL = "disk_full"
    SLOW_START = "slow_start"
    CLOCK_SKEW = "clock_skew"
    CONNECTION_KILL = "connection_kill"
    PARTITION = "partition"
    FROZEN_HOST = "frozen_host"
    SERVER_RESTART = "server_restart"

    def __str__(self) -> str:
        return self.value

    @property
    def hits_supervisor(self) -> bool:
        """It takes a supervisor out of service for a while (the harness keeps another healthy)."""
        return self in (FaultKind.KILL_SUPERVISOR, FaultKind.FREEZE_SUPERVISOR, FaultKind.TERM_SUPERVISOR,
                        FaultKind.SLOW_START, FaultKind.CLOCK_SKEW, FaultKind.PARTITION, FaultKind.FROZEN_HOST)

    @property
    def hits_host(self) -> bool:
        """It cuts off or freezes a whole host (`--hosts`)."""
        return self in (FaultKind.PARTITION, FaultKind.FROZEN_HOST)

    @property
    def restarts_supervisor(self) -> bool:
        """It stops a supervisor gracefully and starts a replacement that differs from it."""
        return self in (FaultKind.SLOW_START, FaultKind.CLOCK_SKEW)

    @property
    def stalls_ledger(self) -> bool:
        """For a while, no process can write to the ledger."""
        return self in (FaultKind.HOLD_WRITE_LOCK, FaultKind.DISK_FULL)

    @property
    def hits_child(self) -> bool:
        return self in (FaultKind.KILL_CHILD, FaultKind.FREEZE_CHILD)


ALL_KINDS = tuple(FaultKind)
HOST_SKEW_MS = 30_000  # the farthest a host's wall clock is skewed (`--hosts`), either way


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
    at_ms: int = 0  # wall-clock time of the injection (ms since the epoch), to set beside ledger times

    def as_dict(self) -> dict:
        return {"kind": self.kind.value, "at_s": round(self.at_s, 3), "at_ms": self.at_ms, "target": self.target,
                "step": self.step, "params": self.params}


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

    def partition_s(self) -> float:
        """How long a host stays cut off: half a lease to three. A cut shorter than the lease may
        still cost its leases: TCP retransmits a renewal caught by the cut only after a backoff."""
        return self.rng.uniform(0.5, 3.0) * self.lease_s

    def freeze_host_s(self) -> float:
        """Longer than a lease, as `freeze_supervisor_s`: the other hosts take the work over."""
        return self.rng.uniform(1.3, 3.0) * self.lease_s

    def freeze_child_s(self) -> float:
        """How long before SIGCONT: its supervisor should have killed it well before."""
        return self.rng.uniform(1.5, 3.0) * self.lease_s

    def hold_lock_s(self) -> float:
        """Half a lease to two: about half the holds are shorter than a lease, and then no lease
        may be lost to them; the rest outlast it, and only the leases that really expire may be."""
        return self.rng.uniform(0.5, 2.0) * self.lease_s

    def disk_full_s(self) -> float:
        """How long the disk stays full: short bursts, as a log rotation or a filling neighbour
        would cause, all shorter than a lease."""
        return self.rng.uniform(0.03, 0.3)

    def import_delay_ms(self) -> int:
        """How long the app of a slow-started supervisor takes to import."""
        return self.rng.randint(1000, 4000)

    def start_kills(self, concurrency: int) -> int:
        """How many workers of a slow-started supervisor are killed while they load the app: one
        or two, a start-up storm and not an app that cannot load (a supervisor gives up on its
        app when every worker dies while loading it, three times in a row)."""
        return self.rng.randint(1, min(2, concurrency))

    def kill_offset(self) -> float:
        """How far into its import a worker of a slow start is killed, as a share of the delay."""
        return self.rng.uniform(0.1, 0.8)

    def skew_ms(self, bound_ms: int) -> int:
        """A clock skew for a supervisor restarted by `clock_skew`: ahead or behind by a quarter to
        all of `bound_ms` (never 0)."""
        return self.rng.choice((-1, 1)) * self.rng.randint(max(1, bound_ms // 4), bound_ms)

    def host_skew_ms(self) -> int:
        """A host's wall-clock skew (`--hosts`): seconds ahead or behind, up to `HOST_SKEW_MS`.
        On PostgreSQL the server's clock is the only clock that decides, so any skew must do."""
        return self.rng.choice((-1, 1)) * self.rng.randint(HOST_SKEW_MS // 30, HOST_SKEW_MS)

    def fleet_skew_ms(self, bound_ms: int, *, hosts: bool = False) -> int:
        """The clock skew of a supervisor the fleet starts: half of them keep the true time. With
        `hosts`, a wall-clock skew of seconds (`host_skew_ms`)."""
        if self.rng.random() >= 0.5:
            return 0
        return self.host_skew_ms() if hosts else self.skew_ms(bound_ms)

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


# The lock holder logs when it got the lock and when it let go (`held|released <pid> <time_ns>`):
# the checker needs the window the ledger really was locked, not when the process was started.
LOCK_HOLDER = """
import os, sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
conn.execute("BEGIN IMMEDIATE")
sys.stdout.write(f"held {os.getpid()} {time.time_ns()}\\n"); sys.stdout.flush()
time.sleep(float(sys.argv[2]))
conn.execute("ROLLBACK")
sys.stdout.write(f"released {os.getpid()} {time.time_ns()}\\n"); sys.stdout.flush()
"""


def hold_write_lock(db_path: str, seconds: float, log_path: str) -> subprocess.Popen:
    """Start another process that takes the ledger's write lock for `seconds`, then rolls back."""
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, db_path, f"{seconds:.3f}"],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


# The runtime's sessions of the ledger's database: the supervisors' and workers' (`yieldstar`)
# and the supervisors' listeners (`yieldstar-listen`); the harness's own are `chaos-harness`.
RUNTIME_SESSIONS = ("SELECT pid, application_name, state, left(query, 120) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name LIKE 'yieldstar%'"
                    " AND pid <> pg_backend_pid() ORDER BY pid")


def runtime_sessions(reader) -> list[tuple]:
    """(backend pid, application_name, state, query) of every runtime session of the database,
    read through a `ledger_reads.PostgresReader`."""
    return reader.rows(RUNTIME_SESSIONS)


def terminate_session(reader, pid: int) -> bool:
    """`pg_terminate_backend(pid)`; False if that session is already gone."""
    return bool(reader.rows("SELECT pg_terminate_backend($p)", (pid,))[0][0])


def freeze(process: psutil.Process) -> bool:
    return send(process, signal.SIGSTOP)


def thaw(process: psutil.Process) -> bool:
    return send(process, signal.SIGCONT)


def kill(process: psutil.Process) -> bool:
    return send(process, signal.SIGKILL)
