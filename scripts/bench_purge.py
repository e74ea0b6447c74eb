"""How long one purge transaction holds the write lock, beside the raw commit rate.

Fills a fresh ledger with `--executions` completed three-step executions (each with its lease
history), then purges them all and times every write transaction of the purge (BEGIN to its
COMMIT, seen through SQLite's trace callback). Prints the median and the worst, and the raw
single-row commit rate of a file in the same folder, measured in the same run.

    .venv/bin/python scripts/bench_purge.py --executions 20000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchlib import percentile, raw_commit_rate  # noqa: E402

from supervisor import Completed, open_backend  # noqa: E402


def fill(backend, n: int) -> None:
    for i in range(n):
        backend.executions.admit(f"e{i}", "bench")
    while True:
        leases = backend.executions.claim_due(limit=500, duration=60_000)
        if not leases:
            return
        for lease in leases:
            for step in range(3):
                backend.heap.write_step(lease, step_key=f"s{step}", step_attempt=1, done=True,
                                        step_response_json='{"value": 1}')
            backend.executions.acknowledge(lease, Completed("1"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executions", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        raw = raw_commit_rate(os.path.join(folder, "raw.db"))
        with open_backend(os.path.join(folder, "ledger.db")) as backend:
            fill(backend, args.executions)
            holds, began = [], [0.0]

            def trace(sql: str) -> None:
                if sql.startswith("BEGIN IMMEDIATE"):
                    began[0] = time.perf_counter()
                elif sql.startswith("COMMIT") and began[0]:
                    holds.append(time.perf_counter() - began[0])
                    began[0] = 0.0

            backend.connection.raw.set_trace_callback(trace)
            start = time.perf_counter()
            purged = backend.executions.purge(before=backend.clock() + 1)
            total = time.perf_counter() - start
            backend.connection.raw.set_trace_callback(None)
    print(f"raw SQLite commits/s (same folder, same run): {raw:,.0f}")
    print(f"purged {purged:,} executions (3 steps + 1 lease each) in {total:.2f} s: {purged / total:,.0f}/s")
    print(f"write transactions: {len(holds)}; lock held per transaction: median {percentile(holds, 50) * 1000:.1f} ms,"
          f" p99 {percentile(holds, 99) * 1000:.1f} ms, max {max(holds) * 1000:.1f} ms"
          f" (= {max(holds) * raw:.0f} raw commits)")


if __name__ == "__main__":
    main()
