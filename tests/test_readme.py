"""The README's quickstart works as written: its app runs under a supervisor, and its unit test
passes."""

import json
import os
import re
import signal
import subprocess
import sys

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def code_block(first_line: str) -> str:
    with open(README) as f:
        text = f.read()
    match = re.search(r"```python\n" + re.escape(first_line) + r"[^\n]*\n(.*?)```", text, re.S)
    assert match, f"README has no python block starting with {first_line!r}"
    return match.group(1)


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


@pytest.fixture
def shop_supervisor(tmp_path):
    """`yieldstar supervise shop.py` in the quickstart's folder, on the default ledger there."""
    (tmp_path / "shop.py").write_text(code_block("# shop.py"))
    log = open(tmp_path / "supervisor.log", "wb")
    process = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "supervise", "shop.py", "--poll-ms", "100"],
                               cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        log.close()


@pytest.mark.timeout(90)
def test_quickstart_application_starts_an_order_and_waits_for_its_result(tmp_path, shop_supervisor):
    (tmp_path / "place_order.py").write_text(code_block("# place_order.py"))
    result = subprocess.run([sys.executable, "place_order.py"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=80)
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()
    assert first in ("order-42 admitted", "order-42 running")  # the supervisor may claim it at once
    assert second == "{'order': 42, 'charge': 'ch_order-42/charge'}"


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
