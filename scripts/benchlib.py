"""What the benchmarks share: the raw SQLite yardstick, CPU time of processes, and robust summaries of
noisy timings."""

from __future__ import annotations

import os
import select
import sqlite3
import statistics
import subprocess
import time

import psutil


# Shaped like the ledger's `steps` table, so the yardstick writes what a fenced step write does.
RAW_TABLE = """CREATE TABLE raw_steps (execution_id TEXT NOT NULL, step_key TEXT NOT NULL,
    attempt INTEGER NOT NULL, step_response_json TEXT NOT NULL, PRIMARY KEY (execution_id, step_key, attempt))"""
RAW_INSERT = "INSERT INTO raw_steps VALUES (?, ?, ?, ?)"


def open_raw(path: str) -> sqlite3.Connection:
    """A plain stdlib sqlite3 connection with the ledger's pragmas (WAL, synchronous=NORMAL), in
    autocommit mode, with an empty `raw_steps` table: the yardstick every benchmark compares to."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA busy_timeout = 15000")
    conn.execute(RAW_TABLE)
    return conn


def raw_insert_seconds(path: str, n: int = 2000) -> float:
    """Median seconds of one plain single-row INSERT, in its own transaction."""
    if os.path.exists(path):
        os.remove(path)
    conn = open_raw(path)
    times = []
    for i in range(n):
        started = time.perf_counter()
        conn.execute(RAW_INSERT, ("raw", f"step-{i}", 0, '{"value": null}'))
        times.append(time.perf_counter() - started)
    conn.close()
    return statistics.median(times)


def raw_commit_rate(path: str, n: int = 2000) -> float:
    """Single-row commits per second (from the median commit time)."""
    return 1.0 / raw_insert_seconds(path, n)


def cpu_seconds(processes: list[psutil.Process]) -> float:
    """User and system CPU time of `processes` and of their children, living and reaped."""
    total = 0.0
    for process in processes:
        for each in [process] + process.children(recursive=True):
            try:
                times = each.cpu_times()
            except psutil.NoSuchProcess:
                continue  # gone since it was listed: its parent's reaped-children times have it
            total += times.user + times.system + times.children_user + times.children_system
    return total


def own_cpu_seconds(process: psutil.Process) -> float:
    """User and system CPU time of `process` alone."""
    times = process.cpu_times()
    return times.user + times.system


def wait_exit(process: subprocess.Popen, timeout: float) -> int:
    """`process`'s exit code, returned as soon as it exits; `process.wait(timeout)` polls with
    sleeps of up to 50 ms, which would add 25 ms on average to a timed exit. After `timeout`
    seconds, kills it and raises `subprocess.TimeoutExpired`."""
    handle = os.pidfd_open(process.pid)  # readable once the process has exited
    try:
        exited, _, _ = select.select([handle], [], [], timeout)
    finally:
        os.close(handle)
    if not exited:
        process.kill()
        process.wait()
        raise subprocess.TimeoutExpired(process.args, timeout)
    return process.wait()


def percentile(values, p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]
