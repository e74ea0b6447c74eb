"""Host faults on the supervisor's side: a full disk, a held write lock, a start-up storm, a lost
lease mid-step, and shutdown while the database is busy (issue findings 3, 4, 5, 6 and 10).

Real supervisors (`yieldstar supervise` subprocesses), real signals, a real SQLite file; the
full-disk test fills a small tmpfs of its own for real (root only).
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from supervisor import open_backend
from supervisor.dispatcher import SupervisorConfig
from supervisor.pool import MAX_CONCURRENCY

from faults import (LEASE_MS, admit, cli, damage_table, fill_disk, freeze, gone, read_log, thaw, tmpfs, wait_gone,
                    wait_until)
from test_supervisor_faults import hold_input, outcomes, status, waiting

pytestmark = pytest.mark.usefixtures("dump_on_hang")


@contextmanager
def write_lock_held(db: Path):
    """Another process's view of the ledger: its write lock, held until the block ends."""
    conn = sqlite3.connect(str(db), timeout=30, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def superseded(ledger) -> list:
    return [r for e in ledger.executions.list() for r in ledger.executions.history(e.execution_id)
            if r.ended_by == "superseded"]


# -- finding 3 ------------------------------------------------------------------------------

class DiskFullBursts:
    """Fills a tmpfs to the last byte for `burst_s`, frees it, and again every `every_s`."""

    def __init__(self, folder: Path, burst_s: float = 0.03, every_s: float = 0.1):
        self.folder, self.burst_s, self.every_s = folder, burst_s, every_s
        self.bursts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        filler = self.folder / "filler"
        while not self._stop.wait(self.every_s):
            fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            fill_disk(fd)
            self.bursts += 1
            self._stop.wait(self.burst_s)
            os.close(fd)
            os.unlink(filler)


@pytest.fixture
def small_disk(tmp_path):
    with tmpfs(tmp_path / "disk", "16m") as folder:
        yield folder


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_finding_3_the_supervisor_survives_a_disk_that_keeps_filling_up(small_disk, tmp_path, supervisors):
    db = small_disk / "ledger.db"
    ids = [f"order-{i}" for i in range(60)]
    # A delivery that meets a full disk ends as a retry, and each retry in a row doubles the
    # execution's redelivery delay (1 s, 2 s, 4 s...): a delivery must be likely to fit between
    # two bursts, or an unlucky execution waits out the test. Deliveries of about 20 ms, and a
    # burst of 30 ms every 300 ms, miss about one time in six: seven misses in a row (127 s of
    # delays) come to about one execution in 280,000, one run of this test's 60 in 4,700.
    work = {"steps": 3, "sleep": 0.005, "log": str(tmp_path / "effects.log")}
    for execution_id in ids:
        admit(db, execution_id, "sv.steps", work)
    supervisor = supervisors.start(db, concurrency=2, lease_ms=3000, renew_ms=1000)
    with open_backend(db) as ledger:
        with DiskFullBursts(small_disk, every_s=0.3) as disk:
            wait_until(lambda: disk.bursts >= 20 and all(status(ledger, e) == "completed" for e in ids),
                       timeout=90, message="every execution to complete between the disk-full bursts")
            assert supervisor.popen.poll() is None, supervisor.log()
        records = [ledger.executions.get(e) for e in ids]
    log = supervisor.log()
    assert "disk is full" in log, "no write met a full disk: the test proved nothing"
    assert [r.status for r in records] == ["completed"] * len(ids)
    assert supervisor.popen.poll() is None, "the supervisor exited on a full disk"
    assert "Traceback" not in log


# -- finding 4 ------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(90)
def test_finding_4_a_write_lock_held_past_the_heartbeat_tolerance_makes_no_worker_give_up(
        sqlite_path, sqlite_ledger, tmp_path, supervisors):
    # Heartbeat tolerance 3 x 200 ms; the lock is held 3 s, well inside the 8 s lease. One
    # delivery finishes while the lock is held, so its acknowledgement waits for the lock.
    long = hold_input(tmp_path, hold_tokens=None)
    finisher = {**hold_input(tmp_path, hold_tokens=[1]), "gate": str(tmp_path / "finish"),
                "log": str(tmp_path / "finisher.log")}
    for execution_id in ("long-1", "long-2"):
        admit(sqlite_path, execution_id, "sv.hold", long)
    admit(sqlite_path, "finisher", "sv.finish_late", finisher)
    supervisor = supervisors.start(sqlite_path, concurrency=3, lease_ms=8000, renew_ms=2000)
    wait_until(lambda: len({e.execution_id for e in read_log(long["log"]) if e.event == "waiting"}) == 2)
    wait_until(lambda: any(e.event == "waiting" for e in read_log(finisher["log"])))
    workers = supervisor.workers()

    with write_lock_held(sqlite_path):
        Path(finisher["gate"]).touch()  # its acknowledgement now queues behind the lock
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:  # the fault lasts 3 s; meanwhile nobody may give up
            assert all(not gone(pid) for pid in workers), supervisor.log()
            time.sleep(0.05)

    Path(long["gate"]).touch()
    for execution_id in ("long-1", "long-2", "finisher"):
        wait_until(lambda: status(sqlite_ledger, execution_id) == "completed", timeout=30)
        assert outcomes(sqlite_ledger, execution_id) == [(1, "acknowledged", "completed")]
    assert superseded(sqlite_ledger) == []
    assert [e.token for e in read_log(long["log"]) if e.event == "waiting"] == [1, 1]  # no step ran twice
    assert "lost its supervisor" not in supervisor.log()
    assert supervisor.workers() == workers


# -- finding 5 ------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(90)
def test_finding_5_workers_of_a_slow_starting_pool_are_beaten_from_the_moment_each_is_ready(
        sqlite_path, sqlite_ledger, tmp_path, supervisors):
    # The n-th worker takes n x 1 s to load the app: the first is ready 3 s before the last,
    # five times its heartbeat tolerance. The lease (30 s) is far longer than the test may take.
    ids = [f"early-{i}" for i in range(8)]
    for execution_id in ids:
        admit(sqlite_path, execution_id, "sv.noop3")
    env = {"SV_IMPORT_STAGGER_S": "1.0", "SV_IMPORT_COUNTER": str(tmp_path / "imports")}
    started = time.monotonic()
    supervisor = supervisors.start(sqlite_path, concurrency=4, lease_ms=30_000, renew_ms=10_000, env=env)
    wait_until(lambda: all(status(sqlite_ledger, e) == "completed" for e in ids), timeout=20,
               message="every execution to complete without waiting out a lease")
    assert time.monotonic() - started < 20
    for execution_id in ids:
        assert outcomes(sqlite_ledger, execution_id) == [(1, "acknowledged", "completed")]
    assert "lost its supervisor" not in supervisor.log()
    assert "mid-delivery" not in supervisor.log()


@pytest.mark.timeout(60)
def test_finding_5_a_lease_handed_to_a_dead_worker_is_released_at_once(sqlite_path, sqlite_ledger):
    """The loop's claim step, driven by hand: the only idle worker died (its pipe is closed) just
    before a claim's reply came back. Its lease is released at once, not left to run out."""
    from multiprocessing.connection import Connection

    from faults import APP
    from supervisor.dispatcher import Stats
    from supervisor.ledger_calls import Claim, LedgerCalls, Reply, Wakeup
    from supervisor.loop import DispatchLoop
    from supervisor.pool import Child, ChildProcess, Pool

    admit(sqlite_path, "orphaned", "sv.noop3")
    dead = subprocess.Popen(["true"])
    dead.wait()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    theirs.close()
    pool = Pool(1, app=APP, db_path=str(sqlite_path), durability="normal", heartbeat_s=0.2, misses=3)
    pool.children.append(Child(ChildProcess(dead), Connection(ours.detach()), dead.pid, ready=True))
    calls = LedgerCalls(open_backend(sqlite_path), "test-calls")
    renewals = LedgerCalls(open_backend(sqlite_path), "test-renewals")
    config = SupervisorConfig(concurrency=1, lease_ms=30_000)
    loop = DispatchLoop(config, Stats(), pool, calls, renewals, signals=Wakeup(), stop_requests=lambda: 0)
    try:
        (claimed,) = sqlite_ledger.executions.claim_deliveries(limit=1, duration=config.lease_ms)
        loop.claiming, loop.promised = 1, 1  # as `claim` leaves them: one claim in flight, for one worker
        claim = Claim(1, config.lease_ms, about=time.monotonic())
        loop.on_claimed(Reply(claim, [claimed]), time.monotonic())
        assert (loop.claiming, loop.promised) == (0, 0)
        assert dead.pid not in [c.pid for c in pool.children]  # replaced by a fresh worker

        def released():
            loop.take_replies(time.monotonic())
            return [h.ended_by for h in sqlite_ledger.executions.history("orphaned")] == ["released"]

        wait_until(released, timeout=10, message="the lease to be released")
        record = sqlite_ledger.executions.get("orphaned")
        assert (record.status, record.unacknowledged_deliveries) == ("admitted", 1)
    finally:
        pool.shutdown(kill=True)
        calls.close()
        renewals.close()


@pytest.mark.timeout(60)
def test_finding_5_a_stop_signal_is_honoured_while_the_pool_is_still_starting(sqlite_path, supervisors):
    supervisor = supervisors.start(sqlite_path, concurrency=4, env={"SV_IMPORT_DELAY_S": "20"}, ready=False)
    # The template process that forks the workers is importing the app (or, without one, the 4 workers are).
    workers = wait_until(supervisor.loading, message="the app being loaded")
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=5) == 0, supervisor.log()
    wait_gone(workers, timeout=5)


@pytest.mark.timeout(30)
def test_finding_5_a_concurrency_past_the_bound_is_refused_with_a_clear_error(sqlite_path):
    result = cli(sqlite_path, "supervise", "tests/apps/supervised_app.py", "--concurrency", "100000")
    assert result.returncode == 2
    assert f"at most {MAX_CONCURRENCY}" in result.stderr and "Traceback" not in result.stderr
    with pytest.raises(ValueError, match=f"concurrency must be at most {MAX_CONCURRENCY}"):
        SupervisorConfig(concurrency=MAX_CONCURRENCY + 1)


# -- finding 6 ------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(90)
def test_finding_6_a_lost_lease_frees_its_worker_at_once(sqlite_path, sqlite_ledger, tmp_path, supervisors):
    # The first supervisor's workers tolerate 50 missed heartbeats, so that the worker is still
    # mid-step when its supervisor, frozen past the lease, wakes up to find the lease taken over.
    options = hold_input(tmp_path, hold_tokens=[1])
    admit(sqlite_path, "taken", "sv.hold", options)
    first = supervisors.start(sqlite_path, concurrency=1, extra=("--heartbeat-misses", "50"))
    stale = wait_until(lambda: waiting(options["log"], 1)).pid
    freeze(first.pid)  # the supervisor alone: its worker runs on in its step
    second = supervisors.start(sqlite_path, concurrency=1)
    wait_until(lambda: status(sqlite_ledger, "taken") == "completed", timeout=30, message="the takeover")
    thaw(first.pid)
    # Awake, it finds that no renewal has confirmed the lease for a whole lease length (or its
    # next renewal finds the lease lost): the worker is killed, not left to run its step out (the
    # gate never opens for token 1: left alone it would wait 60 s).
    wait_gone([stale], timeout=5)
    wait_until(lambda: any(f"token 1: {why}" in first.log() for why in (
        "the lease is lost; killing worker pid", f"no renewal has confirmed its lease for {LEASE_MS} ms")),
        message=f"the supervisor to say why it killed worker {stale}")
    assert f"killing worker pid {stale}" in first.log()
    assert first.popen.poll() is None and second.popen.poll() is None
    assert outcomes(sqlite_ledger, "taken") == [(1, "superseded", None), (2, "acknowledged", "completed")]
    first.wait_ready()  # and it was replaced


# -- finding 10 -----------------------------------------------------------------------------

def test_finding_10_a_config_with_only_a_short_lease_derives_its_renewal_and_heartbeat():
    config = SupervisorConfig(lease_ms=3000)
    assert (config.renew_ms, config.heartbeat_ms) == (1000, 300)
    assert SupervisorConfig().renew_ms == 10_000 and SupervisorConfig().heartbeat_ms == 1000
    with pytest.raises(ValueError, match="renew_ms"):
        SupervisorConfig(lease_ms=3000, renew_ms=3000)
    with pytest.raises(ValueError, match="listen must be a bool"):
        SupervisorConfig(listen="no")


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_finding_10_a_second_stop_signal_while_the_database_is_busy_exits_cleanly(sqlite_path, tmp_path, supervisors):
    finisher = hold_input(tmp_path, hold_tokens=[1])
    admit(sqlite_path, "finisher", "sv.finish_late", finisher)
    supervisor = supervisors.start(sqlite_path, concurrency=1, lease_ms=8000, renew_ms=2000)
    wait_until(lambda: any(e.event == "waiting" for e in read_log(finisher["log"])))
    with write_lock_held(sqlite_path):
        Path(finisher["gate"]).touch()
        wait_until(lambda: any(e.event == "finishing" for e in read_log(finisher["log"])))
        supervisor.signal(signal.SIGTERM)
        supervisor.wait_log("stopping: no new claims")
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(timeout=10) == 1, supervisor.log()
    assert "Traceback" not in supervisor.log() and "Error" not in supervisor.log()


# -- a file that can no longer be used -------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_corrupt_page_stops_the_supervisor_with_a_message_instead_of_retrying_forever(sqlite_path, tmp_path,
                                                                                        supervisors):
    # The execution records a step, then waits on a timer; while it waits, the steps table's page
    # is damaged. Its next delivery cannot read its steps: that is corruption, not a busy database.
    admit(sqlite_path, "damaged", "sv.nap", {"seconds": 2, "log": str(tmp_path / "effects.log")})
    first = supervisors.start(sqlite_path, concurrency=1)
    first.wait_log("delivery execution=damaged token=1 outcome=suspended")
    first.signal(signal.SIGTERM)
    assert first.wait() == 0
    damage_table(sqlite_path, "steps")
    second = supervisors.start(sqlite_path, concurrency=1)
    assert second.wait(timeout=30) == 5, second.log()
    log = second.log()
    assert "malformed" in log and str(sqlite_path) in log and "integrity_check" in log
    assert log.count("delivery execution=damaged") <= 1  # not released and retried on and on
    assert "Traceback" not in log


@pytest.mark.timeout(60)
def test_a_ledger_deleted_under_a_running_supervisor_stops_it_with_exit_code_5(sqlite_path, supervisors):
    admit(sqlite_path, "first", "sv.noop3")
    supervisor = supervisors.start(sqlite_path, concurrency=1)
    supervisor.wait_log("delivery execution=first token=1 outcome=completed")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{sqlite_path}{suffix}").unlink(missing_ok=True)
    assert supervisor.wait(timeout=10) == 5, supervisor.log()
    assert f"the ledger {sqlite_path} was deleted or replaced" in supervisor.log()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_wal_and_shm_deleted_during_a_delivery_stop_the_supervisor_within_3_s_after_killing_its_workers(
        sqlite_path, tmp_path, supervisors):
    # Without the check, the supervisor and its worker went on committing into the unlinked -wal,
    # and a second supervisor, which saw none of it, ran the held step again under the same token.
    held = hold_input(tmp_path, hold_tokens=None)
    admit(sqlite_path, "held", "sv.hold", held)
    supervisor = supervisors.start(sqlite_path, concurrency=2)
    wait_until(lambda: waiting(held["log"], 1), message="the held step to start")
    supervisor.wait_log("is ready", count=2)  # both have the files open (one opened later would make new ones)
    workers = supervisor.workers()
    for suffix in ("-wal", "-shm"):
        Path(f"{sqlite_path}{suffix}").unlink()

    assert supervisor.wait(3.0) == 5, supervisor.log()  # TimeoutExpired if it still runs
    assert [pid for pid in workers if not gone(pid)] == [], "its workers outlived it"
    log = supervisor.log()
    assert f"its -wal file {sqlite_path}-wal was deleted" in log, log
    assert "since its last checkpoint is gone" in log and "Stop every process using the ledger" in log
    assert "Traceback" not in log


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("suffix", ["-wal", "-shm"])
def test_a_wal_or_shm_deleted_under_an_idle_supervisor_stops_it_within_3_s(sqlite_path, supervisors, suffix):
    admit(sqlite_path, "first", "sv.noop3")
    supervisor = supervisors.start(sqlite_path, concurrency=1)
    supervisor.wait_log("delivery execution=first token=1 outcome=completed")
    workers = supervisor.workers()
    Path(f"{sqlite_path}{suffix}").unlink()

    assert supervisor.wait(3.0) == 5, supervisor.log()  # TimeoutExpired if it still runs
    assert [pid for pid in workers if not gone(pid)] == [], "its workers outlived it"
    assert f"its {suffix} file {sqlite_path}{suffix} was deleted" in supervisor.log(), supervisor.log()


@pytest.mark.timeout(60)
def test_a_worker_that_finds_the_ledger_unsafe_stops_the_supervisor_instead_of_passing_for_a_broken_app(
        sqlite_path, supervisors):
    # Someone opens the file to everyone while a supervisor runs; the next worker it starts
    # refuses the file, and the supervisor stops with it rather than with "cannot load the app".
    supervisor = supervisors.start(sqlite_path, concurrency=1)
    (worker,) = supervisor.workers()
    os.chmod(sqlite_path, 0o666)
    os.kill(worker, signal.SIGKILL)
    assert supervisor.wait(timeout=20) == 5, supervisor.log()
    log = supervisor.log()
    assert "could not load the app" not in log and "chmod" in log, log


@pytest.mark.timeout(60)
def test_a_frozen_idle_worker_is_replaced_before_its_unread_pipe_can_block_the_supervisor(
        sqlite_path, sqlite_ledger, supervisors):
    # Nobody reads a frozen worker's end of the pipe: beaten on for minutes, its buffer fills and
    # the supervisor's next send would block its loop for good. It is replaced once silent.
    supervisor = supervisors.start(sqlite_path, concurrency=2)
    frozen, _ = supervisor.workers()
    supervisor.wait_log(f"worker {frozen} is ready")
    freeze(frozen)
    supervisor.wait_log(f"idle worker pid {frozen} silent for")
    wait_gone([frozen])
    admit(sqlite_path, "after", "sv.noop3")
    wait_until(lambda: status(sqlite_ledger, "after") == "completed", timeout=15)
    wait_until(lambda: len(supervisor.workers()) == 2, message="the replacement")
