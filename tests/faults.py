"""Fault injectors and process helpers for the supervisor's multi-process tests.

Everything here works on real processes with real signals:

- `wait_until(condition, timeout, interval)`: poll a condition against a deadline (never a
  fixed sleep);
- fault injectors: `sigkill(pid)`, `freeze(pid)` / `thaw(pid)` (SIGSTOP/SIGCONT), the same for
  a whole process group, and `gone(pid)` / `wait_gone(pids)` to prove that processes are dead;
- fixtures (registered for the whole suite by tests/conftest.py, never imported by name):
  `supervisors` starts `yieldstar supervise` subprocesses, each in its own session (so a test
  can signal it together with its children), logging stderr to a file under `tmp_path`, and
  kills whatever is left of every one of them when the test ends; `dump_on_hang` dumps every
  thread's traceback before pytest-timeout would kill a hung test; `sqlite_ledger` and
  `each_ledger` are the test's own view of the ledger (at `sqlite_path`, or `each_backend`);
- `cli(db, *args)`: one `yieldstar` command as a subprocess;
- readers of the outcome: the side-effect log of `tests/apps/supervised_app.py`, the lease
  history, and the fencing token each step record was accepted under.
"""

from __future__ import annotations

import errno
import faulthandler
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import psutil
import pytest

from supervisor import open_backend
from supervisor.pool import BOOT, is_worker_command

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
APP = str(TESTS / "apps" / "supervised_app.py")

# Short but not twitchy: a loaded 2-core machine must not make a healthy child look frozen
# (it is judged silent after 3 heartbeats) or let a renewed lease run out.
LEASE_MS = 1500
RENEW_MS = 300
HEARTBEAT_MS = 200
POLL_MS = 100


# -- waiting ------------------------------------------------------------------------------------

def needs(why: Optional[str], what: str) -> None:
    """Skip the calling test, saying `why`, when something it needs is missing (`why` is None when
    nothing is); under CI=true, where every test must run, fail it instead."""
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the {what}, but {why}")
        pytest.skip(f"{what} skipped: {why}")


def wait_until(condition: Callable[[], Any], timeout: float = 15.0, interval: float = 0.02,
               message: Optional[str] = None) -> Any:
    """Poll `condition()` until it returns something truthy, and return that; fail the test
    with `message` if `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {message or condition}")
        time.sleep(interval)


@pytest.fixture
def dump_on_hang(request):
    """Dump every thread's traceback shortly before pytest-timeout would kill a hung test."""
    marker = request.node.get_closest_marker("timeout")
    seconds = float(marker.args[0]) if marker and marker.args else 120.0
    faulthandler.dump_traceback_later(max(1.0, seconds - 5), exit=False)
    yield
    faulthandler.cancel_dump_traceback_later()


# -- fault injectors ----------------------------------------------------------------------------

def sigkill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def freeze(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)


def thaw(pid: int) -> None:
    os.kill(pid, signal.SIGCONT)


def freeze_group(pgid: int) -> None:
    os.killpg(pgid, signal.SIGSTOP)


def thaw_group(pgid: int) -> None:
    os.killpg(pgid, signal.SIGCONT)


def gone(pid: int) -> bool:
    """True once `pid` runs no more (a zombie waiting to be reaped runs no more either)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pids: Iterable[int], timeout: float = 10.0) -> None:
    pids = list(pids)
    wait_until(lambda: all(gone(p) for p in pids), timeout, message=f"processes {pids} to be gone")


def process_tree(pid: int) -> list[psutil.Process]:
    """Every live descendant of `pid` (empty when `pid` itself is gone)."""
    try:
        return [p for p in psutil.Process(pid).children(recursive=True) if not gone(p.pid)]
    except psutil.NoSuchProcess:
        return []


def is_worker(process: psutil.Process) -> bool:
    """A pool child, as opposed to any helper process (or a multiprocessing child)."""
    try:
        command = process.cmdline()
        return is_worker_command(command) or "spawn_main" in " ".join(command)
    except psutil.Error:
        return False


# -- supervisor processes -----------------------------------------------------------------------

@dataclass
class SupervisorProcess:
    popen: subprocess.Popen
    log_path: Path
    concurrency: int  # its worker processes (`--workers`, else `--concurrency`)
    seen_pids: set[int] = field(default_factory=set)  # every descendant ever observed

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def pgid(self) -> int:
        return self.popen.pid  # a session leader leads its own process group

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_log(self, text: str, timeout: float = 15.0, count: int = 1) -> str:
        return wait_until(lambda: self.log() if self.log().count(text) >= count else None, timeout,
                          message=f"{text!r} in the log of supervisor {self.pid}:\n{self.log()}")

    def tree(self) -> list[psutil.Process]:
        found = process_tree(self.pid)
        self.seen_pids.update(p.pid for p in found)
        return found

    def workers(self) -> list[int]:
        return sorted(p.pid for p in self.tree() if is_worker(p))

    def loading(self) -> list[int]:
        """Its processes that run yieldstar's worker runtime: the workers, and the template
        process that imports the app once and forks them."""
        found = []
        for process in self.tree():
            try:
                if BOOT in process.cmdline()[1:2]:
                    found.append(process.pid)
            except psutil.Error:
                continue
        return found

    def wait_ready(self, timeout: float = 30.0) -> list[int]:
        """Wait until the supervisor logged its start and all its children are up."""
        self.wait_log("supervising", timeout)
        return wait_until(lambda: (w := self.workers()) and len(w) == self.concurrency and w, timeout,
                          message=f"{self.concurrency} workers of supervisor {self.pid}")

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def signal_group(self, sig: int) -> None:
        os.killpg(self.pgid, sig)

    def wait(self, timeout: float = 30.0) -> int:
        return self.popen.wait(timeout)

    def kill_everything(self) -> None:
        """SIGKILL the supervisor's whole process group (stopped members die too) and reap it."""
        self.tree()
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
            pass
        for pid in self.seen_pids:  # anything that left the group
            if not gone(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


class Supervisors:
    """Starts `yieldstar supervise` subprocesses for one test and cleans all of them up."""

    def __init__(self, tmp_path: Path):
        self._tmp = tmp_path
        self.started: list[SupervisorProcess] = []

    def start(self, db, *, app: str = APP, concurrency: int = 2, lease_ms: int = LEASE_MS,
              renew_ms: int = RENEW_MS, heartbeat_ms: int = HEARTBEAT_MS, poll_ms: int = POLL_MS,
              grace_ms: Optional[int] = None, until_idle: bool = False, extra: Iterable[str] = (),
              ready: bool = True, umask: int = -1, env: Optional[dict] = None,
              workers: Optional[int] = None) -> SupervisorProcess:
        """`workers`: `--workers` (worker processes of several deliveries each); None: one
        process per delivery."""
        args = [sys.executable, "-m", "supervisor.cli", "--db", str(db), "supervise", app,
                "--concurrency", str(concurrency), "--lease-ms", str(lease_ms), "--renew-ms", str(renew_ms),
                "--heartbeat-ms", str(heartbeat_ms), "--poll-ms", str(poll_ms)]
        if workers is not None:
            args += ["--workers", str(workers)]
        if grace_ms is not None:
            args += ["--grace-ms", str(grace_ms)]
        if until_idle:
            args.append("--until-idle")
        args += list(extra)
        log_path = self._tmp / f"supervisor-{len(self.started) + 1}.log"
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     cwd=self._tmp, start_new_session=True, umask=umask,
                                     env=None if env is None else {**os.environ, **env})
        process = SupervisorProcess(popen, log_path, concurrency if workers is None else workers)
        self.started.append(process)
        if ready:
            process.wait_ready()
        return process

    def cleanup(self) -> None:
        for process in self.started:
            process.kill_everything()
        pids = [pid for process in self.started for pid in process.seen_pids | {process.pid}]
        wait_gone(pids, timeout=10)  # SIGKILL is delivered asynchronously

    def print_logs(self) -> None:
        for process in self.started:
            print(f"---- supervisor pid {process.pid} (exit {process.popen.returncode}) ----")
            print(process.log())


@pytest.fixture
def supervisors(tmp_path):
    started = Supervisors(tmp_path)
    try:
        yield started
    finally:
        started.print_logs()  # shown by pytest only when the test failed
        started.cleanup()


def cli(db, *args: str, timeout: float = 30.0, umask: int = -1) -> subprocess.CompletedProcess:
    """Run one `yieldstar --db DB ...` command and return its exit code, stdout and stderr."""
    return subprocess.run([sys.executable, "-m", "supervisor.cli", "--db", str(db), *args], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL, umask=umask)


# -- reading the outcome ------------------------------------------------------------------------

@dataclass(frozen=True)
class Event:
    """One line of the side-effect log of `tests/apps/supervised_app.py`."""

    event: str
    execution_id: str
    token: int
    pid: int
    step_key: str
    time_ns: int


def read_log(path) -> list[Event]:
    if not os.path.exists(path):
        return []
    events = []
    with open(path) as f:
        for line in f:
            if line.endswith("\n"):  # a line being written is complete only with its newline
                event, execution_id, token, pid, key, at = line.split()
                events.append(Event(event, execution_id, int(token), int(pid), key, int(at)))
    return events


def query(db, sql: str, *params) -> list[tuple]:
    """Rows of a read-only query, on a connection of its own to the ledger: a SQLite file's, or a
    PostgreSQL database's. `sql` is a template as the ledger's tables write theirs
    (`supervisor.ledger.dialect`: `$p` parameters, `$row_order`), rendered as the backend does."""
    if isinstance(db, str) and db.startswith("postgresql://"):
        import psycopg

        from supervisor.ledger.postgres.dialect import DIALECT

        with psycopg.connect(db) as conn:
            return conn.execute(DIALECT.statements[sql], params or None).fetchall()
    from supervisor.ledger.sqlite.dialect import DIALECT

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=15)
    try:
        return conn.execute(DIALECT.statements[sql], params).fetchall()
    finally:
        conn.close()


def step_tokens(db, execution_id: str) -> list[tuple[str, int, int]]:
    """`(step_key, attempt, token)` of each recorded step, in the order written: the token is
    the fencing token the write was accepted under (read-only, beside the ledger API)."""
    return [tuple(row) for row in query(
        db, "SELECT step_key, attempt, token FROM steps WHERE execution_id = $p ORDER BY $row_order", execution_id)]


def last_write_at(db, execution_id: str, token: int) -> Optional[int]:
    """When the last step record accepted under `token` was written (the writer's clock, ms)."""
    return query(db, "SELECT max(written_at) FROM steps WHERE execution_id = $p AND token = $p",
                 execution_id, token)[0][0]


def admit(db, execution_id: str, workflow: str, input: Any = None) -> None:
    with open_backend(db) as backend:
        backend.executions.admit(execution_id, workflow, json.dumps(input))


def no_two_live_leases(history) -> None:
    """Tokens strictly increase, and each claim starts no earlier than the previous lease ended."""
    tokens = [h.token for h in history]
    assert tokens == sorted(set(tokens)), tokens
    for before, after in zip(history, history[1:]):
        assert before.ended_at is not None, before
        assert after.claimed_at >= before.ended_at, (before, after)


def max_overlap(intervals: Iterable[tuple[int, int]]) -> int:
    """The most half-open intervals `[start, end)` that overlap at any instant."""
    points = []
    for start, end in intervals:
        points.append((start, 1))
        points.append((end, -1))
    live = most = 0
    for _, delta in sorted(points):  # at equal times an end (-1) sorts before a start
        live += delta
        most = max(most, live)
    return most


def run_until_idle(db, app: str, config, *, timeout: float = 50.0, **options) -> None:
    """Run a supervisor (`supervisor.dispatcher.Supervisor(db, app, config, **options)`) in a
    thread of this process until it is idle, and check that it exited 0 within `timeout` s."""
    from supervisor.dispatcher import Supervisor

    supervisor = Supervisor(str(db), app, config, **options)
    exit_code = []
    thread = threading.Thread(target=lambda: exit_code.append(supervisor.run(until_idle=True)), daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the supervisor did not become idle"
    assert exit_code == [0]


# -- the test's own view of the ledger ----------------------------------------------------------

@pytest.fixture
def sqlite_ledger(sqlite_path):
    """The test's own view of a SQLite ledger at `sqlite_path` (one connection, kept open while the
    test polls it)."""
    with open_backend(sqlite_path) as backend:
        yield backend


@pytest.fixture
def each_ledger(each_backend):
    """The test's own view of the ledger at `each_backend`, on each backend in turn."""
    with open_backend(each_backend) as backend:
        yield backend


def damage_table(db, table: str) -> None:
    """Overwrite the first page of `table` (its root: for a small table, all of its rows) with
    garbage, in the file itself, as a failing disk would. Close every connection first, so the
    WAL is checkpointed into the file."""
    conn = sqlite3.connect(str(db))
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = ?",
                               (table,)).fetchone()
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    finally:
        conn.close()
    with open(db, "r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\xa5" * page_size)


# -- a disk that fills up -----------------------------------------------------------------------

@contextmanager
def tmpfs(folder: Path, size: str):
    """A tmpfs of `size` (`1m`, `16m`) mounted on `folder` for the block; root only (the test is
    skipped otherwise; CI runs as root). The unmount is strict: a file the code under test left
    open there fails the test."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs to fill needs root")
    folder.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    except BaseException:
        subprocess.run(["umount", "-l", str(folder)], check=False)
        raise
    # A process killed at the end of the test (a worker SIGKILLed with its supervisor's group)
    # closes its files as it exits, which may take a moment after the kill: only a file still
    # open seconds later was left open.
    last = None

    def unmounted() -> bool:
        nonlocal last
        last = subprocess.run(["umount", str(folder)], capture_output=True, text=True)
        return last.returncode == 0

    try:
        wait_until(unmounted, timeout=5.0, interval=0.05)
    except AssertionError:
        subprocess.run(["umount", "-l", str(folder)], check=False)
        raise AssertionError(f"{folder} was still in use 5 s after the end of the test: {last.stderr.strip()}") from None


def fill_disk(fd: int) -> None:
    """Write zeros to `fd` until not one more byte fits on its file system."""
    for chunk in (1 << 16, 1 << 12, 1):
        try:
            while True:
                os.write(fd, b"\0" * chunk)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
