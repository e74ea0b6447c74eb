"""The skewed ledger clock a chaos run gives some of its supervisors (`supervisor.chaos.fleet.skewed_env`
and `supervisor/chaos/skewed_clock/sitecustomize.py`): a process started with it, and each process
it starts, opens SQLite ledgers whose default clock adds the skew; a clock given explicitly is
left alone; a skew that is not an int ends the process, naming the variable, before it opens
anything; the `sitecustomize` it hides still runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from faults import ROOT
from supervisor.chaos.fleet import CLOCK_SKEW_ENV, skewed_env

pytestmark = pytest.mark.timeout(60)

# Two ledgers, one on the default clock and one on a clock given explicitly, opened in a child of
# the process started (as a supervisor's workers are its children): their clocks and an admission.
OPEN_TWO = """
import json, subprocess, sys
CHILD = '''
import json, sys
from supervisor import open_backend
folder = sys.argv[1]
with (open_backend(folder + "/skewed.db") as skewed,
      open_backend(folder + "/injected.db", clock=lambda: 1234) as injected):
    print(json.dumps({"skewed": skewed.clock(), "admitted": skewed.executions.admit("order-1", "charge").created_at,
                      "injected": injected.executions.admit("order-1", "charge").created_at}))
'''
print(subprocess.run([sys.executable, "-c", CHILD, sys.argv[1]], capture_output=True, text=True, check=True).stdout)
"""


def started_with_a_skew(skew: str, *args: str, path: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = skewed_env(0, dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), *path, os.environ.get("PYTHONPATH")) if p)))
    env[CLOCK_SKEW_ENV] = skew
    return subprocess.run([sys.executable, "-c", OPEN_TWO, *args], env=env, capture_output=True, text=True,
                          timeout=50, stdin=subprocess.DEVNULL)


def test_the_chaos_clock_skew_moves_the_default_clock_only(tmp_path):
    wall = time.time_ns() // 1_000_000
    done = started_with_a_skew("-600000", str(tmp_path))
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert abs(seen["skewed"] - (wall - 600_000)) < 60_000
    assert seen["admitted"] < wall - 500_000
    assert seen["injected"] == 1234


@pytest.mark.parametrize("value", ["soon", "1.5", "10ms"])
def test_a_chaos_clock_skew_that_is_not_an_int_is_refused_naming_the_variable(tmp_path, value):
    done = started_with_a_skew(value, str(tmp_path))

    assert done.returncode == 2
    refusal = f"{CLOCK_SKEW_ENV} must be an int number of milliseconds, got {value!r}"
    assert done.stderr.strip().splitlines() == [refusal]
    assert list(tmp_path.iterdir()) == []


def test_the_sitecustomize_the_skewed_clock_hides_still_runs_in_each_process(tmp_path):
    own = tmp_path / "own-site"
    own.mkdir()
    (own / "sitecustomize.py").write_text(
        "import os\nwith open(os.path.join(os.path.dirname(__file__), 'ran'), 'a') as f:\n    f.write('ran\\n')\n")
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir()
    wall = time.time_ns() // 1_000_000
    done = started_with_a_skew("-600000", str(ledgers), path=(str(own),))
    assert done.returncode == 0, done.stderr
    assert abs(json.loads(done.stdout)["skewed"] - (wall - 600_000)) < 60_000
    assert (own / "ran").read_text() == "ran\n" * 2  # the process started, and its child
