"""The wall-clock shift (`supervisor.chaos.wall_clock`): a process started with `shifted_env`
reads a wall clock really moved, through every call (Python's `time.time`, `date`), while its
monotonic clock is the machine's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from supervisor.chaos import wall_clock
from supervisor.chaos.wall_clock import OFFSET_VARIABLE, WallClockShimError, shifted_env

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("needs_the_shim")]

# The wall clock is stepped or slewed by NTP now and then: readings taken around a child's may
# disagree with it by that much, beyond the offset.
SLEW_NS = 50_000_000

READ_CLOCKS = """
import json, time
print(json.dumps({"time": time.time_ns(), "monotonic": time.monotonic_ns(),
                  "tai": time.clock_gettime_ns(time.CLOCK_TAI), "boottime": time.clock_gettime_ns(time.CLOCK_BOOTTIME)}))
"""


def read_clocks(env: dict) -> tuple[dict, dict, dict]:
    """The parent's readings before and after a child started with `env` read its own."""
    before = {"time": time.time_ns(), "monotonic": time.monotonic_ns(), "tai": time.clock_gettime_ns(time.CLOCK_TAI),
              "boottime": time.clock_gettime_ns(time.CLOCK_BOOTTIME)}
    done = subprocess.run([sys.executable, "-c", READ_CLOCKS], env=env, capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, check=True)
    after = {"time": time.time_ns(), "monotonic": time.monotonic_ns(), "tai": time.clock_gettime_ns(time.CLOCK_TAI),
             "boottime": time.clock_gettime_ns(time.CLOCK_BOOTTIME)}
    return before, json.loads(done.stdout), after


@pytest.mark.parametrize("offset_ms", [30_000, -30_000])
def test_a_shifted_process_reads_its_wall_clock_moved_and_its_monotonic_clock_untouched(offset_ms):
    before, child, after = read_clocks(shifted_env(offset_ms))
    offset_ns = offset_ms * 1_000_000
    for clock in ("time", "tai"):  # moved by the offset
        assert before[clock] + offset_ns - SLEW_NS <= child[clock] <= after[clock] + offset_ns + SLEW_NS, (clock, before,
                                                                                                          child, after)
    for clock in ("monotonic", "boottime"):  # the machine's own
        assert before[clock] <= child[clock] <= after[clock], (clock, before, child, after)


@pytest.mark.parametrize("offset_ms", [30_000, -30_000])
def test_date_through_the_shim_is_shifted_too(offset_ms):
    before = time.time()
    printed = subprocess.run(["date", "+%s"], env=shifted_env(offset_ms), capture_output=True, text=True, timeout=30,
                             check=True, stdin=subprocess.DEVNULL).stdout
    after = time.time()
    # `date +%s` prints whole seconds (rounded down).
    assert int(before + offset_ms / 1000) - 1 <= int(printed) <= after + offset_ms / 1000 + 1, (before, printed, after)


def test_children_inherit_the_shift():
    grandchild = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {READ_CLOCKS!r}], check=True)"
    before = time.time_ns()
    done = subprocess.run([sys.executable, "-c", grandchild], env=shifted_env(30_000), capture_output=True, text=True,
                          timeout=60, check=True, stdin=subprocess.DEVNULL)
    after = time.time_ns()
    assert before + 30_000_000_000 - SLEW_NS <= json.loads(done.stdout)["time"] <= after + 30_000_000_000 + SLEW_NS


def test_the_environment_is_a_copy_with_the_library_first_in_ld_preload(tmp_path):
    given = {"PATH": os.environ["PATH"], "LD_PRELOAD": "/other/lib.so"}
    env = shifted_env(-1500, given, folder=str(tmp_path))
    library = wall_clock.library(str(tmp_path))
    assert env["LD_PRELOAD"] == f"{library} /other/lib.so" and env[OFFSET_VARIABLE] == "-1500"
    assert given == {"PATH": os.environ["PATH"], "LD_PRELOAD": "/other/lib.so"}  # the caller's is untouched
    assert OFFSET_VARIABLE not in os.environ
    cache = os.path.dirname(library)
    assert os.path.dirname(cache) == str(tmp_path)
    assert os.stat(cache).st_mode & 0o777 == 0o700 and os.stat(library).st_mode & 0o077 == 0
    assert shifted_env(0, {})["LD_PRELOAD"] == wall_clock.library()  # nothing to prepend to
    assert wall_clock.library(str(tmp_path)) == library  # built once


def test_two_processes_building_at_once_both_end_with_a_whole_library(tmp_path):
    build = ("import sys; from supervisor.chaos import wall_clock;"
             " print(wall_clock.library(sys.argv[1]))")
    builders = [subprocess.Popen([sys.executable, "-c", build, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                                 stdin=subprocess.DEVNULL) for _ in range(2)]
    paths = {builder.communicate(timeout=90)[0].strip() for builder in builders}
    assert [builder.returncode for builder in builders] == [0, 0]
    (path,) = paths
    cache = os.path.dirname(path)
    assert os.listdir(cache) == [os.path.basename(path)]  # no partial file left behind
    env = {**os.environ, "LD_PRELOAD": path, OFFSET_VARIABLE: "60000"}
    before, child, after = read_clocks(env)
    assert before["time"] + 60_000_000_000 - SLEW_NS <= child["time"] <= after["time"] + 60_000_000_000 + SLEW_NS


def test_a_cache_folder_others_may_write_to_is_refused(tmp_path):
    cache = tmp_path / f"yieldstar-wall-clock-{os.geteuid()}"
    cache.mkdir(mode=0o700)
    os.chmod(cache, 0o777)
    with pytest.raises(WallClockShimError, match="only its owner"):
        shifted_env(1000, folder=str(tmp_path))


def test_without_gcc_it_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no gcc there
    assert "gcc" in wall_clock.available()
    with pytest.raises(WallClockShimError, match="gcc"):
        shifted_env(1000, folder=str(tmp_path))
