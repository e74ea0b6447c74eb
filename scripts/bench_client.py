"""Benchmark: the application client's round trip, beside the raw SQLite commit rate.

    .venv/bin/python scripts/bench_client.py [--runs 200]

Prints, in one run on this machine:
- the raw single-row SQLite commit rate (WAL, synchronous=NORMAL), the yardstick;
- latency from `client.start` to `handle.result()` returning, for a 1-step workflow against an
  idle supervisor (concurrency 2), one at a time: p50, p99 and the worst, sync and async;
- the CPU time a waiting `result()` costs the client process per second of waiting (the
  client's listening thread sleeps until an announcement or its slow poll);
- send to wake (SPEC section 14): from just before `handle.send` to the step a workflow suspended
  in `ctx.recv` runs once it took the message, one send at a time, each once the workflow is
  suspended again; beside it, `result()`'s wake: from an execution's last step to `result()`
  returning. p50 and p99 on SQLite and, with `--postgres`, on a throwaway PostgreSQL cluster
  (beside its raw single-row commit rate).

The machine is shared and noisy: compare medians and ratios, not single times.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_supervisor import start_supervisor, wait_for  # noqa: E402
from benchlib import percentile, raw_commit_rate  # noqa: E402

from worker import AsyncClient, Client  # noqa: E402


def warm_up(client: Client) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            client.start("echo1", "warm").result(timeout=1)
            return
        except TimeoutError:
            continue
    raise TimeoutError("the supervisor did not start")


def sync_latencies(client: Client, runs: int) -> list[float]:
    times = []
    for i in range(runs):
        started = time.perf_counter()
        assert client.start("echo1", i).result(timeout=30) == i
        times.append((time.perf_counter() - started) * 1000)
    return times


async def async_latencies(db: str, runs: int) -> list[float]:
    times = []
    async with AsyncClient(db) as client:
        for i in range(runs):
            started = time.perf_counter()
            handle = await client.start("echo1", i)
            assert await handle.result(timeout=30) == i
            times.append((time.perf_counter() - started) * 1000)
    return times


def waiting_cpu(client: Client, seconds: float) -> float:
    """CPU seconds per second of this process while one result() waits for a workflow that
    sleeps longer than the wait (a step of `sleepy`, running in a worker)."""
    before_cpu, before = time.process_time(), time.perf_counter()
    try:
        client.start("sleepy", seconds * 3).result(timeout=seconds)
    except TimeoutError:
        pass
    return (time.process_time() - before_cpu) / (time.perf_counter() - before)


def suspended(client: Client, execution_id: str) -> bool:
    return client.backend.executions.get(execution_id).status == "suspended"


def wake_latencies(client: Client, runs: int) -> tuple[list[float], list[float]]:
    """ms from a send to the step after `recv` (`inbox`), and from a last step to `result()`
    returning (`stamp`), `runs` of each, one at a time; wall clocks of one host."""
    sends = []
    for i in range(runs):
        # A new execution each time: the wake of one that waits for its first message (an
        # approval, a webhook), not of one whose replay grows with the messages it took.
        handle = client.start("inbox", 1)
        wait_for(lambda: suspended(client, handle.execution_id))
        sent_ns = time.time_ns()
        handle.send(i)
        woke_ns = handle.get_event("woke-0", timeout=30)
        if woke_ns is None:
            raise TimeoutError(f"message {i} did not wake the workflow within 30 s")
        sends.append((woke_ns - sent_ns) / 1e6)
        assert handle.result(timeout=30) == 1
    results = []
    for _ in range(runs):
        stamped = client.start("stamp").result(timeout=30)
        results.append((time.time_ns() - stamped) / 1e6)
    return sends, results


def postgres_wakes(runs: int, folder: str) -> tuple[float, list[float], list[float]]:
    """`wake_latencies` on a throwaway PostgreSQL cluster, and its raw single-row commit rate."""
    from bench_postgres import raw_database, raw_rate

    from supervisor.chaos.cluster import Cluster

    cluster = Cluster().start()
    try:
        raw = raw_rate(raw_database(cluster), 1, 2000)
        uri = cluster.new_database()
        supervisor = start_supervisor(uri, "--concurrency", "2", log_path=os.path.join(folder, "pg-supervisor.log"))
        try:
            with Client(uri) as client:
                warm_up(client)
                sends, results = wake_latencies(client, runs)
        finally:
            supervisor.send_signal(signal.SIGTERM)
            supervisor.wait(30)
    finally:
        cluster.stop()
    return raw, sends, results


def line(name: str, times: list[float]) -> str:
    return (f"{name:<40} p50 {statistics.median(times):6.2f} ms   p99 {percentile(times, 99):6.2f} ms"
            f"   max {max(times):6.2f} ms   ({len(times)} runs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--wait-seconds", type=float, default=5.0)
    parser.add_argument("--postgres", action="store_true", help="send to wake on a throwaway PostgreSQL cluster too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        raw = raw_commit_rate(os.path.join(folder, "raw.db"))
        db = os.path.join(folder, "ledger.db")
        supervisor = start_supervisor(db, "--concurrency", "2", log_path=os.path.join(folder, "supervisor.log"))
        try:
            with Client(db) as client:
                warm_up(client)
                sync = sync_latencies(client, args.runs)
                asynchronous = asyncio.run(async_latencies(db, args.runs))
                cpu = waiting_cpu(client, args.wait_seconds)
                sends, results = wake_latencies(client, args.runs)
        finally:
            supervisor.send_signal(signal.SIGTERM)
            supervisor.wait(30)
        if args.postgres:
            pg_raw, pg_sends, pg_results = postgres_wakes(args.runs, folder)
    print(f"{'raw SQLite commits/s':<40}{raw:10,.0f}   (one commit: {1000 / raw:.3f} ms)")
    print(line("start -> result(), Client", sync))
    print(line("start -> result(), AsyncClient", asynchronous))
    print(f"{'a waiting result() costs':<40}{cpu * 100:9.3f} % of one core")
    print(line("send -> recv's next step", sends))
    print(line("last step -> result()", results))
    if args.postgres:
        print(f"{'raw PostgreSQL commits/s':<40}{pg_raw:10,.0f}   (one commit: {1000 / pg_raw:.3f} ms)")
        print(line("PostgreSQL: send -> recv's next step", pg_sends))
        print(line("PostgreSQL: last step -> result()", pg_results))


if __name__ == "__main__":
    main()
