"""The README's quickstart works as written: its app runs under a supervisor, and its unit test
passes."""

import json
import os
import re
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
