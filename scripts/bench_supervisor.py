"""Benchmark: workflows through a supervisor and its child processes, beside raw SQLite.

    .venv/bin/python scripts/bench_supervisor.py [--quick]
    .venv/bin/python scripts/bench_supervisor.py --metrics [--quick]   (needs yieldstar[metrics])

Prints, in one run on this machine:
- the raw single-row SQLite commit rate (WAL, synchronous=NORMAL), the yardstick;
- workflows/s for a 3-step no-op workflow at concurrency 1, 2, 4 and 8 (first acknowledgement
  to last, so pool start-up is not counted), and each as a fraction of the raw commit rate, with
  the CPU time one workflow costs the supervisor and its children;
- 1-step workflows/s at concurrency 2 and 4, beside a peer queue's get+ack of single jobs from 2
  processes (localqueue, a SQLite queue with a Rust core), when it is installed
  (`pip install localqueue`);
- start-up: from `yieldstar supervise` (4 children) being executed to its first claim and first
  acknowledgement, and 1,500 workflows at concurrency 2 counted from the exec to the exit;
- admission-to-first-step latency, p50 and p99, against an idle supervisor (woken by a nudge);
- takeover time after a supervisor is SIGKILLed mid-step (lease expiry + redelivery delay);
- parent-death-to-child-exit time, for a killed supervisor and for a frozen one (SIGSTOP);
- resident memory of the supervisor and each child after 1,000 and after 10,000 deliveries.

With `--metrics` it prints instead what `supervise --metrics` costs: 3-step workflows/s and the
supervisor's CPU per workflow at concurrency 2 and 4, in runs with and without metrics taken in
turn (with: every delivery, step and claim observed, the server listening on a free loopback port
and scraped once a second, the ledger's gauges read on each scrape), their medians and ratios.

The machine is shared and noisy: compare the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import compileall
import logging
import multiprocessing
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

from benchlib import cpu_seconds, own_cpu_seconds, percentile, raw_commit_rate, wait_exit  # noqa: E402

from supervisor import open_backend  # noqa: E402
from supervisor.dispatcher import Supervisor, SupervisorConfig  # noqa: E402
from supervisor.pool import is_worker_command  # noqa: E402

APP = "worker.apps.bench"


def admitted(folder: str, name: str, n: int, workflow: str = "noop3", input_json: str = "null") -> str:
    """A fresh ledger holding `n` admitted executions of `workflow`, each given `input_json`."""
    db = os.path.join(folder, f"{name}.db")
    with open_backend(db) as backend:
        for i in range(n):
            backend.executions.admit(f"e{i}", workflow, input_json)
    return db


def workers(me: psutil.Process) -> list[psutil.Process]:
    return [c for c in me.children() if is_worker_command(c.cmdline())]


def throughput(folder: str, concurrency: int, n: int, repetition: int = 0,
               workflow: str = "noop3", metrics=None) -> tuple[float, float, float]:
    """Workflows/s from the first acknowledgement to the last, and the CPU ms per workflow of the
    supervisor (this process) and of its children over the same span. `metrics`: the
    `DeliveryMetrics` the supervisor reports to (None: none)."""
    db = admitted(folder, f"throughput-{workflow}-{concurrency}-{repetition}-{metrics is not None}", n, workflow)
    me = psutil.Process()
    acks: list[float] = []
    cpu: list[tuple[float, float]] = []  # (supervisor, children) CPU seconds at the first and last ack

    def acknowledged(*_) -> None:
        acks.append(time.perf_counter())
        if len(acks) in (1, n):
            cpu.append((own_cpu_seconds(me), cpu_seconds(workers(me))))

    supervisor = Supervisor(db, APP, SupervisorConfig(concurrency=concurrency, poll_ms=50), on_delivery=acknowledged,
                            metrics=metrics)
    supervisor.run(until_idle=True)
    assert supervisor.stats.completed == n and supervisor.stats.child_deaths == 0, supervisor.stats
    (mine_0, children_0), (mine_1, children_1) = cpu
    return ((len(acks) - 1) / (acks[-1] - acks[0]), (mine_1 - mine_0) / (n - 1) * 1000,
            (children_1 - children_0) / (n - 1) * 1000)


def metrics_cost(folder: str, n: int, repetitions: int) -> None:
    """Print the throughput and supervisor CPU per workflow with and without `--metrics` (see the
    module docstring), in runs taken in turn so that the machine's drift touches both alike."""
    import threading
    import urllib.request

    from supervisor.metrics_server import serve_metrics

    for concurrency in (2, 4):
        runs: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
        for r in range(repetitions):
            for with_metrics in (r % 2 == 1, r % 2 == 0):
                if not with_metrics:
                    runs[False].append(throughput(folder, concurrency, n, r))
                    continue
                db = os.path.join(folder, f"throughput-noop3-{concurrency}-{r}-True.db")
                server = serve_metrics("127.0.0.1", 0, db)
                url = "http://%s:%d/metrics" % server.address
                stop = threading.Event()

                def scrape() -> None:
                    while not stop.wait(1.0):
                        try:
                            urllib.request.urlopen(url, timeout=5).read()
                        except OSError:
                            pass

                scraper = threading.Thread(target=scrape, daemon=True)
                scraper.start()
                try:
                    runs[True].append(throughput(folder, concurrency, n, r, metrics=server.metrics))
                finally:
                    stop.set()
                    scraper.join()
                    urllib.request.urlopen(url, timeout=5).read()  # the last scrape: it serves
                    server.close()
        (rate_0, cpu_0), (rate_1, cpu_1) = [
            (statistics.median(run[0] for run in runs[m]), statistics.median(run[1] for run in runs[m]))
            for m in (False, True)]
        print(f"  concurrency {concurrency}: without {rate_0:8,.0f} /s, supervisor CPU {cpu_0:.3f} ms/workflow;"
              f" with --metrics {rate_1:8,.0f} /s, {cpu_1:.3f} ms/workflow;  rate ratio {rate_1 / rate_0:.3f},"
              f" CPU ratio {cpu_1 / cpu_0:.3f}  (each: " + ", ".join(f"{run[0]:,.0f}" for run in runs[False])
              + " / " + ", ".join(f"{run[0]:,.0f}" for run in runs[True]) + ")")


def _drain_localqueue(path: str, start, counts) -> None:
    from localqueue import Empty, SimpleQueue
    queue = SimpleQueue(path)
    counts.put("ready")
    start.wait()
    done = 0
    while True:
        try:
            job = queue.get_nowait()
        except Empty:
            break
        queue.ack(job)
        done += 1
    counts.put((done, time.perf_counter()))
    queue.close()


def localqueue_rate(folder: str, n: int, processes: int = 2) -> float | None:
    """Single jobs/s through localqueue (get + ack) from `processes` processes, or None when it
    is not installed: a peer figure, printed beside ours."""
    try:
        from localqueue import SimpleQueue
    except ImportError:
        return None
    path = os.path.join(folder, "localqueue.db")
    queue = SimpleQueue(path)
    queue.put_many([{"i": i} for i in range(n)])
    queue.close()
    context = multiprocessing.get_context("spawn")
    start, counts = context.Event(), context.Queue()
    workers = [context.Process(target=_drain_localqueue, args=(path, start, counts)) for _ in range(processes)]
    for worker in workers:
        worker.start()
    assert [counts.get(timeout=60) for _ in workers] == ["ready"] * processes  # what follows is get + ack alone
    began = time.perf_counter()
    start.set()
    results = [counts.get(timeout=300) for _ in workers]
    for worker in workers:
        worker.join()
    assert sum(done for done, _ in results) == n, results
    return n / (max(ended for _, ended in results) - began)


def start_up(folder: str, repetition: int, concurrency: int = 4, app: str = APP) -> tuple[float, float]:
    """ms from executing `yieldstar supervise` to its first claim and to its first acknowledgement
    (ledger times, read from the lease history), one execution waiting, for the workers of `app`."""
    db = admitted(folder, f"start-up-{os.path.basename(app)}-{repetition}", 1)
    began_ms = time.time() * 1000
    sup = start_supervisor(db, "--concurrency", str(concurrency), "--until-idle", log_path=db + ".log", app=app)
    assert sup.wait(60) == 0
    with open_backend(db) as backend:
        (lease,) = backend.executions.history("e0")
    return lease.claimed_at - began_ms, lease.ended_at - began_ms


def compile_bytecode() -> None:
    """Write the bytecode of the project's modules, as `pip install` (or a first import) does,
    so that start-up is measured as installed: with PYTHONDONTWRITEBYTECODE set, as on some
    development machines, every process would otherwise compile each module changed since its
    bytecode was last written."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for package in ("supervisor", "worker"):
        assert compileall.compile_dir(os.path.join(root, package), quiet=1), f"{package} did not compile"


def exec_to_exit(folder: str, n: int, concurrency: int = 2, repetition: int = 0) -> float:
    """Workflows/s of `n` workflows counted from executing `yieldstar supervise` to its exit."""
    db = admitted(folder, f"exec-to-exit-{repetition}", n)
    began = time.perf_counter()
    sup = start_supervisor(db, "--concurrency", str(concurrency), "--until-idle", log_path=db + ".log")
    assert wait_exit(sup, 600) == 0
    return n / (time.perf_counter() - began)


def start_supervisor(db: str, *extra: str, log_path: str, app: str = APP) -> subprocess.Popen:
    log = open(log_path, "ab")
    try:
        return subprocess.Popen([sys.executable, "-m", "supervisor.cli", "--db", db, "supervise", app, "--quiet",
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
            children = [c.memory_info().rss / 2**20 for c in workers(me)]
            samples.append((count, me.memory_info().rss / 2**20, children))

    Supervisor(db, APP, SupervisorConfig(concurrency=concurrency, poll_ms=50), on_delivery=sample).run(until_idle=True)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer workflows, for a smoke run")
    parser.add_argument("--metrics", action="store_true",
                        help="only compare runs with and without `supervise --metrics` (needs yieldstar[metrics])")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    n = 600 if args.quick else 3000
    if args.metrics:
        repetitions = 2 if args.quick else 6
        print(f"3-step no-op workflows with and without --metrics ({n} each, medians of {repetitions} runs"
              " taken in turn):")
        with tempfile.TemporaryDirectory(prefix="yieldstar-bench-") as folder:
            metrics_cost(folder, n, repetitions)
        return 0
    with tempfile.TemporaryDirectory(prefix="yieldstar-bench-") as folder:
        raw = raw_commit_rate(os.path.join(folder, "raw.db"))
        print(f"raw SQLite single-row commits:        {raw:10,.0f} /s  (WAL, synchronous=NORMAL)")
        repetitions = 1 if args.quick else 3
        print(f"3-step no-op workflows through supervisor and children ({n} each, median of {repetitions};"
              f" target >= 2,000/s at concurrency 4):")
        for concurrency in (1, 2, 4, 8):
            runs = sorted(throughput(folder, concurrency, n, r) for r in range(repetitions))
            rate, supervisor_ms, children_ms = runs[len(runs) // 2]
            print(f"  concurrency {concurrency}:                     {rate:10,.0f} /s  ="
                  f" 1/{raw / rate:.0f} of the raw commit rate;  CPU per workflow: supervisor"
                  f" {supervisor_ms:.2f} ms, children {children_ms:.2f} ms")
        peer = localqueue_rate(folder, n)
        print(f"1-step no-op workflows ({n} each; target: faster than localqueue's get+ack, else >= 2,500/s):")
        for concurrency in (2, 4):
            rate = statistics.median(throughput(folder, concurrency, n, r, "echo1")[0] for r in range(repetitions))
            print(f"  concurrency {concurrency}:                     {rate:10,.0f} /s")
        print(f"  localqueue get+ack, 2 processes:   {peer:10,.0f} /s" if peer is not None else
              "  localqueue: not installed (pip install localqueue to print its get+ack rate beside these)")
        compile_bytecode()
        print("(the start-up figures below run with the project's bytecode written first, as an installed package"
              " has it)")
        starts = [start_up(folder, r) for r in range(5)]
        print(f"start-up, exec to first claim / first acknowledgement (4 children, median of 5):"
              f" {statistics.median(c for c, _ in starts):.0f} / {statistics.median(a for _, a in starts):.0f} ms"
              f"  (target: first claim within 500 ms)")
        wholes = [exec_to_exit(folder, 1500, repetition=r) for r in range(repetitions)]
        print(f"1,500 3-step workflows at concurrency 2, exec to exit (median of {repetitions}):"
              f" {statistics.median(wholes):10,.0f} /s  (target >= 1,500/s; each: "
              + ", ".join(f"{w:,.0f}" for w in wholes) + ")")
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
