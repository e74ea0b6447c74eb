"""The README's quickstart works as written: its app runs under a supervisor, its unit test
passes, and its operator commands print what the README shows (replayed as
tests/docs/test_docs_operators.py replays docs/operators.md)."""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from test_docs_operators import assert_replayed, replay, session, with_outputs, yieldstar_args
from test_docs_operators import code_block as block_of

from supervisor import open_backend

README = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "README.md")


def code_block(first_line: str) -> str:
    with open(README) as f:
        return block_of(f.read(), first_line)


def yieldstar(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "supervisor.cli", "--db", str(tmp_path / "yieldstar.db"), *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)


@pytest.mark.timeout(90)
def test_quickstart_app_runs_under_a_supervisor(tmp_path):
    (tmp_path / "shop.py").write_text(code_block("# shop.py"))
    assert yieldstar(tmp_path, "start", "order", "--id", "order-42", "--input", '{"order_id": 42}').stdout == "order-42\n"
    result = yieldstar(tmp_path, "supervise", "shop.py", "--until-idle", "--poll-ms", "50")
    assert result.returncode == 0, result.stderr
    record = json.loads(yieldstar(tmp_path, "get", "order-42", "--json").stdout)
    assert record["status"] == "completed"
    assert record["result"] == {"order": 42, "charge": "ch_order-42/charge"}


@pytest.mark.timeout(60)
def test_quickstart_unit_test_passes(tmp_path):
    (tmp_path / "shop.py").write_text(code_block("# shop.py"))
    (tmp_path / "test_shop.py").write_text(code_block("# test_shop.py"))
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_shop.py"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=50)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


def start_shop_supervisor(folder: Path) -> subprocess.Popen:
    """`yieldstar supervise shop.py` in the quickstart's folder, on the default ledger there."""
    (folder / "shop.py").write_text(code_block("# shop.py"))
    with open(folder / "supervisor.log", "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "supervisor.cli", "supervise", "shop.py", "--poll-ms", "100"],
                                cwd=folder, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


@pytest.fixture
def shop_supervisor(tmp_path):
    process = start_shop_supervisor(tmp_path)
    try:
        yield process
    finally:
        stop(process)


def shown_output(command_line: str) -> str:
    """What the README shows `$ command_line` printing."""
    with open(README) as f:
        (shown,) = [command.shown for command in session(f.read()) if command.line == command_line]
    return shown


@pytest.mark.timeout(90)
def test_the_supervisors_first_line_is_the_one_the_readme_shows(shop_supervisor, tmp_path):
    """The README shows the line `supervise` starts with, its time and process elided by `...`
    and its pid made up."""
    (shown,) = shown_output(".venv/bin/yieldstar supervise shop.py").splitlines()
    assert shown.startswith("... ")
    expected = re.sub(r"\(pid \d+\)", f"(pid {shop_supervisor.pid})", shown[len("... "):])
    log = tmp_path / "supervisor.log"
    deadline = time.monotonic() + 30
    while not log.read_text():
        assert time.monotonic() < deadline, "the supervisor printed nothing"
        time.sleep(0.05)
    first = log.read_text().splitlines()[0]
    assert first.endswith(expected), (first, expected)


def place_order(folder: Path) -> subprocess.CompletedProcess:
    (folder / "place_order.py").write_text(code_block("# place_order.py"))
    return subprocess.run([sys.executable, "place_order.py"], cwd=folder, capture_output=True, text=True, timeout=80)


def operator_commands(command) -> bool:
    """The README's operator commands: the `yieldstar` ones, but not the supervisor left running."""
    try:
        args, _ = yieldstar_args(command.line)
    except AssertionError:
        return False  # `python place_order.py`
    return args[0] != "supervise"


def until_suspended(folder: Path):
    """After `yieldstar start`: wait until the supervisor has run the new execution up to its timer."""
    def after(command, output):
        if yieldstar_args(command.line)[0][0] != "start":
            return
        with open_backend(folder / "yieldstar.db") as backend:
            deadline = time.monotonic() + 30
            while backend.executions.get(output.strip()).status != "suspended":
                assert time.monotonic() < deadline, f"{output.strip()} was not suspended"
                time.sleep(0.02)
    return after


def operator_session(folder: Path) -> list:
    with open(README) as f:
        return replay(f.read(), folder, include=operator_commands, after=until_suspended(folder))


@pytest.mark.timeout(90)
def test_quickstart_application_starts_an_order_and_waits_for_its_result(tmp_path, shop_supervisor):
    result = place_order(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == shown_output(".venv/bin/python place_order.py")

    # Then the README's operator commands, in order, on the same ledger, with the same supervisor.
    done = operator_session(tmp_path)
    assert [yieldstar_args(command.line)[0][0] for command, _ in done] == [
        "start", "get", "stats", "cancel", "resume", "purge"]
    assert_replayed(done)


WEB_CALLS = """
import asyncio, json
import web

async def main():
    placed = await web.place_order(7)
    again = await web.place_order(7)                # a retried request starts nothing new
    now = await web.order_status(7)
    done = await web.order_status(7, wait=60)
    print(json.dumps([placed, again, now, done]))

asyncio.run(main())
"""


@pytest.mark.timeout(90)
def test_quickstart_web_endpoints_start_an_order_and_report_its_status(tmp_path, shop_supervisor):
    (tmp_path / "web.py").write_text(code_block("# web.py"))
    result = subprocess.run([sys.executable, "-c", WEB_CALLS], cwd=tmp_path, capture_output=True, text=True,
                            timeout=80)
    assert result.returncode == 0, result.stderr
    placed, again, now, done = json.loads(result.stdout)
    assert placed["id"] == again["id"] == now["id"] == "order-7"
    assert placed["status"] in ("admitted", "running") and now["status"] in ("admitted", "running", "suspended")
    assert done == {"id": "order-7", "status": "completed", "result": {"order": 7, "charge": "ch_order-7/charge"}}


def update() -> None:
    """Rewrite the outputs of the README's operator commands from a new run."""
    with open(README) as f:
        text = f.read()
    with tempfile.TemporaryDirectory() as base:
        supervisor = start_shop_supervisor(Path(base))
        try:
            assert place_order(Path(base)).returncode == 0
            done = operator_session(Path(base))
        finally:
            stop(supervisor)
    with open(README, "w") as f:
        f.write(with_outputs(text, done))


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/docs/test_readme.py --update  (rewrites the outputs of the README's operator commands)")
    update()
