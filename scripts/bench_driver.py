"""What the replay driver costs per step, beside the ledger write it wraps (issue 3).

    .venv/bin/python scripts/bench_driver.py [--steps N] [--repeats R] [--profile]

All in one process, on a fresh SQLite file in a temporary folder (WAL, synchronous=NORMAL):

  (a) ledger write_step   the fenced `backend.heap.write_step` alone, per call
  (b) fresh step          a no-op `ctx.run(key, fn)` that runs and is recorded, per step,
                          from N such steps in one `run_delivery`
  (c) replayed step       the same N steps replayed from their records in a new delivery
  (d) raw sqlite insert   a stdlib sqlite3 single-row INSERT in its own transaction, for scale
  (e) driver alone        (b) with `write_step` replaced by a stub that records nothing: the
                          driver's own Python work per fresh step, without SQLite

Figures are medians over the repetitions, which interleave (a)-(d) so that a noisy machine
slows them alike. The overhead is paired: each repetition times (a) just before and just after
(b), and the median of the per-repetition ratios (b) / (a) is reported. The target is that a
fresh no-op step costs under 30% more than (a).
`--profile` adds a cProfile of one fresh and one replayed delivery.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import sqlite3
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchlib import RAW_INSERT, open_raw  # noqa: E402

from supervisor import Completed, HeapRecord, Suspended, open_backend  # noqa: E402
from worker import Registry  # noqa: E402
from worker._runtime.driver import run_delivery  # noqa: E402

TARGET_OVERHEAD = 0.30
LEASE_MS = 3_600_000
RESPONSE = json.dumps({"value": None})

registry = Registry()
KEYS: list[str] = []  # made before timing, so the workflow spends nothing on naming its steps


def noop() -> None:
    return None


@registry.workflow("noops")
def noops(ctx, input):
    for key in KEYS:
        ctx.run(key, noop)
    ctx.sleep("park", 3600)  # suspend, so the same records can be replayed by a new delivery


class Bench:
    def __init__(self, folder: str, steps: int):
        self.folder = folder
        self.steps = steps
        self.backend = open_backend(os.path.join(folder, "ledger.db"))
        self.serial = 0

    def _lease(self, workflow: str):
        self.serial += 1
        execution_id = f"{workflow}-{self.serial}"
        self.backend.executions.admit(execution_id, workflow)
        [lease] = self.backend.executions.claim_due(limit=1, duration=LEASE_MS)
        assert lease.execution_id == execution_id
        return lease

    def ledger_write_step(self) -> float:
        lease = self._lease("raw")
        write = self.backend.heap.write_step
        started = time.perf_counter()
        for key in KEYS:
            write(lease, step_key=key, step_attempt=1, done=True, step_response_json=RESPONSE)
        return (time.perf_counter() - started) / self.steps

    def driver(self, profile: cProfile.Profile | None = None) -> tuple[float, float]:
        """(fresh, replayed) seconds per step."""
        executions = self.backend.executions
        lease = self._lease("noops")
        if profile:
            profile.enable()
        started = time.perf_counter()
        outcome = run_delivery(self.backend, lease, registry)
        fresh = (time.perf_counter() - started) / self.steps
        if profile:
            profile.disable()
        assert outcome == Suspended(), outcome
        assert executions.acknowledge(lease, outcome) == outcome
        executions.request_wake(lease.execution_id, self.backend.clock())
        [again] = executions.claim_due(limit=1, duration=LEASE_MS)
        assert again.execution_id == lease.execution_id and again.token == lease.token + 1
        if profile:
            profile.enable()
        started = time.perf_counter()
        outcome = run_delivery(self.backend, again, registry)
        replayed = (time.perf_counter() - started) / self.steps
        if profile:
            profile.disable()
        assert outcome == Suspended(), outcome
        assert len(self.backend.heap.steps(lease.execution_id)) == self.steps + 1
        executions.acknowledge(again, Completed("null"))
        return fresh, replayed

    def driver_alone(self) -> float:
        lease = self._lease("noops")
        heap = self.backend.heap

        def recorded(lease, *, step_key, step_attempt, done, step_response_json):
            return HeapRecord(lease.execution_id, step_key, step_attempt, done, step_response_json)

        heap.write_step = recorded  # an instance attribute, shadowing the real method
        try:
            started = time.perf_counter()
            outcome = run_delivery(self.backend, lease, registry)
            elapsed = (time.perf_counter() - started) / self.steps
        finally:
            del heap.write_step
        assert outcome == Suspended(), outcome
        self.backend.executions.acknowledge(lease, Completed("null"))
        return elapsed

    def raw_sqlite_insert(self) -> float:
        self.serial += 1
        path = os.path.join(self.folder, f"raw-{self.serial}.db")
        conn = open_raw(path)
        try:
            started = time.perf_counter()
            for key in KEYS:
                conn.execute(RAW_INSERT, ("raw", key, 0, RESPONSE))  # autocommit: one transaction each
            return (time.perf_counter() - started) / self.steps
        finally:
            conn.close()

    def close(self) -> None:
        self.backend.close()


def us(seconds: float) -> str:
    return f"{seconds * 1e6:8.1f} us"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000, help="steps per measured run (default 1000)")
    parser.add_argument("--repeats", type=int, default=21, help="repetitions; medians are reported (default 21)")
    parser.add_argument("--profile", action="store_true", help="print where a fresh and a replayed delivery spend time")
    args = parser.parse_args()
    KEYS[:] = [f"step-{i}" for i in range(args.steps)]

    samples: dict[str, list[float]] = {"ledger": [], "fresh": [], "replayed": [], "sqlite": [], "alone": []}
    ratios: list[float] = []
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="yieldstar-bench-") as folder:
        bench = Bench(folder, args.steps)
        try:
            bench.ledger_write_step()  # warm up: schema, page cache, code paths
            bench.driver()
            gc_was_enabled = gc.isenabled()
            gc.disable()
            try:
                for _ in range(args.repeats):
                    before = bench.ledger_write_step()
                    fresh, replayed = bench.driver()
                    after = bench.ledger_write_step()
                    samples["ledger"] += [before, after]
                    ratios.append(fresh / ((before + after) / 2))
                    samples["fresh"].append(fresh)
                    samples["replayed"].append(replayed)
                    samples["sqlite"].append(bench.raw_sqlite_insert())
                    samples["alone"].append(bench.driver_alone())
                    gc.collect()
            finally:
                if gc_was_enabled:
                    gc.enable()
            profile = cProfile.Profile() if args.profile else None
            if profile:
                bench.driver(profile)
        finally:
            bench.close()
    elapsed = time.perf_counter() - began

    median = {name: statistics.median(values) for name, values in samples.items()}
    spread = {name: (min(values), max(values)) for name, values in samples.items()}
    overhead = statistics.median(ratios) - 1
    print(f"yieldstar driver benchmark: {args.steps} steps x {args.repeats} repetitions, "
          f"python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, {elapsed:.1f} s")
    print("  median per step (min .. max)")
    rows = [("(a) ledger write_step", "ledger"), ("(b) driver fresh no-op step", "fresh"),
            ("(c) driver replayed step", "replayed"), ("(d) raw sqlite insert txn", "sqlite"),
            ("(e) driver alone (stub ledger)", "alone")]
    for label, name in rows:
        low, high = spread[name]
        print(f"  {label:30s} {us(median[name])}   ({low * 1e6:.1f} .. {high * 1e6:.1f})")
    print(f"  ledger write_step over raw sqlite insert: {median['ledger'] / median['sqlite'] - 1:+.0%}")
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    verdict = "PASS" if overhead < TARGET_OVERHEAD else "FAIL"
    print(f"  driver overhead on a fresh no-op step (paired median): {overhead:+.1%} of write_step"
          f" (quartiles {quartiles[0] - 1:+.0%} .. {quartiles[2] - 1:+.0%}); target < {TARGET_OVERHEAD:.0%}: {verdict}")
    if args.profile:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(18)
        print(out.getvalue())
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
