"""How long `yieldstar check APP` takes for a ledger of suspended executions (SPEC section 11).

Fills a fresh ledger with `--executions` executions of a sync workflow and as many of an async
one, each suspended at a one-hour timer after one recorded step, then runs `yieldstar check`
(as a user does: its own process, which imports the app) twice: against the app that recorded
them (every execution replays to its first unrecorded step) and against one whose first step is
renamed (every execution diverges). Prints each run's seconds and per-execution cost, beside
the raw single-row commit rate of the same backend measured in the same run (SQLite: a file in
the same folder; PostgreSQL, with `--postgres`: 4 clients on the same throwaway server).

    .venv/bin/python scripts/bench_check.py --executions 10000 [--postgres]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib import raw_commit_rate  # noqa: E402

from supervisor import Suspended, open_backend  # noqa: E402
from supervisor.ledger.values import StepWrite  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APP = """
from worker import Registry

registry = Registry()


@registry.workflow("orders")
def orders(ctx, input):
    ctx.run({first!r}, lambda: input)
    ctx.sleep("cool-off", 3600)
    return ctx.run("ship", lambda: "shipped")


@registry.workflow("refunds")
async def refunds(ctx, input):
    await ctx.run({first!r}, lambda: input)
    await ctx.sleep("cool-off", 3600)
    return await ctx.run("pay", lambda: "paid")
"""
BATCH = 500


def fill(db: str, n: int) -> None:
    """n executions of each workflow, each with its first step and its timer recorded and
    suspended, as a delivery of the app would leave them (written through the ledger's API)."""
    with open_backend(db) as backend:
        ex, heap = backend.executions, backend.heap
        for workflow in ("orders", "refunds"):
            for i in range(n):
                ex.admit(f"{workflow}-{i}", workflow, "{}")
        far = backend.clock() + 3_600_000
        while True:
            leases = ex.claim_due(limit=BATCH, duration=600_000)
            if not leases:
                break
            heap.write_steps([StepWrite(lease, "reserve", 1, True, '{"value": {}}') for lease in leases]
                             + [StepWrite(lease, "cool-off", 1, True, f'{{"until": {far}}}') for lease in leases])
            for lease in leases:
                ex.request_wake(lease.execution_id, far)
            ex.acknowledge_and_claim([(lease, Suspended()) for lease in leases], limit=0, duration=1)


def check(db: str, app: str) -> tuple[float, int]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "supervisor.cli", "--db", db, "check", app],
                          capture_output=True, text=True, cwd=ROOT, timeout=3600)
    seconds = time.perf_counter() - started
    assert done.returncode in (0, 1), done.stderr
    return seconds, done.returncode


def run(db: str, folder: str, n: int, raw: str) -> None:
    fill(db, n)
    apps = {}
    for name, first in (("same", "reserve"), ("renamed", "reserve-v2")):
        apps[name] = os.path.join(folder, f"bench_check_{name}.py")
        with open(apps[name], "w") as f:
            f.write(textwrap.dedent(APP.format(first=first)))
    for name, app in apps.items():
        seconds, code = check(db, app)
        verdict = "none would diverge" if code == 0 else "all would diverge"
        print(f"  check, code {name:8} {2 * n:,} suspended executions (half async): {seconds:6.2f} s,"
              f" {seconds / (2 * n) * 1e6:,.0f} µs each ({verdict}); {raw}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--executions", type=int, default=10_000, help="executions of each of the two workflows"
                        " (sync and async)")
    parser.add_argument("--postgres", action="store_true", help="on a throwaway PostgreSQL server too")
    options = parser.parse_args()
    n = options.executions // 2
    with tempfile.TemporaryDirectory() as folder:
        raw = f"raw SQLite single-row commits {raw_commit_rate(os.path.join(folder, 'raw.db')):,.0f}/s"
        print("SQLite")
        run(os.path.join(folder, "ledger.db"), folder, n, raw)
        if options.postgres:
            from bench_postgres import raw_database, raw_rate
            from supervisor.chaos.cluster import Cluster

            cluster = Cluster().start()
            try:
                raw = f"raw 4-client inserts {raw_rate(raw_database(cluster), 4, 1000):,.0f}/s"
                print("PostgreSQL")
                run(cluster.new_database(), folder, n, raw)
            finally:
                cluster.stop()


if __name__ == "__main__":
    main()
