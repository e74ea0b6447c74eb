"""Benchmark: the ledger on PostgreSQL, beside the raw commit rate of the same server.

    .venv/bin/python scripts/bench_postgres.py [--workflows 1500]

Starts a throwaway cluster (supervisor/ledger/postgres/cluster.py: a Unix socket only) and prints, in
one run:
- raw: single-row INSERT transactions per second with synchronous_commit=on, from 1 client
  and from 4 client processes at once, the yardstick;
- the ledger's fenced `write_step`, `claim_due` (one execution) and `acknowledge` per second,
  one client, each beside the 1-client raw rate;
- 3-step no-op workflows per second through `yieldstar supervise --concurrency 4`, from the
  first acknowledgement to the last, beside the 4-client raw rate.

The machine is shared and noisy: compare the ratios.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psycopg  # noqa: E402

from supervisor import Completed, open_backend  # noqa: E402
from supervisor.ledger.postgres.cluster import Cluster  # noqa: E402


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


def workflow_rate(uri: str, n: int) -> float:
    with open_backend(uri) as backend:
        for i in range(n):
            backend.executions.admit(f"w{i}", "noop3")
    done = subprocess.run([sys.executable, "-m", "supervisor.cli", "--db", uri, "supervise", "worker.bench_app",
                           "--concurrency", "4", "--until-idle", "--quiet"], capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    with psycopg.connect(uri) as conn:
        first, last, count = conn.execute("SELECT min(ended_at), max(ended_at), count(*) FROM lease_history"
                                          " WHERE execution_id LIKE 'w%%' AND outcome = 'completed'").fetchone()
    assert count == n, (count, n)
    return (count - 1) / ((last - first) / 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=1500)
    parser.add_argument("--ops", type=int, default=2000)
    args = parser.parse_args()
    cluster = Cluster().start()
    try:
        raw_db = cluster.new_database()
        with psycopg.connect(raw_db, autocommit=True) as conn:
            conn.execute("CREATE TABLE raw_steps (execution_id TEXT, step_key TEXT, attempt INTEGER,"
                         " step_response_json TEXT, PRIMARY KEY (execution_id, step_key, attempt))")
        raw1 = raw_rate(raw_db, 1, args.ops)
        raw4 = raw_rate(raw_db, 4, args.ops // 2)
        ops = ledger_rates(cluster.new_database(), args.ops)
        flows = workflow_rate(cluster.new_database(), args.workflows)
    finally:
        cluster.stop()
    print(f"raw INSERT transactions/s, synchronous_commit=on: 1 client {raw1:8,.0f}   4 clients {raw4:8,.0f}")
    for name, rate in ops.items():
        print(f"{name:<14} {rate:8,.0f}/s   {raw1 / rate:4.2f}x the time of a raw insert transaction")
    print(f"3-step workflows/s, supervise --concurrency 4: {flows:8,.0f}   ({flows / raw4:.2f} of the 4-client raw rate;"
          f" {args.workflows} workflows)")


if __name__ == "__main__":
    main()
