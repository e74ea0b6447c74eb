"""What the benchmarks share: the raw SQLite yardstick, and robust summaries of noisy timings."""

from __future__ import annotations

import os
import sqlite3
import statistics
import time


def raw_insert_seconds(path: str, n: int = 2000) -> float:
    """Median seconds of one plain single-row INSERT in its own transaction, with the ledger's
    pragmas (WAL, synchronous=NORMAL), through the stdlib sqlite3 module."""
    if os.path.exists(path):
        os.remove(path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k TEXT NOT NULL, v TEXT NOT NULL)")
    times = []
    for i in range(n):
        started = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (k, v) VALUES (?, ?)", (f"key-{i}", '{"value": null}'))
        conn.execute("COMMIT")
        times.append(time.perf_counter() - started)
    conn.close()
    return statistics.median(times)


def raw_commit_rate(path: str, n: int = 2000) -> float:
    """Single-row commits per second (from the median commit time)."""
    return 1.0 / raw_insert_seconds(path, n)


def percentile(values, p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]
