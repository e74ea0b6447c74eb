"""`yieldstar top`: its screen, its snapshot on a pipe, and the real thing in a pseudo-terminal
(tmux) beside a running supervisor, quit with `q` and with Ctrl-C."""

from __future__ import annotations

import io
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from faults import ROOT, cli, wait_until
from rich.console import Console

from supervisor import ExecutionRecord, open_backend
from supervisor.ledger.errors import StorageBusy
from supervisor.top import deliveries_per_second, render, run
from supervisor.ledger.values import LedgerStats, LiveLease

NOW = 1_796_240_403_000


def reading(now: int = NOW, deliveries: int = 40) -> LedgerStats:
    flaky = ExecutionRecord("mail-7", "mail", "null", "admitted", 6, NOW, None, 6, None, None, NOW - 60_000, NOW)
    lease = LiveLease("order-42", "order", 3, "host-a:4211", now - 12_000, now + 18_000, 4)
    return LedgerStats(now=now, by_status={"admitted": 1, "running": 1, "suspended": 0, "completed": 40, "failed": 2,
                                           "cancelled": 0},
                       by_workflow={"order": {"running": 1, "completed": 40}}, oldest_due=flaky,
                       unacknowledged=[flaky], live_leases=[lease], deliveries=deliveries)


def as_text(renderable) -> str:
    console = Console(file=io.StringIO(), width=160, force_terminal=False, no_color=True)
    console.print(renderable)
    return console.file.getvalue()


def test_the_screen_shows_counts_rate_leases_and_failing_executions():
    text = as_text(render(reading(NOW + 2000, deliveries=50), reading(), title="ledger.db", live=True))
    lines = text.splitlines()
    assert "ledger.db" in lines[0] and "q quits" in lines[0]
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["ADMITTED", "RUNNING"])
    assert lines[header + 1].split() == ["1", "1", "0", "40", "2", "0", "5.0", "50", "1"]  # 10 claims in 2 s
    lease = next(line for line in lines if line.startswith("order-42"))
    assert lease.split() == ["order-42", "order", "3", "host-a:4211", "18", "s", "4", "12", "s"]
    failing = next(line for line in lines if line.startswith("mail-7"))
    assert failing.split() == ["mail-7", "mail", "admitted", "6", "6"]
    assert "oldest due: mail-7 (mail), waiting 2 s" in text


def test_deliveries_per_second_need_two_readings():
    assert deliveries_per_second(reading(), None) is None
    assert deliveries_per_second(reading(), reading()) is None  # no time passed
    assert deliveries_per_second(reading(NOW + 500, 41), reading()) == 2.0
    assert deliveries_per_second(reading(NOW + 1000, 0), reading()) == 0.0  # a purge lowered the count


def test_a_busy_ledger_skips_a_refresh_and_ctrl_c_ends_the_view_quietly():
    replies = iter([reading(), StorageBusy("locked"), reading(NOW + 1000, 43), KeyboardInterrupt()])

    def read():
        reply = next(replies)
        if isinstance(reply, BaseException):
            raise reply
        return reply

    screen = io.StringIO()
    run(read, interval=0.1, console=Console(file=screen, force_terminal=True, width=160, height=50))
    drawn = screen.getvalue()
    assert "the ledger was busy: this refresh was skipped" in drawn
    assert "3.0" in drawn  # the rate between the two good readings
    assert next(replies, "done") == "done"


def test_on_a_pipe_top_prints_one_snapshot_and_exits(tmp_path):
    db = tmp_path / "ledger.db"
    with open_backend(db) as backend:
        backend.executions.admit("order-1", "order")
    shown = cli(db, "top", "--interval", "0.1", timeout=20)
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "q quits" not in shown.stdout
    lines = shown.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["ADMITTED"])
    assert lines[header + 1].split()[0] == "1"
    assert "oldest due: order-1 (order)" in shown.stdout


class Tmux:
    """A private tmux server (its own socket under tmp_path) with 160x50 panes."""

    def __init__(self, folder: Path):
        self.socket = str(folder / "tmux.sock")

    def __call__(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-S", self.socket, *args], capture_output=True, text=True, timeout=10,
                              check=False)

    def start(self, name: str, command: str) -> None:
        started = self("new-session", "-d", "-x", "160", "-y", "50", "-s", name, "-c", str(ROOT), command)
        assert started.returncode == 0, started.stderr

    def screen(self, name: str) -> str:
        return self("capture-pane", "-p", "-t", name).stdout

    def kill(self) -> None:
        self("kill-server")


@pytest.fixture
def tmux(tmp_path):
    server = Tmux(tmp_path)
    try:
        yield server
    finally:
        server.kill()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("key", ["q", "C-c"])
def test_top_in_a_terminal_shows_a_live_lease_and_quits_on_q_or_ctrl_c(tmp_path, supervisors, tmux, key):
    db = tmp_path / "ledger.db"
    gate = tmp_path / "gate"
    with open_backend(db) as backend:
        backend.executions.admit("held-1", "sv.hold", json.dumps({"log": str(tmp_path / "log"), "gate": str(gate)}))
    supervisors.start(db, concurrency=1)
    with open_backend(db) as backend:
        (lease,) = wait_until(lambda: backend.executions.stats().live_leases, message="the held step's lease")
    assert (lease.execution_id, lease.token) == ("held-1", 1)

    rc_file, stty_file, err_file = tmp_path / "top.rc", tmp_path / "top.stty", tmp_path / "top.err"
    top = shlex.join([sys.executable, "-m", "supervisor.cli", "--db", str(db), "top", "--interval", "0.2"])
    # After top: its exit code, then the terminal's modes, which top must have restored.
    tmux.start("top", f"{top} 2> {err_file}; echo $? > {rc_file}; stty -a > {stty_file}; sleep 60")

    def lease_row():
        return next((line for line in tmux.screen("top").splitlines() if line.startswith("held-1")), None)

    row = wait_until(lease_row, timeout=20, message="the live lease on the screen")
    assert row.split()[:4] == ["held-1", "sv.hold", "1", lease.holder], row
    screen = tmux.screen("top")
    assert "live leases: 1" in screen and "q quits" in screen

    assert tmux("send-keys", "-t", "top", key).returncode == 0
    wait_until(lambda: stty_file.exists() and stty_file.read_text(), timeout=5, message="top to quit")
    assert rc_file.read_text().strip() == "0"
    assert err_file.read_text() == ""  # no traceback, nothing at all
    modes = stty_file.read_text().split()
    assert "icanon" in modes and "echo" in modes, modes  # cbreak mode was undone
    assert "held-1" not in tmux.screen("top")  # the alternate screen is gone

    gate.touch()
    with open_backend(db) as backend:
        wait_until(lambda: backend.executions.get("held-1").status == "completed", message="held-1 to finish")
