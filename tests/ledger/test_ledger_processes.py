"""SPEC section 3's invariants across OS processes: dispatchers racing on one SQLite file.

Workers are started with the 'spawn' context and each opens its own backend on the shared file,
on the wall clock. The worker functions are top-level so that spawn can import them.

To check afterwards in which order things committed (timestamps cannot say: each call reads the
clock before it waits for the write lock), the test adds an audit table to the file with
triggers that log every claim (token change), every end of a delivery (status leaving
'running') and every accepted step write, in commit order. The triggers run inside the ledger's
own transactions and change none of its rows.
"""

from __future__ import annotations

import faulthandler
import json
import multiprocessing
import os
import random
import sqlite3
import time
from collections import Counter, defaultdict

import psutil
import pytest

from supervisor import Completed, Failed, LeaseLost, Released, Renewed, Suspended, open_backend

TERMINAL = ("completed", "failed")

AUDIT = [
    """CREATE TABLE audit (seq INTEGER PRIMARY KEY AUTOINCREMENT, execution_id TEXT NOT NULL,
        event TEXT NOT NULL, token INTEGER NOT NULL, status TEXT)""",
    """CREATE TRIGGER audit_claim AFTER UPDATE OF token ON executions WHEN new.token != old.token
        BEGIN INSERT INTO audit (execution_id, event, token, status)
              VALUES (new.execution_id, 'claim', new.token, new.status); END""",
    """CREATE TRIGGER audit_end AFTER UPDATE OF status ON executions
        WHEN old.status = 'running' AND new.status != 'running'
        BEGIN INSERT INTO audit (execution_id, event, token, status)
              VALUES (new.execution_id, 'end', new.token, new.status); END""",
    """CREATE TRIGGER audit_step AFTER INSERT ON steps
        BEGIN INSERT INTO audit (execution_id, event, token, status)
              VALUES (new.execution_id, 'step', new.token, NULL); END""",
]


def fast_redelivery_delay(n: int) -> int:
    return min(2 * n, 10)


def open_shared(db_path):
    return open_backend(db_path, redelivery_delay=fast_redelivery_delay)


def unfinished(db_path) -> int:
    conn = sqlite3.connect(db_path, timeout=15)
    try:
        return conn.execute("SELECT count(*) FROM executions WHERE status NOT IN ('completed', 'failed')").fetchone()[0]
    finally:
        conn.close()


def run_workers(target, db_path, out_dir, n, *, deadline_s, **kwargs) -> list[dict]:
    """Run `target` in `n` spawned processes released together; their JSON results, in order."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(n)  # referenced here until every worker has exited
    processes = []
    try:
        for i in range(n):
            out_path = os.path.join(out_dir, f"worker-{i}.json")
            process = ctx.Process(target=target, args=(str(db_path), i, barrier, out_path), kwargs=kwargs,
                                  name=f"ledger-worker-{i}")
            process.start()
            processes.append((process, out_path))
        deadline = time.monotonic() + deadline_s
        for process, _ in processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
        hung = [p.name for p, _ in processes if p.is_alive()]
        assert not hung, f"workers still running at the deadline: {hung}"
        assert [p.exitcode for p, _ in processes] == [0] * n
    finally:
        for process, _ in processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
    for process, _ in processes:
        assert not psutil.pid_exists(process.pid), process
    results = []
    for _, out_path in processes:
        with open(out_path) as f:
            results.append(json.load(f))
    return results


# -- the claim race ------------------------------------------------------------------------------


def claim_race_worker(db_path, index, barrier, out_path):
    faulthandler.dump_traceback_later(90, exit=True)  # a hung worker shows where, then dies
    rng = random.Random(index)
    leases, violations = [], []
    with open_shared(db_path) as backend:
        barrier.wait(timeout=60)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            claimed = backend.executions.claim_due(limit=rng.randint(1, 2), duration=600_000)
            for lease in claimed:
                leases.append([lease.execution_id, lease.token])
                record = backend.executions.get(lease.execution_id)
                if (record.status, record.token) != ("running", lease.token):
                    violations.append(f"{lease}: {record}")
            if not claimed and _all_running(backend):
                break
    with open(out_path, "w") as f:
        json.dump({"leases": leases, "violations": violations}, f)


def _all_running(backend) -> bool:
    return backend.connection.execute("SELECT count(*) FROM executions WHERE status != 'running'").fetchone()[0] == 0


@pytest.mark.timeout(120)
def test_dispatchers_in_four_processes_each_due_execution_is_claimed_exactly_once(each_backend, tmp_path):
    db_path = each_backend
    count = 600
    with open_shared(db_path) as backend:
        for i in range(count):
            backend.executions.admit(f"order-{i}", "charge")

    results = run_workers(claim_race_worker, db_path, tmp_path, 4, deadline_s=100)

    assert [v for result in results for v in result["violations"]] == []
    claims = [tuple(lease) for result in results for lease in result["leases"]]
    assert sorted(claims) == sorted((f"order-{i}", 1) for i in range(count))
    assert sum(1 for result in results if result["leases"]) >= 2, "the processes did not race"
    with open_shared(db_path) as backend:
        assert {r.status for r in backend.executions.list()} == {"running"}


# -- the chaos race ------------------------------------------------------------------------------


LEASE_MS = 30


def chaos_worker(db_path, index, barrier, out_path, *, seed, run_for_s):
    """Claim, write steps, renew, and end each delivery at random: complete or fail it,
    release it, suspend it and wake it, or abandon it to expire (and later try to carry on
    with the abandoned lease, as a paused holder would)."""
    faulthandler.dump_traceback_later(run_for_s + 60, exit=True)
    rng = random.Random(seed * 1000 + index)
    stats: Counter = Counter()
    violations: list[str] = []
    abandoned = []  # (lease, when to revisit it)

    def check_lost(backend, lease, why):
        """After `why`, every fenced call with `lease` must return LeaseLost and change nothing."""
        replies = [
            backend.heap.write_step(lease, step_key="late", step_attempt=0, done=True, step_response_json="0"),
            backend.executions.renew(lease, duration=LEASE_MS),
            backend.executions.release(lease),
            backend.executions.acknowledge(lease, Completed('"late"')),
        ]
        if replies != [LeaseLost()] * 4:
            violations.append(f"{lease} after {why}: {replies}")
        stats["lost"] += 4

    def deliver(backend, lease):
        ex, heap = backend.executions, backend.heap
        payload = json.dumps({"token": lease.token, "pid": os.getpid()})
        for i in range(rng.randint(0, 3)):
            reply = heap.write_step(lease, step_key=f"step-{i}", step_attempt=0, done=True, step_response_json=payload)
            if reply == LeaseLost():
                stats["lost"] += 1
                return  # a holder that lost its lease stops
            if json.loads(reply.step_response_json)["token"] > lease.token:
                violations.append(f"{lease}: recorded step from a later token {reply}")
            stats["steps"] += 1
        if rng.random() < 0.3:
            reply = ex.renew(lease, duration=LEASE_MS)
            if reply == LeaseLost():
                stats["lost"] += 1
                return
            assert isinstance(reply, Renewed)
            lease = reply.lease
        roll = rng.random()
        if lease.token >= 4 or roll < 0.3:
            outcome = Failed(payload) if roll < 0.03 else Completed(payload)
            if ex.acknowledge(lease, outcome) == outcome:
                stats[outcome.status] += 1
                check_lost(backend, lease, "its acknowledgement")
        elif roll < 0.5:
            if ex.release(lease) == Released():
                stats["released"] += 1
                check_lost(backend, lease, "its release")
        elif roll < 0.75:
            if ex.acknowledge(lease, Suspended()) == Suspended():
                stats["suspended"] += 1
                # Woken after the acknowledgement, at the time of the wake: due at once, and
                # never before the delivery ended (so lease intervals can be compared by time).
                ex.request_wake(lease.execution_id, backend.clock())
        else:
            stats["abandoned"] += 1
            abandoned.append((lease, time.monotonic() + rng.uniform(0, 3 * LEASE_MS) / 1000))

    def revisit(backend, lease):
        """A paused holder resumes: half the time it carries on blindly (its fenced writes decide),
        else it renews first and carries on only if the lease is still current."""
        if rng.random() < 0.5:
            stats["resumed blind"] += 1
            deliver(backend, lease)
            return
        reply = backend.executions.renew(lease, duration=LEASE_MS)
        if reply == LeaseLost():
            stats["resumed lost"] += 1
            check_lost(backend, lease, "a lost renewal")
        else:
            stats["resumed current"] += 1
            deliver(backend, reply.lease)

    with open_shared(db_path) as backend:
        barrier.wait(timeout=60)
        deadline = time.monotonic() + run_for_s
        while time.monotonic() < deadline:
            for item in [item for item in abandoned if item[1] <= time.monotonic()]:
                abandoned.remove(item)
                revisit(backend, item[0])
            leases = backend.executions.claim_due(limit=rng.randint(1, 3), duration=LEASE_MS)
            stats["claims"] += len(leases)
            for lease in leases:
                deliver(backend, lease)
            if not leases:
                if not abandoned and unfinished(db_path) == 0:
                    break
                time.sleep(0.002)  # poll interval while nothing is claimable
    with open(out_path, "w") as f:
        json.dump({"stats": stats, "violations": violations}, f)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_dispatchers_in_four_processes_keep_every_invariant_under_random_interleavings(tmp_path):
    db_path = tmp_path / "ledger.db"
    count = 400
    with open_shared(db_path) as backend:
        conn = sqlite3.connect(db_path)
        with conn:
            for statement in AUDIT:
                conn.execute(statement)
        conn.close()
        for i in range(count):
            backend.executions.admit(f"order-{i}", "charge", json.dumps({"order": i}))

    results = run_workers(chaos_worker, db_path, tmp_path, 4, deadline_s=200, seed=7, run_for_s=150)

    assert [v for result in results for v in result["violations"]] == []
    stats = sum((Counter(result["stats"]) for result in results), Counter())

    with open_shared(db_path) as backend:
        ids = [f"order-{i}" for i in range(count)]
        records = {i: backend.executions.get(i) for i in ids}
        histories = {i: backend.executions.history(i) for i in ids}
    conn = sqlite3.connect(db_path)
    steps = conn.execute("SELECT execution_id, step_key, attempt, token, step_response_json FROM steps").fetchall()
    audit = conn.execute("SELECT execution_id, event, token, status FROM audit ORDER BY seq").fetchall()
    conn.close()

    # Every execution reached a terminal status, acknowledged by the holder of its last token.
    assert {r.status for r in records.values()} <= set(TERMINAL), Counter(r.status for r in records.values())
    for i, record in records.items():
        payload = record.result_json or record.error_json
        assert json.loads(payload)["token"] == record.token, (i, record)
        last = histories[i][-1]
        assert (last.token, last.ended_by, last.outcome) == (record.token, "acknowledged", record.status)

    ends = Counter()
    for i, history in histories.items():
        # Tokens of each execution strictly increase 1, 2, 3, ...
        assert [h.token for h in history] == list(range(1, records[i].token + 1)), (i, history)
        for h in history:
            assert h.ended_by is not None and h.claimed_at <= h.ended_at, h
            ends[h.ended_by] += 1
        # No two leases overlap: each delivery ended before the next one was claimed.
        for before, after in zip(history, history[1:]):
            assert before.ended_at <= after.claimed_at, (before, after)

    # In commit order, claims of an execution come 1, 2, 3, ...; every accepted step write
    # carries the token of the latest claim, and comes before that delivery ended.
    current: dict[str, tuple[int, bool]] = defaultdict(lambda: (0, True))  # token, ended
    step_events = 0
    for execution_id, event, token, status in audit:
        latest, ended = current[execution_id]
        if event == "claim":
            assert token == latest + 1, (execution_id, event, token, latest)
            current[execution_id] = (token, False)
        elif event == "end":
            assert (token, ended) == (latest, False), (execution_id, event, token, latest)
            current[execution_id] = (token, True)
        else:
            assert (token, ended) == (latest, False), f"{execution_id}: step under token {token}, current {latest}"
            step_events += 1
    assert step_events == len(steps)
    for execution_id, step_key, attempt, token, response in steps:
        assert json.loads(response)["token"] == token, (execution_id, step_key, token, response)

    # The run exercised what it claims to.
    assert stats["claims"] == sum(len(h) for h in histories.values())
    assert stats["completed"] + stats["failed"] == count
    assert ends["superseded"] > 0 and ends["released"] > 0 and stats["suspended"] > 0
    assert stats["lost"] > 0 and stats["resumed lost"] > 0
    assert sum(1 for result in results if result["stats"].get("claims")) == 4
