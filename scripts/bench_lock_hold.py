"""Benchmark: what a write lock held by another process costs a supervisor's deliveries.

    .venv/bin/python scripts/bench_lock_hold.py [--tree PATH] [--workers 6] [--holds 0.3,0.6,...]

Each round starts a real `yieldstar supervise` (`python -m supervisor.cli` of the source tree
`--tree`, default this repository, in a session of its own) on a fresh ledger, with `--workers`
workers: all but one run a long step (`lockhold.step` in scripts/lock_hold_app.py: it sleeps the
hold plus 2 s, so it outlasts the hold), and the last serves a durable timer that comes due every
`--tick-ms` (`lockhold.ticker`), so the supervisor's own loop has claims and acknowledgements to
make while the lock is held, as a supervisor with any timer-driven work does. Once every long step
is running, and just after a tick was acknowledged, this process takes the database's write lock
(`BEGIN IMMEDIATE`) for the round's hold, then rolls back. The round ends when every long step's
execution has completed. From the ledger's lease history and the app's side-effect log it counts:

- deliveries superseded (`lease_history.ended_by = 'superseded'`: a later claim took over a
  lease that had expired), and per second of lock held;
- repeated steps: long steps whose body ran again (a second `begin` in the side-effect log);
- the longest wait: how much later than its step alone allowed an execution completed
  (completion - first claim - step length);
- workers replaced: workers alive when the lock was taken and gone when the round ended.

The default holds are 0.5x, 1x, 1.5x and 3x the heartbeat tolerance (heartbeat-ms x misses),
half the lease, just below the lease, and 1.5x the lease. A hold must stay below the ledger's
15 s busy timeout, or the waiting writers give up instead of waiting.

The raw single-row SQLite commit rate of the same file system (scripts/benchlib.py) is printed
beside the figures, before and after the rounds: the machine is shared and noisy.

To measure older code, check it out beside this one and point `--tree` at it; it runs with this
venv's Python, with PYTHONPATH set to the tree:

    git worktree add /tmp/before 156ca75
    .venv/bin/python scripts/bench_lock_hold.py --tree /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from benchlib import raw_commit_rate  # noqa: E402

APP = os.path.join(HERE, "lock_hold_app.py")
TICKER = "ticker"
POLL_S = 0.02
STEP_MARGIN_S = 2.0  # a long step outlasts the hold by this much


class Interrupted(Exception):
    """Raised from a poll once SIGTERM asked the benchmark to stop."""


@dataclass(frozen=True)
class Settings:
    tree: str
    workers: int
    lease_ms: int
    heartbeat_ms: int
    misses: int
    tick_ms: int
    grace_ms: int = 1000

    @property
    def tolerance_s(self) -> float:
        return self.heartbeat_ms * self.misses / 1000

    @property
    def lease_s(self) -> float:
        return self.lease_ms / 1000

    def default_holds(self) -> list[float]:
        t, lease = self.tolerance_s, self.lease_s
        return [round(h, 2) for h in (0.5 * t, t, 1.5 * t, 3 * t, 0.5 * lease, 0.9 * lease, 1.5 * lease)]


@dataclass
class Result:
    hold_s: float
    superseded: int
    repeated: int
    longest_wait_s: float
    replaced: int
    unfinished: int  # long executions not completed by the round's deadline


class Processes:
    """Every process this benchmark starts, and every descendant seen, so that all of them can be
    stopped and reaped, on failure and on Ctrl-C too."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []
        self.seen: dict[tuple[int, float], psutil.Process] = {}
        self.stop_requested = False

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        process = subprocess.Popen(argv, **kwargs)
        self.started.append(process)
        return process

    def note_descendants(self, process: subprocess.Popen) -> list[psutil.Process]:
        try:
            found = psutil.Process(process.pid).children(recursive=True)
        except psutil.Error:
            return []
        for child in found:
            try:
                self.seen[(child.pid, child.create_time())] = child
            except psutil.Error:
                pass
        return found

    def stop(self, process: subprocess.Popen, timeout: float) -> None:
        """SIGTERM (a graceful stop), then SIGKILL to its whole session's group if it lingers."""
        self.note_descendants(process)
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                # Not reaped yet, so its pid, and the group its workers share, are still its own.
                os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def stop_all(self) -> list[psutil.Process]:
        """Stop everything still running; returns what could not be made to go away."""
        for process in self.started:
            self.stop(process, timeout=5)
        for child in self.seen.values():
            try:
                child.kill()  # psutil checks pid and start time: a reused pid is never hit
            except psutil.Error:
                pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(alive(p) for p in self.seen.values()):
            time.sleep(POLL_S)
        leftovers = [p for p in self.seen.values() if alive(p)]
        leftovers += [p for p in psutil.Process().children(recursive=True) if alive(p)]
        return leftovers

    def request_stop(self, *_: object) -> None:
        self.stop_requested = True


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_until(processes: Processes, condition: Callable[[], object], timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        if processes.stop_requested:
            raise Interrupted("stopped by SIGTERM")
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(POLL_S)


def tree_description(tree: str) -> str:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", tree, *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "not a git checkout"
    dirty = " + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    return f"{tree} ({commit}{dirty})"


class Round:
    """One supervisor on one fresh ledger, one hold of the write lock."""

    def __init__(self, settings: Settings, processes: Processes, folder: str, number: int, hold_s: float):
        self.s = settings
        self.processes = processes
        self.hold_s = hold_s
        self.step_s = hold_s + STEP_MARGIN_S
        stem = os.path.join(folder, f"round-{number}")
        self.db, self.side_log, self.supervisor_log = stem + ".db", stem + ".side.log", stem + ".supervisor.log"
        self.long_ids = [f"step-{i}" for i in range(settings.workers - 1)]
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [settings.tree] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
        self.folder = folder
        self.supervisor: Optional[subprocess.Popen] = None

    def cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "supervisor.cli", "--db", self.db, *args]

    def admit(self) -> None:
        work = [(TICKER, "lockhold.ticker", {"every_s": self.s.tick_ms / 1000})]
        work += [(i, "lockhold.step", {"log": self.side_log, "seconds": self.step_s}) for i in self.long_ids]
        for execution_id, workflow, payload in work:
            done = subprocess.run(self.cli("start", workflow, "--id", execution_id, "--input", json.dumps(payload)),
                                  env=self.env, cwd=self.folder, capture_output=True, text=True, timeout=60)
            if done.returncode != 0:
                raise RuntimeError(f"yieldstar start {execution_id} failed: {done.stderr.strip()}")

    def start_supervisor(self) -> None:
        s = self.s
        argv = self.cli("supervise", APP, "--concurrency", str(s.workers), "--lease-ms", str(s.lease_ms),
                        "--renew-ms", str(max(1, s.lease_ms // 3)), "--heartbeat-ms", str(s.heartbeat_ms),
                        "--heartbeat-misses", str(s.misses), "--grace-ms", str(s.grace_ms))
        with open(os.open(self.supervisor_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
            self.supervisor = self.processes.popen(argv, env=self.env, cwd=self.folder, stdin=subprocess.DEVNULL,
                                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def ledger(self) -> sqlite3.Connection:
        # Read-only and in autocommit: a WAL reader never waits for, nor holds up, a writer.
        return sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, isolation_level=None, timeout=30)

    def side_effects(self) -> list[list[str]]:
        try:
            with open(self.side_log) as f:
                return [line.split() for line in f]
        except FileNotFoundError:
            return []

    def check_supervisor(self) -> None:
        if self.supervisor.poll() is not None:
            with open(self.supervisor_log, errors="replace") as f:
                tail = f.read()[-2000:]
            raise RuntimeError(f"the supervisor exited with code {self.supervisor.returncode}:\n{tail}")

    def ticks_acknowledged(self, db: sqlite3.Connection) -> int:
        return db.execute("SELECT count(*) FROM lease_history WHERE execution_id = ? AND ended_by = 'acknowledged'",
                          (TICKER,)).fetchone()[0]

    def all_mid_step(self, db: sqlite3.Connection) -> bool:
        self.check_supervisor()
        events = self.side_effects()
        begun = {e[1] for e in events if e[0] == "begin"}
        if any(e[0] == "end" for e in events):
            raise RuntimeError("a long step ended before the lock was taken: this machine is too slow for the"
                               f" {STEP_MARGIN_S:.0f} s margin")
        return begun == set(self.long_ids) and self.ticks_acknowledged(db) >= 2

    def completed(self, db: sqlite3.Connection) -> int:
        self.check_supervisor()
        marks = ",".join("?" * len(self.long_ids))
        return db.execute(f"SELECT count(*) FROM executions WHERE status = 'completed' AND execution_id IN ({marks})",
                          self.long_ids).fetchone()[0]

    def hold_lock(self) -> None:
        """Take the write lock as any other process could, keep it for the hold, roll back."""
        holder = sqlite3.connect(self.db, isolation_level=None, timeout=30)
        try:
            holder.execute("BEGIN IMMEDIATE")
            released_at = time.monotonic() + self.hold_s
            # The hold is the fault being measured, so it is timed, not polled for; a SIGTERM
            # still ends it early.
            while not self.processes.stop_requested and time.monotonic() < released_at:
                time.sleep(min(POLL_S, max(0.0, released_at - time.monotonic())))
            holder.execute("ROLLBACK")
        finally:
            holder.close()
        if self.processes.stop_requested:
            raise Interrupted("stopped by SIGTERM")

    def run(self) -> Result:
        self.admit()
        self.start_supervisor()
        try:
            return self.observe()
        finally:
            self.processes.stop(self.supervisor, timeout=self.s.grace_ms / 1000 + 10)

    def observe(self) -> Result:
        db = self.ledger()
        try:
            wait_until(self.processes, lambda: self.all_mid_step(db), 60, "every long step running")
            # Just after a tick's acknowledgement, the next tick comes due inside the hold.
            ticks = self.ticks_acknowledged(db)
            wait_until(self.processes, lambda: self.ticks_acknowledged(db) > ticks, 30, "a tick acknowledged")
            workers = self.processes.note_descendants(self.supervisor)
            self.hold_lock()
            # Superseded leases wait out the lease and a redelivery delay, then run their step again.
            deadline = self.s.lease_s + 2 + 2 * self.step_s + 30
            try:
                wait_until(self.processes, lambda: self.completed(db) == len(self.long_ids), deadline,
                           "every long step's execution completed")
            except TimeoutError:
                pass  # reported as unfinished
            replaced = sum(not alive(w) for w in workers)
            return self.count(db, replaced)
        finally:
            db.close()

    def count(self, db: sqlite3.Connection, replaced: int) -> Result:
        superseded = db.execute("SELECT count(*) FROM lease_history WHERE ended_by = 'superseded'").fetchone()[0]
        begins = Counter(e[1] for e in self.side_effects() if e[0] == "begin")
        repeated = sum(n - 1 for n in begins.values())
        waits, unfinished = [], 0
        for execution_id in self.long_ids:
            first_claim, done_at = db.execute(
                "SELECT min(claimed_at), max(CASE WHEN outcome = 'completed' THEN ended_at END)"
                " FROM lease_history WHERE execution_id = ?", (execution_id,)).fetchone()
            if done_at is None:
                unfinished += 1
            else:
                waits.append((done_at - first_claim) / 1000 - self.step_s)
        return Result(self.hold_s, superseded, repeated, max(waits, default=float("nan")), replaced, unfinished)


def print_table(settings: Settings, results: list[Result]) -> None:
    print(f"  {'hold s':>6}  {'x tolerance':>11}  {'x lease':>7}  {'superseded':>10}  {'per s held':>10}"
          f"  {'repeated steps':>14}  {'longest wait s':>14}  {'workers replaced':>16}")
    for r in results:
        note = f"  ({r.unfinished} of {settings.workers - 1} not completed in time)" if r.unfinished else ""
        print(f"  {r.hold_s:6.2f}  {r.hold_s / settings.tolerance_s:11.1f}  {r.hold_s / settings.lease_s:7.2f}"
              f"  {r.superseded:10d}  {r.superseded / r.hold_s:10.2f}  {r.repeated:14d}"
              f"  {r.longest_wait_s:14.1f}  {r.replaced:16d}{note}")
    for title, rows in (("holds shorter than the lease", [r for r in results if r.hold_s < settings.lease_s]),
                        ("all holds", results)):
        if rows:
            held = sum(r.hold_s for r in rows)
            superseded = sum(r.superseded for r in rows)
            print(f"  {title}: {superseded} superseded in {held:.1f} s of lock held = {superseded / held:.2f}"
                  f" per second; {sum(r.repeated for r in rows)} steps repeated")


def parse_holds(text: str) -> list[float]:
    try:
        holds = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--holds takes seconds separated by commas, not {text!r}") from None
    if not holds or any(not 0 < h < 15 for h in holds):
        raise argparse.ArgumentTypeError("every hold must be above 0 and below the ledger's 15 s busy timeout")
    return holds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", default=os.path.dirname(HERE),
                        help="the source tree whose supervisor runs (default: this repository)")
    parser.add_argument("--workers", type=int, default=6, help="workers (one serves the timer workflow)")
    parser.add_argument("--lease-ms", type=int, default=6000)
    parser.add_argument("--heartbeat-ms", type=int, default=200)
    parser.add_argument("--heartbeat-misses", type=int, default=3)
    parser.add_argument("--tick-ms", type=int, default=100, help="the timer workflow's interval")
    parser.add_argument("--holds", type=parse_holds, default=None,
                        help="seconds, comma-separated (default: from the heartbeat tolerance and the lease)")
    parser.add_argument("--keep", action="store_true", help="keep the ledgers and logs, and say where")
    args = parser.parse_args()
    if args.workers < 2:
        parser.error("--workers must be at least 2: one for the timer workflow, the rest for long steps")
    tree = os.path.abspath(args.tree)
    if not os.path.exists(os.path.join(tree, "supervisor", "dispatcher.py")):
        parser.error(f"--tree {tree} has no supervisor/dispatcher.py: it is not a Yieldstar source tree")
    settings = Settings(tree, args.workers, args.lease_ms, args.heartbeat_ms, args.heartbeat_misses, args.tick_ms)
    holds = args.holds or settings.default_holds()

    processes = Processes()
    signal.signal(signal.SIGTERM, processes.request_stop)
    folder = tempfile.mkdtemp(prefix="yieldstar-lock-hold-")
    started = time.monotonic()
    results: list[Result] = []
    failed: Optional[str] = None
    try:
        print(f"yieldstar lock-hold benchmark: {tree_description(tree)}; python {sys.version.split()[0]},"
              f" sqlite {sqlite3.sqlite_version}")
        print(f"supervisor: {settings.workers} workers ({settings.workers - 1} long steps of the hold + "
              f"{STEP_MARGIN_S:.0f} s, 1 timer every {settings.tick_ms} ms), lease {settings.lease_ms} ms renewed"
              f" every {settings.lease_ms // 3} ms, heartbeat {settings.heartbeat_ms} ms x {settings.misses}"
              f" misses = {settings.tolerance_s:.1f} s tolerance")
        raw_before = raw_commit_rate(os.path.join(folder, "raw.db"))
        print(f"raw SQLite single-row commits on the same file system: {raw_before:,.0f} /s (WAL, synchronous=NORMAL)")
        for number, hold_s in enumerate(holds):
            results.append(Round(settings, processes, folder, number, hold_s).run())
        raw_after = raw_commit_rate(os.path.join(folder, "raw.db"))
        print(f"raw SQLite single-row commits after the rounds: {raw_after:,.0f} /s")
        print_table(settings, results)
    except KeyboardInterrupt:
        failed = "interrupted"
    except (Interrupted, TimeoutError, RuntimeError, OSError, sqlite3.Error) as exc:
        failed = f"{type(exc).__name__}: {exc}"
    finally:
        leftovers = processes.stop_all()
    if failed:
        if results:
            print_table(settings, results)
        print(f"failed: {failed}", file=sys.stderr)
    print(f"{len(processes.started)} supervisors started, {len(processes.seen)} workers seen; processes left"
          f" behind: {len(leftovers)}; {time.monotonic() - started:.0f} s")
    if args.keep or failed:
        print(f"ledgers and logs kept in {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    if leftovers:
        print("left behind: " + ", ".join(f"pid {p.pid}" for p in leftovers), file=sys.stderr)
    return 1 if failed or leftovers or any(r.unfinished for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
