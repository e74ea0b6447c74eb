"""Benchmark: how long `yieldstar supervise APP --workers P` takes until every worker is up.

    .venv/bin/python scripts/bench_workers_ready.py [--workers 64 256] [--runs 3] [--app worker.apps.bench]

For each P, starts `yieldstar supervise APP --workers P --concurrency 4P` on a fresh ledger, and
times from the exec to the log line of the P-th worker that reported it loaded the app ("worker
PID is ready"); then stops it (SIGTERM) and waits for it to exit. Prints each run, the median of
the runs, and the CPU time the supervisor and its workers spent (user + system) until all were up.

The machine is shared and noisy: compare the medians, run beside nothing else when you can.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time

READY = re.compile(rb"worker \d+ is ready")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_to_ready(workers: int, app: str, timeout_s: float) -> tuple[float, float]:
    """Seconds from the exec to all `workers` ready, and the CPU seconds spent by then (counted
    once the supervisor and its workers exited)."""
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "supervisor.cli", "--db", os.path.join(folder, "ledger.db"), "supervise",
                   app, "--workers", str(workers), "--concurrency", str(4 * workers)]
        cpu_before = children_cpu_s()
        started = time.perf_counter()
        process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
        ready = 0
        took = float("nan")
        try:
            for line in process.stderr:
                if READY.search(line):
                    ready += 1
                    if ready == workers:
                        took = time.perf_counter() - started
                        break
                if time.perf_counter() - started > timeout_s:
                    break
        finally:
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=60)
        if ready < workers:
            raise SystemExit(f"only {ready} of {workers} workers were ready after {timeout_s:.0f} s")
        return took, children_cpu_s() - cpu_before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--app", default="worker.apps.bench")
    parser.add_argument("--timeout", type=float, default=180.0, help="Give up on a run after this many seconds.")
    args = parser.parse_args()
    os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    for workers in args.workers:
        runs = [time_to_ready(workers, args.app, args.timeout) for _ in range(args.runs)]
        times = ", ".join(f"{took:.2f} s" for took, _ in runs)
        print(f"--workers {workers:3d}: all ready in {statistics.median(t for t, _ in runs):.2f} s (median of"
              f" {len(runs)}: {times}); CPU {statistics.median(c for _, c in runs):.1f} s (supervisor and workers,"
              " to exit)", flush=True)


if __name__ == "__main__":
    main()
