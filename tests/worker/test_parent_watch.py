"""How a worker knows its supervisor is still the process it started under: its pid and its start
time since boot (`process_start`), which a clock step does not move and a later process given the
same pid does not share."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from faults import wait_until
from worker._runtime.parent_watch import process_start

pytestmark = pytest.mark.timeout(60)


def seconds_since_boot(ticks: float) -> float:
    return ticks / os.sysconf("SC_CLK_TCK") if sys.platform.startswith("linux") else ticks - psutil.boot_time()


def test_the_start_of_a_live_process_is_stable_and_matches_what_psutil_reads():
    started = process_start(os.getpid())
    assert started is not None and process_start(os.getpid()) == started
    expected = psutil.Process().create_time() - psutil.boot_time()
    assert abs(seconds_since_boot(started) - expected) < 0.05


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the command name is read from /proc")
def test_a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields():
    # The name is the second field of /proc/<pid>/stat, in parentheses, and may hold both.
    renamed = subprocess.Popen([sys.executable, "-c",
                                "open('/proc/self/comm', 'w').write('a) b (c) d'); import time; print(flush=True);"
                                " time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        renamed.stdout.readline()
        assert psutil.Process(renamed.pid).name() == "a) b (c) d"
        expected = psutil.Process(renamed.pid).create_time() - psutil.boot_time()
        assert abs(seconds_since_boot(process_start(renamed.pid)) - expected) < 0.05
    finally:
        renamed.kill()
        renamed.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the start is read in ticks of the boot clock")
def test_a_process_gone_has_no_start_and_a_later_one_has_another():
    first = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started = process_start(first.pid)
    first.kill()
    first.wait()
    assert started is not None and process_start(first.pid) is None
    # A start is counted in clock ticks: the next process must start in a later one.
    ticks = os.sysconf("SC_CLK_TCK")
    wait_until(lambda: time.clock_gettime(time.CLOCK_BOOTTIME) * ticks >= started + 1, timeout=5,
               interval=0.001, message="the boot clock to pass the first process's start")
    later = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert process_start(later.pid) > started
    finally:
        later.kill()
        later.wait()
