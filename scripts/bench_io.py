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

When DBOS is installed (`pip install dbos`), the same executions run once more per run in DBOS
Transact, between the two raw SQLite rates: an async workflow of three async `@DBOS.step()`s each
awaiting 200 ms, its system database on SQLite in the same temporary folder, all the executions
started at once (`DBOS.start_workflow_async`) and their results awaited together. DBOS runs in
its own process (`--dbos-child`), so that its imports and threads stay out of this one; the line
gives workflows/s from the first start to the last result (that process's clock) and from the
exec of the process to its exit, and the peak RSS of that process, sampled as the supervisor's.

With `--postgres`, each shape runs again on a throwaway PostgreSQL server
(`supervisor.chaos.cluster`, as `bench_postgres.py` starts it), in a fresh database each, and
prints besides: transactions per workflow (the database's `pg_stat_database.xact_commit` delta
over the run, divided by the workflows), and the 4-client raw single-row INSERT rate of the same
server (`bench_postgres.raw_rate`) measured just before.

The machine is shared and noisy: compare within one run, and the medians of several.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
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


def watched(args: list[str], cwd: str) -> tuple[int, float, int, str, str]:
    """Run `args` to its exit, sampling the resident memory of its process tree every 50 ms:
    (exit code, seconds from exec to exit, peak RSS in bytes, its stdout, its stderr)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.monotonic()
        popen = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=cwd)
        process = psutil.Process(popen.pid)
        peak = 0
        while popen.poll() is None:
            peak = max(peak, tree_rss(process))
            time.sleep(0.05)
        elapsed = time.monotonic() - started
        out.seek(0)
        err.seek(0)
        return popen.returncode, elapsed, peak, out.read().decode(errors="replace"), err.read().decode(errors="replace")


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
    code, elapsed, peak, _, err = watched(args, folder)
    if code != 0:
        raise SystemExit(f"supervise exited {code}: {err[-2000:]}")
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


def dbos_child(executions: int, folder: str) -> None:
    """`--dbos-child`: the workload in DBOS, in this process; prints one JSON line of its figures."""
    import asyncio
    from importlib.metadata import version

    from dbos import DBOS, DBOSConfig

    DBOS(config=DBOSConfig(name="bench-io", system_database_url=f"sqlite:///{os.path.join(folder, 'dbos.sqlite')}",
                           run_admin_server=False, log_level="WARNING"))

    @DBOS.step()
    async def wait(step: int) -> int:
        await asyncio.sleep(WAIT_S)
        return step

    @DBOS.workflow()
    async def io3() -> None:
        for step in range(STEPS):
            await wait(step)

    DBOS.launch()

    async def run() -> tuple[int, float]:
        started = time.monotonic()
        handles = await asyncio.gather(*(DBOS.start_workflow_async(io3) for _ in range(executions)))
        results = await asyncio.gather(*(handle.get_result() for handle in handles), return_exceptions=True)
        return sum(not isinstance(r, BaseException) for r in results), time.monotonic() - started

    try:
        done, elapsed = asyncio.run(run())
    finally:
        DBOS.destroy()
    print(json.dumps({"completed": done, "seconds": elapsed, "version": version("dbos")}), flush=True)


def run_dbos(folder: str, executions: int) -> dict:
    """One run of `dbos_child` in a process of its own, its resident memory sampled from here."""
    child = tempfile.mkdtemp(prefix="dbos-", dir=folder)
    code, elapsed, peak, out, err = watched(
        [sys.executable, os.path.abspath(__file__), "--dbos-child", child, "--executions", str(executions)], child)
    if code != 0:
        raise SystemExit(f"the DBOS run exited {code}: {err[-2000:]}")
    figures = json.loads(out.strip().splitlines()[-1])
    done = figures["completed"]
    return {"completed": done, "per_s": done / figures["seconds"], "exec_to_exit_per_s": done / elapsed,
            "peak_rss_mib": peak / 2**20, "version": figures["version"]}


def report_dbos(executions: int, results: list[dict]) -> None:
    per_s = statistics.median(r["per_s"] for r in results)
    exec_per_s = statistics.median(r["exec_to_exit_per_s"] for r in results)
    rss = statistics.median(r["peak_rss_mib"] for r in results)
    done = min(r["completed"] for r in results)
    shape = f"DBOS {results[0]['version']}, all at once"
    failed = f"; only {done} of {executions} completed" if done < executions else ""
    print(f"dbos  {shape:30} {executions} executions: {per_s:7,.0f} workflows/s first start to last result"
          f" ({exec_per_s:,.0f}/s exec to exit; the waits allow {executions / (STEPS * WAIT_S):,.0f}/s),"
          f" peak RSS {rss:,.0f} MiB (its one process){failed}", flush=True)


def postgres_runs(folder: str, shapes: list, options) -> None:
    """Each shape on a throwaway PostgreSQL server, beside its 4-client raw insert rate."""
    import psycopg

    from bench_postgres import raw_database, raw_rate
    from supervisor.chaos.cluster import Cluster

    cluster = Cluster().start()
    try:
        raw_db = raw_database(cluster)
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
    parser.add_argument("--dbos-child", metavar="FOLDER", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.dbos_child:
        dbos_child(options.executions, options.dbos_child)
        return
    shapes = [parse_shape(s) for s in options.shape or ["async:64", "async:500/4"]]
    with tempfile.TemporaryDirectory(prefix="bench-io-") as folder:
        if not options.no_sqlite:
            raw = raw_commit_rate(os.path.join(folder, "raw.db"))
            print(f"raw SQLite commits: {raw:,.0f}/s", flush=True)
            for kind, n, workers in shapes:
                results = [run_shape(folder, kind, n, workers, options.executions) for _ in range(options.runs)]
                report(kind, n, workers, options.executions, results)
            if importlib.util.find_spec("dbos") is not None:
                report_dbos(options.executions, [run_dbos(folder, options.executions) for _ in range(options.runs)])
            else:
                print("dbos: not installed (pip install dbos to print DBOS on the same workload beside these)",
                      flush=True)
            print(f"raw SQLite commits: {raw_commit_rate(os.path.join(folder, 'raw2.db')):,.0f}/s", flush=True)
        if options.postgres:
            postgres_runs(folder, shapes, options)


if __name__ == "__main__":
    main()
