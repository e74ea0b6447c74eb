"""How long the fleet's processes waited for a CPU: the harness's samples of the kernel's
run-queue delay, and the checker's question "was this process starved over that window".

Linux counts, for each thread, the time it spent runnable but not running: the second field of
`/proc/<pid>/task/<tid>/schedstat`, in ns. A thread blocked in a call, waiting on a lock, the
database or a pipe, or stopped by SIGSTOP is not runnable and does not count. So a supervisor
whose threads waited for a CPU for most of a window hardly ran in it: the load of the machine
starved it. (A thread that waits for a CPU while it holds the interpreter lock stops the others
with it: they sleep on the lock, and only its wait counts. Hence the sum over threads, the
kernel's own measure of a process's delay, taskstats' `cpu_delay_total`.) The runtime cannot
tell that from a freeze (a lease it could not renew is lost, as designed), and the checker must
not take it for a runtime that failed to renew.

The harness samples every supervisor of the fleet and every worker it has listed, at most every
`SAMPLE_S`, and appends to `logs/cpu-waits.log` a line for each process whose threads waited
(`MIN_GROWTH_MS` or more in one thread) since its last line:

    <true ms> <pid> <tid>:<ms waited> [<tid>:<ms waited> ...]

each wait counted since its thread began. The sample before such a line is written too (if it
was not), so that every interval in which a process waited is bracketed by the samples around
it, and the intervals in between hold less than `MIN_GROWTH_MS` of waiting per thread.

`CpuWaits.starved_ms` bounds from below how long, in a window, the threads of a process waited
for a CPU, together. The harness itself may be starved and sample seldom: the bound is then
weaker, never wrong.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from typing import Iterable, Optional

CPU_WAITS_LOG = os.path.join("logs", "cpu-waits.log")  # in the work folder
SAMPLE_S = 0.1
MIN_GROWTH_MS = 1


def thread_waits(pid: int) -> Optional[dict[int, int]]:
    """{tid: ms it waited for a CPU since it began} of each thread of `pid`, or None if the
    process is gone (or the kernel keeps no such count)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    waits = {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                fields = f.read().split()
            waits[int(tid)] = int(fields[1]) // 1_000_000
        except (OSError, IndexError, ValueError):
            continue  # the thread ended meanwhile
    return waits or None


def available() -> bool:
    """Whether this kernel counts run-queue waits (`schedstat` in /proc)."""
    return thread_waits(os.getpid()) is not None


class CpuWaitSampler:
    """The harness's side: samples the processes it is given, and journals the waits."""

    def __init__(self, folder: str):
        self.enabled = available()
        self._file = open(os.path.join(folder, CPU_WAITS_LOG), "a") if self.enabled else None
        self._next = 0.0
        self._written: dict[int, dict[int, int]] = {}  # pid -> the waits of its last line
        self._held: dict[int, tuple[int, dict[int, int]]] = {}  # pid -> its last sample, if not written

    def sample(self, pids: Iterable[int]) -> None:
        """Sample `pids` (at most every `SAMPLE_S`; a call in between does nothing)."""
        if not self.enabled or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + SAMPLE_S
        lines = []
        for pid in set(pids):
            waits = thread_waits(pid)
            at_ms = time.time_ns() // 1_000_000
            if waits is None:
                self._written.pop(pid, None)
                self._held.pop(pid, None)
                continue
            last = self._written.get(pid)
            if last is not None and all(ms - last.get(tid, 0) < MIN_GROWTH_MS for tid, ms in waits.items()):
                self._held[pid] = (at_ms, waits)
                continue
            held = self._held.pop(pid, None)
            if held is not None:
                lines.append(_line(pid, *held))
            lines.append(_line(pid, at_ms, waits))
            self._written[pid] = waits
        if lines:
            self._file.write("".join(lines))
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            for pid, held in self._held.items():  # the end of the last interval of each
                self._file.write(_line(pid, *held))
            self._held = {}
            self._file.close()
            self._file = None


def _line(pid: int, at_ms: int, waits: dict[int, int]) -> str:
    return f"{at_ms} {pid} " + " ".join(f"{tid}:{ms}" for tid, ms in sorted(waits.items())) + "\n"


class CpuWaits:
    """The checker's side: the samples of a run, by process."""

    def __init__(self, samples: dict[int, list[tuple[int, dict[int, int]]]]):
        self.samples = samples  # pid -> [(true ms, {tid: ms waited})], in time order
        # pid -> tid -> [(t0, t1, ms)]: the waits the kernel counted between two samples
        self._waits: dict[int, dict[int, list[tuple[int, int, int]]]] = {}
        for pid, rows in samples.items():
            by_thread: dict[int, list] = defaultdict(list)
            for (t0, w0), (t1, w1) in zip(rows, rows[1:]):
                for tid, ms in w1.items():
                    # A thread new since t0, or a count that went down (a reused pid's new
                    # process), began after t0: all of its count is new.
                    waited = ms - w0[tid] if tid in w0 and ms >= w0[tid] else ms
                    if waited > 0:
                        by_thread[tid].append((t0, t1, waited))
            self._waits[pid] = dict(by_thread)

    @property
    def known(self) -> bool:
        return bool(self.samples)

    def starved_ms(self, pid: int, start: int, end: int) -> int:
        """At least how long, between `start` and `end` (true ms), the threads of `pid` were
        runnable and not running, added up.

        The kernel adds a wait to a thread's count when the wait ends, as the thread gets a CPU:
        a wait of `ms` counted between samples at t0 and t1 ended in that interval and began no
        earlier than t0 - ms. Of the waits of one thread (which never overlap), only what cannot
        lie outside the window is counted."""
        total = 0
        for waits in self._waits.get(pid, {}).values():
            for t0, t1, waited in waits:
                begun = t0 - waited
                if t1 <= start or begun >= end:
                    continue
                outside = (t1 - begun) - (min(t1, end) - max(begun, start))
                total += max(0, waited - outside)
        return total


def read_cpu_waits(folder: str) -> CpuWaits:
    samples: dict[int, list] = defaultdict(list)
    path = os.path.join(folder, CPU_WAITS_LOG)
    if os.path.exists(path):
        with open(path, errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3 or not line.endswith("\n"):
                    continue
                try:
                    waits = {int(tid): int(ms) for tid, _, ms in (pair.partition(":") for pair in fields[2:])}
                    samples[int(fields[1])].append((int(fields[0]), waits))
                except ValueError:
                    continue
    for rows in samples.values():
        rows.sort(key=lambda row: row[0])
    return CpuWaits(dict(samples))
