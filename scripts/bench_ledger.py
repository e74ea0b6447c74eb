"""What the ledger's calls cost, beside a plain SQLite commit.

    .venv/bin/python scripts/bench_ledger.py [--n N] [--repeats R] [--terminal T]

On one fresh SQLite file in a temporary folder, in one process, with the ledger's pragmas
(WAL, synchronous=NORMAL):

  raw insert     a plain single-row INSERT in its own transaction through the stdlib sqlite3
                 module, into a table shaped like `steps` (a text key of three columns and a
                 JSON text), on its own connection to the same file
  claim_due      one execution claimed per call (limit=1) from a backlog of due ones
  claim routed   the same with workflows={"bench"} (routing: a supervisor's claim of the
                 workflows its app registers)
  renew          one renewal of a live lease
  write_step     one fenced step write (token check and insert in one statement)
  acknowledge    one Completed acknowledgement

Each repetition times N calls of each kind, each call alternating with one timed raw insert, so
that a noisy, shared machine slows both alike. "per call" is the median over repetitions of the
per-call median; the ratios ("x raw rate" = calls/s over raw commits/s, "x raw cost" = its
inverse) are medians over repetitions of the paired ratio. The target (the fencing issue's): a
fenced write_step costs no more than 1.5x a plain single-row insert transaction.

Then claim_due's cost against the history: the same claims with 1k and with 100k completed
executions, in two more fresh files measured alternately. The completed rows are copies of a
row the ledger itself produced (admitted, claimed, acknowledged), with its lease history,
inserted in one transaction. An empty poll (claim_due with nothing due) is timed too, since
that is what an idle dispatcher repeats. Then a routed claim's cost against the due executions of
a workflow it does not serve: with none and with 100k of them waiting (nobody serves them), in two
more fresh files measured alternately. Last, for scale and without a target, claim_due's cost
while 0, 1k and 10k other executions hold live leases.

Exits 1 when the write_step target is missed.
"""

from __future__ import annotations

import argparse
import gc
import os
import sqlite3
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchlib import RAW_INSERT, open_raw  # noqa: E402

from supervisor import Completed, open_backend  # noqa: E402

TARGET_RATIO = 1.5
LEASE_MS = 3_600_000
RESPONSE = '{"value": null}'


def per_call(fn, items) -> float:
    """Median seconds of `fn(item)` over `items`."""
    times = []
    for item in items:
        started = time.perf_counter()
        fn(item)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


class Round:
    """One repetition: N fresh executions taken through claim, renew, write_step, acknowledge,
    each call paired with a raw insert timed just before it."""

    KINDS = ("claim_due", "claim routed", "renew", "write_step", "acknowledge")
    SERVED = frozenset({"bench"})

    def __init__(self, backend, raw, tag: str, n: int):
        self.backend, self.raw, self.tag, self.n = backend, raw, tag, n
        self.counter = 0

    def raw_insert(self):
        self.counter += 1
        self.raw.execute(RAW_INSERT,
                         (f"{self.tag}-raw", f"step-{self.counter}", 0, RESPONSE))

    def run(self, batch: int = 100) -> dict[str, tuple[float, float]]:
        """{kind: (median seconds per call, median seconds per paired raw insert)}.

        Executions go through in batches, so that at most `batch` leases are live at once
        (claim_due's cost grows with the live leases of others; see `live_leases`).
        """
        ex, heap = self.backend.executions, self.backend.heap
        times: dict[str, tuple[list, list]] = {kind: ([], []) for kind in self.KINDS}

        def timed(kind, fn, items):
            mine, base = times[kind]
            for item in items:
                started = time.perf_counter()
                self.raw_insert()
                base.append(time.perf_counter() - started)
                started = time.perf_counter()
                fn(item)
                mine.append(time.perf_counter() - started)

        for first in range(0, self.n, batch):
            for i in range(first, min(first + batch, self.n)):
                ex.admit(f"{self.tag}-{i}", "bench")
                ex.admit(f"{self.tag}-routed-{i}", "bench")
            leases, routed, replies = [], [], []
            gc.collect()
            gc.disable()
            try:
                timed("claim_due", lambda _: leases.extend(ex.claim_due(limit=1, duration=LEASE_MS)),
                      range(first, min(first + batch, self.n)))
                timed("claim routed", lambda _: routed.extend(
                    ex.claim_due(limit=1, duration=LEASE_MS, workflows=self.SERVED)),
                      range(first, min(first + batch, self.n)))
                timed("renew", lambda lease: replies.append(ex.renew(lease, duration=LEASE_MS)), leases)
                timed("write_step", lambda lease: replies.append(heap.write_step(
                    lease, step_key="charge", step_attempt=0, done=True, step_response_json=RESPONSE)), leases)
                timed("acknowledge", lambda lease: replies.append(ex.acknowledge(lease, Completed("null"))), leases)
            finally:
                gc.enable()
            for lease in routed:
                ex.acknowledge(lease, Completed("null"))
            # Every call timed did its work (none was refused as a lost lease).
            assert len(leases) == len(routed) == min(batch, self.n - first)
            assert [r.status for r in replies] == (["renewed"] * len(leases) + ["written"] * len(leases)
                                                    + ["completed"] * len(leases)), replies
        return {kind: (statistics.median(mine), statistics.median(base)) for kind, (mine, base) in times.items()}


def add_completed(path: str, template_id: str, first: int, count: int) -> None:
    """Copy the ledger-made completed execution `template_id` (row and lease history) `count` times."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 15000")
    columns = [row[1] for row in conn.execute("PRAGMA table_info(executions)")]
    history_columns = [row[1] for row in conn.execute("PRAGMA table_info(lease_history)")]

    def copy(table, cols):
        select = ", ".join("'done-' || n.i" if c == "execution_id" else f"t.{c}" for c in cols)
        conn.execute(f"""
            WITH RECURSIVE n(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM n WHERE i < ?)
            INSERT INTO {table} ({", ".join(cols)})
            SELECT {select} FROM n, {table} t WHERE t.execution_id = ?""", (first, first + count - 1, template_id))

    conn.execute("BEGIN IMMEDIATE")
    copy("executions", columns)
    copy("lease_history", history_columns)
    conn.execute("COMMIT")
    conn.close()


def claim_costs(backend, tag: str, n: int, workflows=None) -> tuple[float, float]:
    """Median seconds of one claim from a backlog of n due executions, and of an empty poll;
    `workflows`: routed claims (`claim_due(workflows=...)`) instead.

    The claimed executions are acknowledged afterwards, so that live leases do not pile up
    between repetitions (each repetition adds n completed executions to the history).
    """
    ex = backend.executions
    for i in range(n):
        ex.admit(f"{tag}-{i}", "bench")
    leases = []
    gc.collect()
    gc.disable()
    try:
        claim = per_call(lambda _: leases.extend(ex.claim_due(limit=1, duration=LEASE_MS, workflows=workflows)),
                         range(n))
        poll = per_call(lambda _: ex.claim_due(limit=1, duration=LEASE_MS, workflows=workflows), range(n))
    finally:
        gc.enable()
    assert len(leases) == n
    for lease in leases:
        ex.acknowledge(lease, Completed("null"))
    return claim, poll


def completed_count(path: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT count(*) FROM executions WHERE status = 'completed'").fetchone()[0]
    finally:
        conn.close()


def history_file(path: str, completed: int):
    """A fresh ledger holding `completed` completed executions."""
    backend = open_backend(path)
    ex = backend.executions
    ex.admit("template", "bench")
    [lease] = ex.claim_due(limit=1, duration=LEASE_MS)
    ex.acknowledge(lease, Completed("null"))
    add_completed(path, "template", 1, completed - 1)
    return backend


def scaling(folder: str, small: int, large: int, repeats: int) -> None:
    """claim_due's cost in a file with `small` and in one with `large` completed executions,
    measured alternately."""
    started = time.perf_counter()
    files = {size: history_file(os.path.join(folder, f"history-{size}.db"), size) for size in (small, large)}
    setup = time.perf_counter() - started
    costs: dict[int, list[tuple[float, float]]] = {small: [], large: []}
    for r in range(repeats):
        for size, backend in files.items():
            costs[size].append(claim_costs(backend, f"r{r}", 200))
    counts = {size: completed_count(backend.path) for size, backend in files.items()}
    for backend in files.values():
        backend.close()
    claim = {size: statistics.median(c for c, _ in costs[size]) for size in costs}
    poll = {size: statistics.median(p for _, p in costs[size]) for size in costs}
    print()
    print(f"claim_due against history (two fresh files, built in {setup:.1f} s; claims from a backlog of 200):")
    print(f"  {'completed executions in the file':36}{'claim one':>12}{'empty poll':>12}")
    for size in (small, large):
        print(f"  {f'{size:,} (after the runs: {counts[size]:,})':36}{us(claim[size]):>12}{us(poll[size]):>12}")
    print(f"  {f'ratio {large:,} / {small:,}':36}{claim[large] / claim[small]:12.2f}{poll[large] / poll[small]:12.2f}")


def add_foreign_due(path: str, count: int) -> None:
    """`count` due executions of workflow "other", admitted as the ledger admits them (copies of
    one admitted row), in one transaction."""
    with open_backend(path) as backend:
        backend.executions.admit("other-template", "other", now=1)
    conn = sqlite3.connect(path, isolation_level=None)
    columns = [row[1] for row in conn.execute("PRAGMA table_info(executions)")]
    select = ", ".join("'other-' || n.i" if c == "execution_id" else f"t.{c}" for c in columns)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(f"""
        WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
        INSERT INTO executions ({", ".join(columns)})
        SELECT {select} FROM n, executions t WHERE t.execution_id = 'other-template'""", (count - 1,))
    conn.execute("COMMIT")
    conn.close()


def routing(folder: str, foreign: int, repeats: int) -> None:
    """A routed claim's cost with no due executions of other workflows, and with `foreign` of
    them waiting (nobody serves them), measured alternately."""
    files = {}
    for size in (0, foreign):
        path = os.path.join(folder, f"routing-{size}.db")
        if size:
            add_foreign_due(path, size)
        files[size] = open_backend(path)
    costs: dict[int, list[tuple[float, float]]] = {size: [] for size in files}
    for r in range(repeats):
        for size, backend in files.items():
            costs[size].append(claim_costs(backend, f"r{r}", 200, Round.SERVED))
    for backend in files.values():
        backend.close()
    claim = {size: statistics.median(c for c, _ in costs[size]) for size in costs}
    poll = {size: statistics.median(p for _, p in costs[size]) for size in costs}
    print()
    print('claim_due(workflows={"bench"}) against due executions of a workflow it does not serve'
          " (two fresh files; claims from a backlog of 200):")
    print(f"  {'due executions of other workflows':36}{'claim one':>12}{'empty poll':>12}")
    for size in files:
        print(f"  {f'{size:,}':36}{us(claim[size]):>12}{us(poll[size]):>12}")
    print(f"  {f'ratio {foreign:,} / 0':36}{claim[foreign] / claim[0]:12.2f}{poll[foreign] / poll[0]:12.2f}")


BLOCKED_COLUMNS = ("execution_id, workflow, input_json, status, token, due_at, unacknowledged_deliveries, ever_suspended,"
                   " ready_at, created_at, updated_at, queue, queue_key, priority")


def blocked_ledger(ledger: str, count: int, hot_key: bool = False):
    """A ledger whose queue "blocked" (concurrency 1) holds a live lease and `count` more due
    executions, at priority 9 (ahead of the bench's backlog, were they not blocked): copies of
    one the ledger admitted, inserted in one transaction. `hot_key`: the queue is limited by
    `per_key=1` instead, and the lease and the due executions all have one key."""
    backend = open_backend(ledger)
    backend.queues.declare("blocked", **({"per_key": 1} if hot_key else {"concurrency": 1}))
    key = "hot" if hot_key else None
    ex = backend.executions
    ex.admit("blocked-holder", "bench", queue="blocked", key=key, priority=9, now=1)
    [lease] = ex.claim_due(limit=1, duration=10 * LEASE_MS)
    assert lease.execution_id == "blocked-holder"
    if count:
        ex.admit("blocked-template", "bench", queue="blocked", key=key, priority=9, now=1)
        numbers = ("generate_series(1, %s) AS n(i)" if ledger.startswith("postgresql://") else
                   "(WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) SELECT i FROM n) AS n")
        select = ", ".join("'blocked-' || n.i" if c.strip() == "execution_id" else f"t.{c.strip()}"
                           for c in BLOCKED_COLUMNS.split(","))
        if count > 1:
            with backend.connection.write() as db:
                db.execute(f"INSERT INTO executions ({BLOCKED_COLUMNS}) SELECT {select} FROM {numbers}, executions t"
                           f" WHERE t.execution_id = 'blocked-template'", (count - 1,))
    if ledger.startswith("postgresql://"):
        # The statistics autovacuum gathers after such a load: without them, PostgreSQL's planner
        # takes the queue's few rows without a key to be its whole backlog.
        with backend.connection.write() as db:
            db.execute("ANALYZE executions")
    return backend


def queue_blocked(ledgers: dict[int, str], name: str, repeats: int, hot_key: bool = False) -> float:
    """A claim's cost with `max(ledgers)` due executions waiting behind their queue's limit (or,
    with `hot_key`, behind their key's), and with none, measured alternately (plain and routed
    claims, empty polls); the largest of their ratios."""
    started = time.perf_counter()
    backends = {size: blocked_ledger(ledger, size, hot_key) for size, ledger in ledgers.items()}
    setup = time.perf_counter() - started
    costs: dict[int, list[tuple[float, float]]] = {size: [] for size in backends}
    routed: dict[int, list[tuple[float, float]]] = {size: [] for size in backends}
    for r in range(repeats):
        for size, backend in backends.items():
            costs[size].append(claim_costs(backend, f"r{r}", 200))
            routed[size].append(claim_costs(backend, f"w{r}", 200, Round.SERVED))
    for size, backend in backends.items():
        due = {q.name: q.due for q in backend.queues.list()}
        assert due.get("blocked", 0) == size, due  # still all waiting
        backend.close()
    sizes = sorted(backends)
    small, large = sizes[0], sizes[-1]
    print()
    limit = "per_key 1, their one key held" if hot_key else "concurrency 1, held"
    print(f"{name}: claim_due against due executions blocked by their queue's limit ({limit};"
          f" built in {setup:.1f} s; claims from a backlog of 200 in another queue):")
    print(f"  {'blocked due executions':36}{'claim one':>12}{'routed':>12}{'empty poll':>12}")
    claim = {size: statistics.median(c for c, _ in costs[size]) for size in costs}
    claim_routed = {size: statistics.median(c for c, _ in routed[size]) for size in routed}
    poll = {size: statistics.median(p for _, p in costs[size]) for size in costs}
    for size in sizes:
        print(f"  {f'{size:,}':36}{us(claim[size]):>12}{us(claim_routed[size]):>12}{us(poll[size]):>12}")
    # Against none blocked (the target), and, with a middle size, against fewer blocked: whether
    # the cost grows with the backlog or is a step paid once for the saturated queue.
    for base in sizes[:-1]:
        print(f"  {f'ratio {large:,} / {base:,}':36}{claim[large] / claim[base]:12.2f}"
              f"{claim_routed[large] / claim_routed[base]:12.2f}{poll[large] / poll[base]:12.2f}"
              + (f"   target <= {QUEUE_TARGET}x" if base == small else ""))
    return max(claim[large] / claim[small], claim_routed[large] / claim_routed[small], poll[large] / poll[small])


QUEUE_TARGET = 1.2


def live_leases(folder: str, sizes=(0, 1_000, 10_000)) -> None:
    """claim_due's cost while many other executions hold live leases (for scale, not a target)."""
    with open_backend(os.path.join(folder, "live.db")) as backend:
        ex = backend.executions
        live, rows = 0, []
        for size in sizes:
            for i in range(live, size):
                ex.admit(f"live-{i}", "bench")
            while live < size:
                live += len(ex.claim_due(limit=500, duration=LEASE_MS))
            for i in range(200):
                ex.admit(f"due-{size}-{i}", "bench")
            claim = per_call(lambda _: ex.claim_due(limit=1, duration=LEASE_MS), range(200))
            live += 200
            poll = per_call(lambda _: ex.claim_due(limit=1, duration=LEASE_MS), range(200))
            rows.append((size, claim, poll))
    print()
    print("claim_due against live leases held by others (one fresh file, growing):")
    print(f"  {'live leases':36}{'claim one':>12}{'empty poll':>12}")
    for size, claim, poll in rows:
        print(f"  {f'{size:,}':36}{us(claim):>12}{us(poll):>12}")


def us(seconds: float) -> str:
    return f"{seconds * 1e6:8.1f} us"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="calls of each kind per repetition")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--terminal", type=int, default=100_000, help="completed executions for the scaling check")
    parser.add_argument("--blocked", type=int, default=100_000,
                        help="due executions blocked by their queue's limit, for the queue check")
    parser.add_argument("--queues-only", action="store_true", help="only the queue check")
    parser.add_argument("--postgres", action="store_true",
                        help="the queue check on a throwaway PostgreSQL cluster too")
    args = parser.parse_args()
    if args.queues_only:
        with tempfile.TemporaryDirectory(prefix="bench-ledger-") as folder:
            return 0 if queue_checks(folder, args) else 1

    with tempfile.TemporaryDirectory(prefix="bench-ledger-") as folder:
        path = os.path.join(folder, "ledger.db")
        backend = open_backend(path)
        raw = open_raw(path)
        print(f"SQLite {sqlite3.sqlite_version}, Python {sys.version.split()[0]}; "
              f"{args.repeats} repetitions of {args.n} calls each; medians")

        rounds = [Round(backend, raw, f"r{r}", args.n).run() for r in range(args.repeats)]
        raw_cost = statistics.median([base for r in rounds for _, base in r.values()])
        print()
        print(f"{'':14}{'per call':>12}{'per second':>12}{'x raw rate':>12}{'x raw cost':>12}")
        print(f"{'raw insert':14}{us(raw_cost):>12}{1 / raw_cost:12,.0f}{1.0:12.2f}{1.0:12.2f}")
        ratios = {}
        for kind in Round.KINDS:
            cost = statistics.median([r[kind][0] for r in rounds])
            # Paired: each repetition's calls against the raw inserts timed between them.
            ratios[kind] = [r[kind][0] / r[kind][1] for r in rounds]
            ratio = statistics.median(ratios[kind])
            print(f"{kind:14}{us(cost):>12}{1 / cost:12,.0f}{1 / ratio:12.2f}{ratio:12.2f}")

        ratio = statistics.median(ratios["write_step"])
        verdict = "PASS" if ratio <= TARGET_RATIO else "FAIL"
        print()
        print(f"fenced write_step / plain insert transaction: {ratio:.2f}x "
              f"(per repetition: {', '.join(f'{x:.2f}' for x in ratios['write_step'])}); "
              f"target <= {TARGET_RATIO}x: {verdict}")

        backend.close()
        raw.close()

        scaling(folder, 1_000, args.terminal, args.repeats)
        routing(folder, args.terminal, args.repeats)
        live_leases(folder)
        queues_pass = queue_checks(folder, args)
    return 0 if verdict == "PASS" and queues_pass else 1


def blocked_sizes(args) -> tuple[int, ...]:
    """None blocked, a hundredth of `--blocked`, and `--blocked`."""
    return tuple(sorted({0, args.blocked // 100, args.blocked}))


def queue_checks(folder: str, args) -> bool:
    """The queue checks (a saturated queue, then a hot key) on SQLite, and on PostgreSQL with
    --postgres; whether each met its target."""
    ratios = []
    for hot_key in (False, True):
        tag = "key-" if hot_key else ""
        ratios.append(queue_blocked({size: os.path.join(folder, f"blocked-{tag}{size}.db") for size in blocked_sizes(args)},
                                    "SQLite", args.repeats, hot_key))
    if args.postgres:
        from supervisor.chaos.cluster import Cluster

        cluster = Cluster().start()
        try:
            for hot_key in (False, True):
                ratios.append(queue_blocked({size: cluster.new_database() for size in blocked_sizes(args)},
                                            "PostgreSQL", args.repeats, hot_key))
        finally:
            cluster.stop()
    return all(ratio <= QUEUE_TARGET for ratio in ratios)


if __name__ == "__main__":
    sys.exit(main())
