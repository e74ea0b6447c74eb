"""docs/operators.md shows real output: its console blocks are one session on a fresh ledger,
replayed here in order, each command's output compared with the one the document shows.

What varies from run to run (times, relative hints, holders, pids, durations, the app's folder,
the supervisor's own frames of a traceback, a pause of the supervisor on a loaded machine) is normalised on both sides by `normalise`; anything
else that differs (a new field, a changed wording, a missing line) fails the test.

Only ```console blocks are replayed; a ```text block (the `top` screen, a supervisor left running
in another terminal) is a capture that is not. When an output changes on purpose, rewrite the
document's outputs from a new run with

    .venv/bin/python tests/docs/test_docs_operators.py --update

(README.md's operator session is replayed the same way by tests/docs/test_readme.py.)
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import shlex
import struct
import subprocess
import sys
import tempfile
import termios
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest
from click.testing import CliRunner

from supervisor import open_backend
from supervisor.cli import main
from supervisor.ledger.values import LiveLease

ROOT = Path(__file__).resolve().parents[2]
OPERATORS = ROOT / "docs" / "operators.md"

CONSOLE_BLOCK = re.compile(r"```console\n(.*?)```", re.S)
TIME = r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:,\d{3}|[+-]\d\d:\d\d|Z)"
SPAN = r"\d+(?:\.\d+)? (?:ms|s|min|h|d)"
# (pattern, replacement), applied in order to the documented and the real output alike.
VARYING = [
    (re.compile(TIME), "<time>"),
    (re.compile(rf"\((?:now|in {SPAN}|{SPAN} ago)\)"), "(<when>)"),
    (re.compile(rf"\b(waiting|in) {SPAN}"), r"\1 <span>"),
    (re.compile(r"\b1\d{12}\b"), "<ms>"),  # epoch ms in --json
    (re.compile(r'(holder=|"holder": )("?)[^\s"]+'), r"\1\2<holder>"),
    (re.compile(r"(yieldstar\[|\(pid |worker (?:pid )?)\d+"), r"\1<pid>"),
    (re.compile(r"duration_ms=\d+"), "duration_ms=<n>"),
    # How long the workers took to be up, or a worker to load the app: a loaded machine's figure.
    (re.compile(r"\d+\.\d s after the start"), "<n> s after the start"),
    (re.compile(r"loaded the app in \d+\.\d s"), "loaded the app in <n> s"),
    (re.compile(r"(yieldstar_oldest_due_seconds) \S+"), r"\1 <n>"),
]
FRAME = re.compile(r'^(\s*)File "([^"]+)", line \d+, in (\S+)$')
# A line a loaded machine adds: the supervisor's loop was kept from running (`worker_watch.beat`).
PAUSED = re.compile(r"yieldstar\[\d+\] the supervisor was paused for ")
CARETS = re.compile(r"^\s*[~^]+\s*$")  # Python 3.11+ marks the failing expression; 3.10 does not


def normalise(output: str) -> str:
    """`output` with what varies between runs replaced by placeholders. In a traceback, the
    frames of Yieldstar's own code are left out (they follow its line numbers, not the app's),
    the app's frames keep their function and source line, and the `^^^` markers are dropped."""
    lines, skip_deeper_than = [], None
    for line in output.rstrip("\n").split("\n"):
        line = line.rstrip()
        if PAUSED.search(line):
            continue
        indent = len(line) - len(line.lstrip())
        if skip_deeper_than is not None and indent > skip_deeper_than:
            continue
        skip_deeper_than = None
        frame = FRAME.match(line)
        if frame:
            if f"{os.sep}worker{os.sep}" in frame.group(2) or f"{os.sep}supervisor{os.sep}" in frame.group(2):
                skip_deeper_than = indent
                continue
            line = f'{frame.group(1)}File ".../{os.path.basename(frame.group(2))}", line <n>, in {frame.group(3)}'
        if CARETS.match(line):
            continue
        for pattern, replacement in VARYING:
            line = pattern.sub(replacement, line)
        lines.append(line)
    return "\n".join(lines)


@dataclass
class Command:
    line: str  # as the document shows it, without the `$ `
    shown: str  # the output the document shows
    block: int  # which console block (0-based)


def session(text: str) -> list[Command]:
    """Every `$ command` of the console blocks of `text`, in order, with the output shown under it."""
    commands: list[Command] = []
    for block, match in enumerate(CONSOLE_BLOCK.finditer(text)):
        for line in match.group(1).rstrip("\n").split("\n"):
            if line.startswith("$ "):
                commands.append(Command(line[2:], "", block))
            else:
                assert commands and commands[-1].block == block, f"output before any command: {line!r}"
                commands[-1].shown += line + "\n"
    return commands


def code_block(text: str, first_line: str) -> str:
    """The python block of `text` whose first line starts with `first_line`."""
    match = re.search(r"```python\n(" + re.escape(first_line) + r"[^\n]*\n.*?)```", text, re.S)
    assert match, f"no python block starting with {first_line!r}"
    return match.group(1)


def yieldstar_args(line: str) -> tuple[list[str], bool]:
    """The CLI arguments of a documented `yieldstar ...` command line, and whether its output
    is piped through `python3 -m json.tool`."""
    pretty = line.endswith("| python3 -m json.tool")
    words = shlex.split(line.removesuffix("| python3 -m json.tool"))
    assert os.path.basename(words[0]) == "yieldstar", f"not a yieldstar command: {line!r}"
    return words[1:], pretty


def run(line: str, folder: Path) -> tuple[str, int]:
    """Run one documented command in `folder` (the ledger is its ./yieldstar.db): its output
    (stdout, then stderr) and exit code. `supervise` runs as a process on a pseudo-terminal, as
    in the document (so its last line is its status line); the others run in this process."""
    args, pretty = yieldstar_args(line)
    if args[0] == "supervise":
        assert "--until-idle" in args, f"a replayed supervisor must end by itself: {line!r}"
        return on_a_terminal([sys.executable, "-m", "supervisor.cli", *args], folder)
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        result = CliRunner(env={"YIELDSTAR_DB": None}).invoke(main, args, prog_name="yieldstar")
    finally:
        os.chdir(cwd)
    output = result.stdout
    if pretty:
        output = json.dumps(json.loads(output), indent=4) + "\n"
    return output + result.stderr, result.exit_code


def on_a_terminal(argv: list[str], folder: Path, timeout: float = 60.0) -> tuple[str, int]:
    """Run `argv` with stdout and stderr on a pseudo-terminal 120 columns wide; what the
    terminal shows at the end (lines redrawn in place with a carriage return read as their last
    drawing), and the exit code."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 120, 0, 0))
    env = {k: v for k, v in os.environ.items() if k != "YIELDSTAR_DB"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    process = subprocess.Popen(argv, cwd=folder, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
                               env=env, start_new_session=True)
    os.close(follower)
    raw, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: every writer is gone
                break
            if not chunk:
                break
            raw += chunk
        code = process.wait(max(1.0, deadline - time.monotonic()))
    finally:
        os.close(leader)
        if process.poll() is None:
            process.kill()
            process.wait()
    shown = [line.rstrip("\r").rsplit("\r", 1)[-1].rstrip() for line in raw.decode().split("\n")]
    return "\n".join(shown).strip("\n") + "\n", code


def replay(text: str, folder: Path, *, after=None, include=None) -> list[tuple[Command, str]]:
    """Run the console session of `text` in `folder`: each command with its real output.
    `include(command)`, when given, picks the commands to run (the others are left out);
    `after(command, output)` runs after each one (to wait for a supervisor)."""
    done = []
    for command in session(text):
        if include is not None and not include(command):
            continue
        output, code = run(command.line, folder)
        failed = command.shown.startswith("yieldstar: ")
        assert (code != 0) == failed, f"$ {command.line}\nexit {code}:\n{output}"
        done.append((command, output))
        if after is not None:
            after(command, output)
    return done


def assert_replayed(done: list[tuple[Command, str]]) -> None:
    """Every documented output is the real one, up to what varies between runs."""
    for command, output in done:
        assert normalise(output) == normalise(command.shown), (
            f"$ {command.line}\n--- documented ---\n{command.shown}--- real ---\n{output}")


def with_outputs(text: str, done: list[tuple[Command, str]]) -> str:
    """`text` with the outputs shown under the commands of `done` replaced by the real ones."""
    real = {(command.block, command.line): output for command, output in done}
    assert len(real) == len(done), "a command repeated in one block: its outputs cannot be told apart"
    shown = iter(session(text))

    def block(match: re.Match) -> str:
        lines = []
        for line in match.group(1).rstrip("\n").split("\n"):
            if line.startswith("$ "):
                command = next(shown)
                lines.append(line + "\n" + real.get((command.block, command.line), command.shown))
        return "```console\n" + "".join(lines) + "```"

    return CONSOLE_BLOCK.sub(block, text)


def operators_folder(base: Path) -> Path:
    """A fresh folder holding the app of docs/operators.md, `shop.py`."""
    folder = base / "shop"
    folder.mkdir()
    (folder / "shop.py").write_text(code_block(OPERATORS.read_text(), "# shop.py"))
    return folder


@pytest.mark.timeout(60)
def test_the_operators_guide_shows_the_real_output_of_every_command(tmp_path):
    done = replay(OPERATORS.read_text(), operators_folder(tmp_path))
    commands = {yieldstar_args(command.line)[0][0] for command, _ in done}
    assert commands >= {"start", "supervise", "get", "ls", "steps", "wake", "stats", "metrics", "cancel", "resume",
                        "purge", "history"}
    assert_replayed(done)


@pytest.mark.timeout(30)
def test_the_top_screen_shown_has_the_labels_of_a_real_one(tmp_path):
    """The screen in the guide is a capture from a terminal (tests/cli/test_top.py drives `top` in
    one); its headings and column labels are those `top` prints now."""
    text = OPERATORS.read_text()
    screen = re.search(r"```text\n(yieldstar top .*?)```", text, re.S)
    assert screen, "docs/operators.md shows no top screen"
    folder = operators_folder(tmp_path)
    output, code = run("yieldstar start order --input '{\"order_id\": 1, \"items\": 1}'", folder)
    assert code == 0, output
    output, code = run("yieldstar top", folder)
    assert code == 0, output

    def labels(screen: str) -> list[str]:
        return [re.sub(r"\d+$", "", " ".join(line.split())) for line in screen.splitlines()
                if re.fullmatch(r"[A-Z/ ]+|[a-z ()',]+: ?\d+", line.strip())]

    assert labels(screen.group(1)) == labels(output), output
    assert screen.group(1).startswith("yieldstar top  yieldstar.db  ") and "q quits" in screen.group(1)


def test_history_says_when_each_delivery_ended_and_dash_while_it_is_live(tmp_path):
    with open_backend(tmp_path / "yieldstar.db") as backend:
        backend.executions.admit("order-9", "order")
        backend.executions.claim_due(limit=1, duration=60_000)
    output, code = run("yieldstar history order-9", tmp_path)
    assert code == 0, output
    assert re.fullmatch(r"token=1  holder=\S+  claimed_at=\S+ \(now\)  expires_at=\S+ \(in \d+ s\)  ended_at=-"
                        r"  renewals=0  ended=live\n", output), output


def test_normalise_keeps_what_does_not_vary():
    a = "token=1  holder=vm:7407  claimed_at=2026-12-03T15:58:11+00:00 (2 s ago)  renewals=0  ended=acknowledged"
    b = "token=1  holder=ci-7:12  claimed_at=2027-01-01T00:00:00-05:00 (now)  renewals=0  ended=acknowledged"
    assert normalise(a) == normalise(b)
    assert normalise(a) != normalise(b.replace("ended=", "end="))
    assert normalise('"created_at": 1796313491737') == normalise('"created_at": 1796313499999')
    assert normalise("1 execution deleted") != normalise("2 executions deleted")
    paused = "2026-12-05 10:48:03,629 yieldstar[32385] the supervisor was paused for 3.2 s\n"
    assert normalise(paused + "idle") == normalise("idle")


def update() -> None:
    """Rewrite docs/operators.md's outputs from a new run: the console blocks, then, with tmux,
    the screens of `top` and of a supervisor left running in a terminal."""
    text = OPERATORS.read_text()
    with tempfile.TemporaryDirectory() as base:
        folder = operators_folder(Path(base))
        text = with_outputs(text, replay(text, folder))
        top, supervisor = live_screens(folder, Path(base) / "tmux.sock")
    text = re.sub(r"```text\n(?:TOP-SCREEN|yieldstar top ).*?```", lambda m: f"```text\n{top}```", text, flags=re.S)
    text = re.sub(r"```text\n(?:SUPERVISE-SCREEN|[^`]* supervising ).*?```", lambda m: f"```text\n{supervisor}```", text,
                  flags=re.S)
    OPERATORS.write_text(text)


def live_screens(folder: Path, socket: Path) -> tuple[str, str]:
    """In tmux: `yieldstar supervise shop.py` until it holds report-1's lease and order-3 is
    done, then `yieldstar top`; both screens as they are then. The supervisor is stopped after."""
    from faults import wait_until  # tests/ is on sys.path: pytest puts it there for conftest.py, --update by hand
    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", "-S", str(socket), *args], check=True, capture_output=True, text=True).stdout

    def screen(name: str) -> str:
        return "\n".join(line.rstrip() for line in tmux("capture-pane", "-p", "-J", "-t", name).split("\n")).strip() + "\n"

    def running() -> bool:
        return subprocess.run(["tmux", "-S", str(socket), "has-session", "-t", "supervise"],
                              capture_output=True).returncode == 0

    def report_lease(backend) -> Optional[LiveLease]:
        leases = backend.executions.stats().live_leases
        return leases[0] if [lease.execution_id for lease in leases] == ["report-1"] else None

    def into_the_slow_step(backend) -> bool:
        """report-1's lease held for 2 s by the ledger's clock, and not yet renewed."""
        lease = report_lease(backend)
        assert lease is None or lease.renewals == 0, f"report-1's lease was renewed before the screens: {lease}"
        return lease is not None and backend.clock() - lease.claimed_at >= 2000

    def top_has_a_rate() -> bool:
        """`top` has read twice: its counts row shows a rate of deliveries, not "-"."""
        lines = screen("top").splitlines()
        rows = [lines[i + 1].split() for i, line in enumerate(lines[:-1]) if "DELIVERIES/S" in line]
        return bool(rows) and len(rows[0]) > 6 and rows[0][6] != "-"

    cli = shlex.join([sys.executable, "-m", "supervisor.cli"])
    tmux("new-session", "-d", "-x", "160", "-y", "20", "-s", "supervise", "-c", str(folder),
         f"env -u YIELDSTAR_DB {cli} supervise shop.py")
    try:
        with open_backend(folder / "yieldstar.db") as backend:
            wait_until(lambda: report_lease(backend) and backend.executions.get("order-3").status == "completed",
                       timeout=60, interval=0.1, message="report-1 running and order-3 done")
            wait_until(lambda: into_the_slow_step(backend), timeout=60, interval=0.1,
                       message="a renewal-free moment into the slow step")
            tmux("new-session", "-d", "-x", "110", "-y", "18", "-s", "top", "-c", str(folder),
                 f"env -u YIELDSTAR_DB {cli} top")
            wait_until(top_has_a_rate, timeout=30, interval=0.1, message="two readings of top: a rate of deliveries")
            top, supervisor = screen("top"), screen("supervise")
            tmux("send-keys", "-t", "supervise", "C-c")
            # The grace period, then the slow step is killed, its lease released and the supervisor gone.
            wait_until(lambda: not running() and report_lease(backend) is None, timeout=60, interval=0.1,
                       message="the supervisor stopped and report-1's lease released")
    finally:
        tmux("kill-server")
    return top, supervisor


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit(__doc__)
    sys.path.insert(0, str(ROOT / "tests"))  # where pytest finds faults.py, beside the suite's conftest.py
    update()
