"""Benchmark: I/O-bound workflows through one supervisor, one delivery per process or many.

    .venv/bin/python scripts/bench_io.py [--executions 500] [--runs 1]
        [--shape 'async:64' --shape 'async:500/4' ...]

Each shape is `KIND:N` (`supervise --concurrency N`, one process per delivery) or `KIND:N/P`
(`--concurrency N --workers P`); KIND is `async` (three steps each awaiting 200 ms) or `sync`
(three steps each sleeping 200 ms, on threads). For each shape it admits the executions to a
fresh SQLite ledger, runs `yieldstar supervise --until-idle` as a subprocess, and prints:

- workflows/s from the first claim to the last acknowledgement (by the ledger's clock), and from
  the exec of `supervise` to its exit (pool start-up included);
- the most resident memory (RSS) of the supervisor and all its workers together, sampled every
  50 ms; and the waits alone's bound (N / 0.6 s);
- beside the raw single-row SQLite commit rate of the same run (`benchlib.raw_commit_rate`).

With `--postgres`, each shape runs again on a throwaway PostgreSQL server
(`supervisor.chaos.cluster`, as `bench_postgres.py` starts it), in a fresh database each, and
prints besides: transactions per workflow (the database's `pg_stat_database.xact_commit` delta
over the run, divided by the workflows), and the 4-client raw single-row INSERT rate of the same
server (`bench_postgres.raw_rate`) measured just before.

The machine is shared and noisy: compare within one run, and the medians of several.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from benchlib import raw_commit_rate  # noqa: E402

from supervisor import open_backend  # noqa: E402

APP = os.path.join(HERE, "bench_io_app.py")
WORKFLOW = {"async": "io3", "sync": "io3_sync"}
STEPS, WAIT_S = 3, 0.2


def parse_shape(text: str) -> tuple[str, int, int | None]:
    kind, _, size = text.partition(":")
    n, _, p = size.partition("/")
    return kind, int(n), int(p) if p else None


def admitted(db: str, n: int, workflow: str) -> str:
    with open_backend(db) as backend:
        for i in range(n):
            backend.executions.admit(f"e{i}", workflow, "null")
    return db


def tree_rss(process: psutil.Process) -> int:
    try:
        members = [process] + process.children(recursive=True)
    except psutil.Error:
        return 0
    total = 0
    for member in members:
        try:
            total += member.memory_info().rss
        except psutil.Error:
            pass
    return total


def committed(uri: str) -> int:
    """The transactions committed in the database at `uri` so far (PostgreSQL's statistics)."""
    import psycopg

    with psycopg.connect(uri, autocommit=True) as conn:
        return conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()[0]


def run_shape(folder: str, kind: str, n: int, workers: int | None, executions: int, cluster=None) -> dict:
    if cluster is None:
        db = admitted(os.path.join(folder, f"{kind}-{n}-{workers}-{time.monotonic_ns()}.db"), executions,
                      WORKFLOW[kind])
    else:
        db = admitted(cluster.new_database(), executions, WORKFLOW[kind])
        time.sleep(1.0)  # the statistics of the admissions' sessions are flushed
        before = committed(db)
    args = [sys.executable, "-m", "supervisor.cli", "--db", db, "supervise", APP, "--concurrency", str(n),
            "--until-idle", "--quiet"]
    if workers is not None:
        args += ["--workers", str(workers)]
    started = time.monotonic()
    popen = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             cwd=folder)
    process = psutil.Process(popen.pid)
    peak = 0
    while popen.poll() is None:
        peak = max(peak, tree_rss(process))
        time.sleep(0.05)
    elapsed = time.monotonic() - started
    if popen.returncode != 0:
        raise SystemExit(f"supervise exited {popen.returncode}: {popen.stderr.read().decode()[-2000:]}")
    with open_backend(db) as backend:
        done = backend.executions.stats().by_status.get("completed", 0)
    result = {"completed": done, "exec_to_exit_per_s": done / elapsed, "peak_rss_mib": peak / 2**20}
    span = "SELECT min(claimed_at), max(ended_at) FROM lease_history"
    if cluster is None:
        import sqlite3

        conn = sqlite3.connect(db)
        first, last = conn.execute(span).fetchone()
        conn.close()
    else:
        import psycopg

        time.sleep(1.0)  # the statistics of the supervisor's sessions are flushed as they end
        result["transactions_per_workflow"] = (committed(db) - before) / max(done, 1)
        with psycopg.connect(db) as conn:
            first, last = conn.execute(span).fetchone()
    result["per_s"] = done / max(0.001, (last - first) / 1000)
    return result


def report(kind: str, n: int, workers: int | None, executions: int, results: list[dict], extra: str = "") -> None:
    shape = f"--concurrency {n}" + (f" --workers {workers}" if workers else "")
    per_s = statistics.median(r["per_s"] for r in results)
    exec_per_s = statistics.median(r["exec_to_exit_per_s"] for r in results)
    rss = statistics.median(r["peak_rss_mib"] for r in results)
    bound = n / (STEPS * WAIT_S)
    print(f"{kind:5} {shape:30} {executions} executions: {per_s:7,.0f} workflows/s claim to last ack"
          f" ({exec_per_s:,.0f}/s exec to exit; the waits allow {bound:,.0f}/s), peak RSS {rss:,.0f} MiB"
          f" (supervisor + workers){extra}", flush=True)


def postgres_runs(folder: str, shapes: list, options) -> None:
    """Each shape on a throwaway PostgreSQL server, beside its 4-client raw insert rate."""
    import psycopg

    from bench_postgres import raw_rate
    from supervisor.chaos.cluster import Cluster

    cluster = Cluster().start()
    try:
        raw_db = cluster.new_database()
        with psycopg.connect(raw_db, autocommit=True) as conn:
            conn.execute("CREATE TABLE raw_steps (execution_id TEXT, step_key TEXT, attempt INTEGER,"
                         " step_response_json TEXT, PRIMARY KEY (execution_id, step_key, attempt))")
        for kind, n, workers in shapes:
            results, raws = [], []
            for _ in range(options.runs):
                with psycopg.connect(raw_db, autocommit=True) as conn:
                    conn.execute("TRUNCATE raw_steps")
                raws.append(raw_rate(raw_db, 4, 1000))
                results.append(run_shape(folder, kind, n, workers, options.executions, cluster))
            tx = statistics.median(r["transactions_per_workflow"] for r in results)
            report(f"pg {kind}", n, workers, options.executions, results,
                   f"; {tx:.2f} transactions/workflow; raw 4-client inserts {statistics.median(raws):,.0f}/s")
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--executions", type=int, default=500)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--shape", action="append", default=None)
    parser.add_argument("--postgres", action="store_true", help="each shape on PostgreSQL too")
    parser.add_argument("--no-sqlite", action="store_true", help="with --postgres: PostgreSQL alone")
    options = parser.parse_args()
    shapes = [parse_shape(s) for s in options.shape or ["async:64", "async:500/4"]]
    with tempfile.TemporaryDirectory(prefix="bench-io-") as folder:
        if not options.no_sqlite:
            raw = raw_commit_rate(os.path.join(folder, "raw.db"))
            print(f"raw SQLite commits: {raw:,.0f}/s", flush=True)
            for kind, n, workers in shapes:
                results = [run_shape(folder, kind, n, workers, options.executions) for _ in range(options.runs)]
                report(kind, n, workers, options.executions, results)
            print(f"raw SQLite commits: {raw_commit_rate(os.path.join(folder, 'raw2.db')):,.0f}/s", flush=True)
        if options.postgres:
            postgres_runs(folder, shapes, options)


if __name__ == "__main__":
    main()
