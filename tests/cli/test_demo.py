"""`yieldstar demo` plays its three acts with real processes and every verdict holds."""

import os
import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_demo_runs_every_act_and_every_verdict_holds(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "supervisor.cli", "demo"], capture_output=True, text=True,
                            env=env, timeout=170)
    assert result.returncode == 0, result.stdout + result.stderr
    for act in ("Act 1", "Act 2", "Act 3"):
        assert act in result.stdout
    assert result.stdout.count("PASS") == 8
    assert "FAIL" not in result.stdout
    assert result.stdout.count("customer charged once") == 3
    # Nothing is left behind in the temporary folder.
    assert os.listdir(tmp_path) == []


@pytest.mark.timeout(60)
def test_demo_keep_leaves_the_ledger_for_inspection(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "supervisor.cli", "demo", "--act", "1", "--keep"],
                            capture_output=True, text=True, env=env, timeout=55)
    assert result.returncode == 0, result.stdout + result.stderr
    (kept,) = os.listdir(tmp_path)
    assert os.path.exists(tmp_path / kept / "act1" / "shop.db")
    assert "Act 2" not in result.stdout
