"""Benchmark: the ledger on PostgreSQL, beside the raw commit rate of the same server.

    .venv/bin/python scripts/bench_postgres.py [--workflows 1500]

Starts a throwaway cluster (supervisor/chaos/cluster.py: a Unix socket only) and prints, in
one run:
- raw: single-row INSERT transactions per second with synchronous_commit=on, from 1 client
  and from 4 client processes at once, the yardstick (the 4-client one measured again beside
  each workflow run);
- the ledger's fenced `write_step`, `claim_due` (one execution) and `acknowledge` per second,
  one client, each beside the 1-client raw rate;
- 3-step no-op workflows per second through `yieldstar supervise --concurrency 4`, from the
  first acknowledgement to the last, each run beside a 4-client raw run made just before it
  (the median ratio of `--repeats` pairs), and from 1, 2 and 3 such supervisors at once; with
  the CPU time each costs per workflow, on the server, in the supervisors and in their workers
  (from 10% to 90% of the workflows done: a figure that the machine's other work moves less
  than it moves the rates);
- `claim_due`'s cost against the history: claims with 1k and with 100k completed executions in
  the database (copies of one the ledger produced, with its lease history), alternately, so the
  claim's cost is shown not to grow with the terminal rows.

The machine is shared and noisy: compare the ratios.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psutil  # noqa: E402
import psycopg  # noqa: E402

from benchlib import cpu_seconds, own_cpu_seconds  # noqa: E402

from supervisor import Completed, open_backend  # noqa: E402
from supervisor.chaos.cluster import Cluster  # noqa: E402


def raw_inserts(uri: str, n: int, tag: str) -> float:
    """Seconds for `n` single-row INSERT transactions, each committed with synchronous_commit=on."""
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        started = time.perf_counter()
        for i in range(n):
            conn.execute("INSERT INTO raw_steps VALUES (%s, %s, 0, '{\"value\": null}')", (tag, f"step-{i}"))
        return time.perf_counter() - started


def _raw_client(uri: str, n: int, tag: str, out) -> None:
    out.put(raw_inserts(uri, n, tag))


def raw_database(cluster) -> str:
    """A new database of `cluster` with the table the raw inserts write to; its URI."""
    uri = cluster.new_database()
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("CREATE TABLE raw_steps (execution_id TEXT, step_key TEXT, attempt INTEGER,"
                     " step_response_json TEXT, PRIMARY KEY (execution_id, step_key, attempt))")
    return uri


def raw_rate(uri: str, clients: int, n: int) -> float:
    if clients == 1:
        return n / raw_inserts(uri, n, "one")
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    workers = [ctx.Process(target=_raw_client, args=(uri, n, f"c{i}", out)) for i in range(clients)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return clients * n / (time.perf_counter() - started)


def ledger_rates(uri: str, n: int) -> dict:
    with open_backend(uri) as backend:
        for i in range(n):
            backend.executions.admit(f"e{i}", "bench")
        started = time.perf_counter()
        leases = [backend.executions.claim_due(limit=1, duration=600_000)[0] for _ in range(n)]
        claims = n / (time.perf_counter() - started)
        started = time.perf_counter()
        for lease in leases:
            backend.heap.write_step(lease, step_key="s", step_attempt=1, done=True, step_response_json='{"value": 1}')
        writes = n / (time.perf_counter() - started)
        started = time.perf_counter()
        for lease in leases:
            backend.executions.acknowledge(lease, Completed("1"))
        acks = n / (time.perf_counter() - started)
    return {"write_step": writes, "claim_due": claims, "acknowledge": acks}


class CpuMeter:
    """CPU milliseconds per workflow of the server, the supervisors and their workers, between
    the moments 10% and 90% of the workflows had completed: the steady state, without the
    processes' start (imports, connections) or their end."""

    def __init__(self, cluster: Cluster, uri: str, n: int):
        with open(os.path.join(cluster.data, "postmaster.pid")) as pidfile:
            self.server = psutil.Process(int(pidfile.readline()))
        self.uri, self.n = uri, n
        self.marks: list[tuple[int, float, float, float]] = []  # (completed, server, supervisors, workers)

    def watch(self, running: list[subprocess.Popen]) -> None:
        """Until the supervisors exit: note the CPU times when 10% and when 90% had completed."""
        supervisors = [psutil.Process(process.pid) for process in running]
        thresholds = [self.n // 10, self.n * 9 // 10]
        with psycopg.connect(self.uri, autocommit=True) as conn:
            while thresholds and any(process.poll() is None for process in running):
                done = conn.execute("SELECT count(*) FROM executions WHERE status = 'completed'").fetchone()[0]
                if done >= thresholds[0]:
                    thresholds.pop(0)
                    own = sum(own_cpu_seconds(p) for p in supervisors)
                    self.marks.append((done, cpu_seconds([self.server]), own, cpu_seconds(supervisors) - own))
                time.sleep(0.05)

    def per_workflow(self) -> Optional[dict]:
        if len(self.marks) < 2:
            return None  # over before both marks: too few workflows to tell
        (done0, *start), (done1, *end) = self.marks
        return {side: (b - a) * 1000 / (done1 - done0)
                for side, a, b in zip(("server", "supervisor", "workers"), start, end)}


def workflow_rate(cluster: Cluster, n: int, supervisors: int = 1) -> tuple[float, Optional[dict]]:
    """3-step workflows per second through `supervisors` supervisors of 4 workers each, from the
    first acknowledgement to the last, and the CPU they cost (`CpuMeter`)."""
    uri = cluster.new_database()
    with open_backend(uri) as backend:
        for i in range(n):
            backend.executions.admit(f"w{i}", "noop3")
    command = [sys.executable, "-m", "supervisor.cli", "--db", uri, "supervise", "worker.apps.bench", "--concurrency",
               "4", "--until-idle", "--quiet"]
    meter = CpuMeter(cluster, uri, n)
    with tempfile.TemporaryFile("w+") as errors:  # a pipe nobody reads could fill and stop a supervisor
        running = [subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors, stdin=subprocess.DEVNULL)
                   for _ in range(supervisors)]
        meter.watch(running)
        for process in running:
            if process.wait(timeout=600) != 0:
                errors.seek(0)
                raise RuntimeError(errors.read())
    with psycopg.connect(uri) as conn:
        first, last, count = conn.execute("SELECT min(ended_at), max(ended_at), count(*) FROM lease_history"
                                          " WHERE execution_id LIKE 'w%%' AND outcome = 'completed'").fetchone()
    assert count == n, (count, n)
    return (count - 1) / ((last - first) / 1000), meter.per_workflow()


def add_completed(uri: str, count: int) -> None:
    """`count` completed executions, each with its lease history: copies of one the ledger made."""
    with open_backend(uri) as backend:
        backend.executions.admit("template", "bench")
        (lease,) = backend.executions.claim_due(limit=1, duration=600_000)
        backend.executions.acknowledge(lease, Completed("1"))
    with psycopg.connect(uri, autocommit=True) as conn:
        for table in ("executions", "lease_history"):
            columns = [name for (name,) in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s AND table_schema ="
                " current_schema() ORDER BY ordinal_position", (table,)).fetchall()]
            chosen = ", ".join("'done-' || g" if c == "execution_id" else c for c in columns)
            conn.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT {chosen} FROM {table},"
                         f" generate_series(1, %s) g WHERE execution_id = 'template'", (count,))
        conn.execute("ANALYZE")


def claim_scaling(cluster: Cluster, small: int, large: int, n: int, repeats: int = 5) -> tuple[float, float]:
    """The median time of one claim (limit=1, one of `n` due executions) with `small` and with
    `large` completed executions in the database, measured alternately."""
    uris = {}
    for size in (small, large):
        uris[size] = cluster.new_database()
        add_completed(uris[size], size)
    times: dict[int, list[float]] = {small: [], large: []}
    for repeat in range(repeats):
        for size, uri in uris.items():
            with open_backend(uri) as backend:
                for i in range(n):
                    backend.executions.admit(f"due-{repeat}-{i}", "bench")
                started = time.perf_counter()
                for _ in range(n):
                    backend.executions.claim_due(limit=1, duration=600_000)
                times[size].append((time.perf_counter() - started) / n)
    return statistics.median(times[small]), statistics.median(times[large])


def cpu_line(cpu: Optional[dict]) -> str:
    if cpu is None:
        return "CPU per workflow: too few workflows to tell"
    return ("CPU ms per workflow: server {server:.2f}, supervisors {supervisor:.2f}, workers {workers:.2f}"
            " (total {total:.2f})".format(total=sum(cpu.values()), **cpu))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=1500)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3, help="paired raw and workflow runs, for the median ratio")
    parser.add_argument("--terminal", type=int, default=100_000, help="completed executions for the claim scaling")
    args = parser.parse_args()
    cluster = Cluster().start()
    try:
        raw_db = raw_database(cluster)

        def raw4() -> float:
            with psycopg.connect(raw_db, autocommit=True) as conn:
                conn.execute("TRUNCATE raw_steps")
            return raw_rate(raw_db, 4, args.ops // 2)

        raw1 = raw_rate(raw_db, 1, args.ops)
        ops = ledger_rates(cluster.new_database(), args.ops)
        # Each workflow run beside a raw run just before it: the machine's speed drifts.
        paired = [(raw4(), *workflow_rate(cluster, args.workflows)) for _ in range(args.repeats)]
        fleets = [(raw4(), *workflow_rate(cluster, args.workflows, k)) for k in (1, 2, 3)]
        small, large = claim_scaling(cluster, 1_000, args.terminal, 200)
    finally:
        cluster.stop()
    print(f"raw INSERT transactions/s, synchronous_commit=on, 1 client: {raw1:8,.0f}")
    for name, rate in ops.items():
        print(f"{name:<14} {rate:8,.0f}/s   {raw1 / rate:4.2f}x the time of a raw insert transaction")
    print(f"3-step workflows/s, supervise --concurrency 4 ({args.workflows} workflows), each beside the 4-client raw rate"
          " measured just before it:")
    for raw, flows, cpu in paired:
        print(f"  {flows:8,.0f}/s   raw {raw:8,.0f}/s   {flows / raw:.2f} of it   {cpu_line(cpu)}")
    print(f"  median: {statistics.median(f / r for r, f, _ in paired):.2f} of the 4-client raw rate")
    print("3-step workflows/s from several supervisors of 4 workers each on the one server:")
    for k, (raw, flows, cpu) in enumerate(fleets, start=1):
        print(f"  {k} supervisor{'s' if k > 1 else ' '}  {flows:8,.0f}/s   raw {raw:8,.0f}/s   {flows / raw:.2f} of it"
              f"   {cpu_line(cpu)}")
    print(f"claim_due with 1,000 completed executions {small * 1e6:7.0f} us, with {args.terminal:,}"
          f" {large * 1e6:7.0f} us: {large / small:.2f}x")


if __name__ == "__main__":
    main()
