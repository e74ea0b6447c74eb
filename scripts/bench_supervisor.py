"""Benchmark: workflows through a supervisor and its child processes, beside raw SQLite.

    .venv/bin/python scripts/bench_supervisor.py [--quick]

Prints, in one run on this machine:
- the raw single-row SQLite commit rate (WAL, synchronous=NORMAL), the yardstick;
- workflows/s for a 3-step no-op workflow at concurrency 1, 2, 4 and 8 (first acknowledgement
  to last, so pool start-up is not counted), and each as a fraction of the raw commit rate;
- admission-to-first-step latency, p50 and p99, against an idle supervisor (woken by a nudge);
- takeover time after a supervisor is SIGKILLed mid-step (lease expiry + redelivery delay);
- parent-death-to-child-exit time, for a killed supervisor and for a frozen one (SIGSTOP);
- resident memory of the supervisor and each child after 1,000 and after 10,000 deliveries.

The machine is shared and noisy: compare the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchlib import percentile, raw_commit_rate  # noqa: E402

from supervisor import open_backend  # noqa: E402
from supervisor.dispatcher import Supervisor, SupervisorConfig  # noqa: E402

APP = "worker.bench_app"


def throughput(folder: str, concurrency: int, n: int, repetition: int = 0) -> float:
    db = os.path.join(folder, f"throughput-{concurrency}-{repetition}.db")
    with open_backend(db) as backend:
        for i in range(n):
            backend.executions.admit(f"e{i}", "noop3", "null")
    acks: list[float] = []
    supervisor = Supervisor(db, APP, SupervisorConfig(concurrency=concurrency, poll_ms=50),
                            on_delivery=lambda *_: acks.append(time.perf_counter()))
    supervisor.run(until_idle=True)
    assert supervisor.stats.completed == n, supervisor.stats
    return (len(acks) - 1) / (acks[-1] - acks[0])


def start_supervisor(db: str, *extra: str, log_path: str) -> subprocess.Popen:
    log = open(log_path, "ab")
    try:
        return subprocess.Popen([sys.executable, "-m", "supervisor.cli", "--db", db, "supervise", APP, "--quiet",
                                 *extra], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        log.close()


def wait_for(condition, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.005)
    raise TimeoutError("condition not met in time")


def admission_latency(folder: str, n: int) -> list[int]:
    """ms from admission (created_at) to the first step's record (written_at), one at a time."""
    db = os.path.join(folder, "latency.db")
    open_backend(db).close()
    sup = start_supervisor(db, "--concurrency", "2", "--poll-ms", "5000", log_path=db + ".log")
    latencies = []
    try:
        with open_backend(db) as backend:
            wait_for(lambda: psutil.Process(sup.pid).children())
            time.sleep(0.5)  # let the supervisor's first poll pass: what follows only a nudge can wake
            for i in range(n):
                record = backend.executions.admit(f"l{i}", "noop3", "null")
                first = wait_for(lambda: backend.connection.execute(
                    "SELECT min(written_at) FROM steps WHERE execution_id = ?", (f"l{i}",)).fetchone()[0])
                latencies.append(first - record.created_at)
    finally:
        sup.terminate()
        sup.wait()
    return latencies


def takeover(folder: str, lease_ms: int) -> tuple[int, float, float]:
    """Kill a supervisor mid-step: ms until another claims, and ms until its child is gone."""
    db = os.path.join(folder, "takeover.db")
    open_backend(db).close()
    options = ("--concurrency", "1", "--lease-ms", str(lease_ms), "--renew-ms", str(lease_ms // 4),
               "--heartbeat-ms", "200", "--poll-ms", "100")
    a = start_supervisor(db, *options, log_path=db + ".a.log")
    with open_backend(db) as backend:
        backend.executions.admit("slow", "sleepy", "30")
        wait_for(lambda: backend.executions.history("slow"))
        child = psutil.Process(a.pid).children()[0]
        b = start_supervisor(db, *options, log_path=db + ".b.log")
        wait_for(lambda: psutil.Process(b.pid).children())
        a.kill()
        killed_ms = backend.clock()
        killed = time.monotonic()
        wait_for(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE)
        child_gone_ms = (time.monotonic() - killed) * 1000
        second = wait_for(lambda: next((h for h in backend.executions.history("slow") if h.token == 2), None))
        b.kill()
        a.wait()
        b.wait()
    return second.claimed_at - killed_ms, child_gone_ms, frozen_parent(folder)


def frozen_parent(folder: str, heartbeat_ms: int = 200, misses: int = 3) -> float:
    """Freeze a supervisor (SIGSTOP on it alone): ms until its busy child notices and exits."""
    db = os.path.join(folder, "frozen.db")
    open_backend(db).close()
    sup = start_supervisor(db, "--concurrency", "1", "--heartbeat-ms", str(heartbeat_ms),
                           "--heartbeat-misses", str(misses), log_path=db + ".log")
    try:
        with open_backend(db) as backend:
            backend.executions.admit("slow", "sleepy", "30")
            wait_for(lambda: backend.executions.history("slow"))
            child = psutil.Process(sup.pid).children()[0]
            os.kill(sup.pid, signal.SIGSTOP)
            frozen = time.monotonic()
            wait_for(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE)
            return (time.monotonic() - frozen) * 1000
    finally:
        os.kill(sup.pid, signal.SIGCONT)
        sup.kill()
        sup.wait()


def memory(folder: str, n: int, concurrency: int = 4) -> list[tuple[int, float, list[float]]]:
    """RSS (MiB) of the supervisor and of each child after growing numbers of deliveries."""
    db = os.path.join(folder, "memory.db")
    with open_backend(db) as backend:
        for i in range(n):
            backend.executions.admit(f"m{i}", "noop3", "null")
    samples: list[tuple[int, float, list[float]]] = []
    me = psutil.Process()
    checkpoints = {1_000, n // 2, n}
    count = 0

    def sample(*_):
        nonlocal count
        count += 1
        if count in checkpoints:
            children = [c.memory_info().rss / 2**20 for c in me.children()]
            samples.append((count, me.memory_info().rss / 2**20, children))

    Supervisor(db, APP, SupervisorConfig(concurrency=concurrency, poll_ms=50), on_delivery=sample).run(until_idle=True)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer workflows, for a smoke run")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    n = 600 if args.quick else 3000
    with tempfile.TemporaryDirectory(prefix="yieldstar-bench-") as folder:
        raw = raw_commit_rate(os.path.join(folder, "raw.db"))
        print(f"raw SQLite single-row commits:        {raw:10,.0f} /s  (WAL, synchronous=NORMAL)")
        print(f"3-step no-op workflows through supervisor and children ({n} each; target >= 1,000/s):")
        for concurrency in (1, 2, 4, 8):
            rate = statistics.median(throughput(folder, concurrency, n, r) for r in range(1 if args.quick else 3))
            print(f"  concurrency {concurrency}:                     {rate:10,.0f} /s  ="
                  f" 1/{raw / rate:.0f} of the raw commit rate  {'PASS' if rate >= 1000 else 'below target'}")
        latencies = admission_latency(folder, 50 if args.quick else 200)
        print(f"admission to first step (idle supervisor, nudged): p50 {percentile(latencies, 50):.0f} ms,"
              f" p99 {percentile(latencies, 99):.0f} ms  (poll interval 5000 ms)")
        lease_ms = 2000
        takeover_ms, orphan_ms, frozen_ms = takeover(folder, lease_ms)
        print(f"takeover after a supervisor is SIGKILLed: {takeover_ms} ms  (lease {lease_ms} ms, then the"
              f" first redelivery delay of 1000 ms)")
        print(f"supervisor killed -> its busy child gone: {orphan_ms:.0f} ms  (PR_SET_PDEATHSIG)")
        print(f"supervisor frozen -> its busy child gone: {frozen_ms:.0f} ms  (heartbeat 200 ms, 3 misses allowed)")
        deliveries = 2000 if args.quick else 10_000
        samples = memory(folder, deliveries)
        for count, parent, children in samples:
            print(f"RSS after {count:6,} deliveries: supervisor {parent:6.1f} MiB, children "
                  + ", ".join(f"{c:5.1f}" for c in children) + " MiB")
        growth = samples[-1][1] - samples[0][1]
        child_growth = max(b - a for a, b in zip(samples[0][2], samples[-1][2])) if samples[0][2] else 0.0
        print(f"RSS growth from {samples[0][0]:,} to {samples[-1][0]:,} deliveries: supervisor {growth:+.1f} MiB,"
              f" largest child {child_growth:+.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
