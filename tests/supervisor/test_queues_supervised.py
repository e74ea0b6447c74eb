"""Queues with real processes (SPEC section 12): three supervisors of an app that declares a queue
of concurrency 2 share one ledger (a SQLite file, and PostgreSQL); the lease history shows that at
most 2 deliveries of the queue overlapped, and the limit came from the app (recorded by each
supervisor when it started, before its first claim). The same for a per-key limit and a rate;
one supervisor claims by priority, then due time. Starts that name no queue take the workflow's,
even those made before any supervisor ran. Every wait polls against a deadline.
"""

from __future__ import annotations

import json

import pytest

from faults import TESTS, cli, wait_until

pytestmark = [pytest.mark.usefixtures("dump_on_hang"), pytest.mark.timeout(120)]

APP = str(TESTS / "apps" / "queues_app.py")
EXECUTIONS = 16


def three_supervisors(supervisors, backend) -> None:
    """Three supervisors of the app, each ready and its queues' limits recorded."""
    fleet = [supervisors.start(backend, app=APP, concurrency=3, ready=False) for _ in range(3)]
    for process in fleet:
        process.wait_ready()
        process.wait_log("recorded the limits of 3 queues")


def max_overlap(deliveries, slack_ms: int = 0) -> int:
    """The most deliveries live at one instant, each from its claim (`slack_ms` later) to its end
    (an end at the instant of another's claim comes first)."""
    events = sorted([(d.ended_at, -1) for d in deliveries] + [(d.claimed_at + slack_ms, 1) for d in deliveries])
    live = most = 0
    for _, change in events:
        live += change
        most = max(most, live)
    return most


def test_three_supervisors_sharing_a_queue_of_concurrency_2_never_overlap_more_than_2_deliveries(
        each_backend, each_ledger, supervisors):
    three_supervisors(supervisors, each_backend)
    ids = [f"narrow-{i:02d}" for i in range(EXECUTIONS)]
    for execution_id in ids:
        each_ledger.executions.admit(execution_id, "q.narrow", queue="narrow")
    wait_until(lambda: all(each_ledger.executions.get(e).status == "completed" for e in ids), 90,
               message="every execution completed")

    deliveries = [d for e in ids for d in each_ledger.executions.history(e)]
    assert all(d.ended_by == "acknowledged" for d in deliveries)
    # (Which supervisor takes a freed slot is a race: the one whose acknowledgement freed it
    # claims again in the same transaction, so one supervisor may well take them all.)
    # SQLite: one host's clock, read under the write lock, orders every change. PostgreSQL: each
    # process stamps with its own estimate of the server's clock, which lags it by a few ms of its
    # own; a claim made just after another process's acknowledgement may read up to that much
    # earlier. (The ledger test `test_processes_claiming_at_once_never_exceed_the_concurrency_limit`
    # checks the count inside each claim's transaction, exactly, on both.)
    slack = 0 if not str(each_backend).startswith("postgresql://") else 20
    assert max_overlap(deliveries, slack) <= 2
    assert max_overlap(deliveries) >= 2  # the limit was reached: the queue, not chance, held them
    listed = {q.name: q for q in each_ledger.queues.list()}
    assert (listed["narrow"].concurrency, listed["narrow"].running, listed["narrow"].due) == (2, 0, 0)


def test_a_start_that_names_no_queue_takes_its_workflows_and_the_cli_shows_it(each_backend, each_ledger,
                                                                               supervisors):
    supervisors.start(each_backend, app=APP, concurrency=2)
    wait_until(lambda: each_ledger.queues.defaults_of("q.narrow") == ("narrow", 0), 30,
               message="the app's default queues recorded")
    started = cli(each_backend, "start", "q.urgent", "--id", "u-1")
    assert started.returncode == 0, started.stderr
    named = cli(each_backend, "start", "q.narrow", "--id", "n-1", "--key", "tenant-7", "--priority", "3")
    assert named.returncode == 0, named.stderr
    urgent, narrow = each_ledger.executions.get("u-1"), each_ledger.executions.get("n-1")
    assert (urgent.queue, urgent.key, urgent.priority) == ("default", None, 5)
    assert (narrow.queue, narrow.key, narrow.priority) == ("narrow", "tenant-7", 3)
    got = cli(each_backend, "get", "n-1", "--json")
    assert got.returncode == 0, got.stderr
    shown = json.loads(got.stdout)
    assert (shown["queue"], shown["key"], shown["priority"]) == ("narrow", "tenant-7", 3)
    wait_until(lambda: each_ledger.executions.get("n-1").status == "completed", 30, message="n-1 completed")


def test_starts_made_before_any_supervisor_ran_obey_the_queue_its_first_supervisor_records(
        each_backend, each_ledger, supervisors):
    """`yieldstar start` before the first `supervise`: the ledger knows no defaults yet, and the
    executions take them when the supervisor records them, before its first claim."""
    ids = [f"early-{i:02d}" for i in range(6)]
    for execution_id in ids:
        started = cli(each_backend, "start", "q.narrow", "--id", execution_id)
        assert started.returncode == 0, started.stderr
    urgent = cli(each_backend, "start", "q.urgent", "--id", "early-urgent")
    assert urgent.returncode == 0, urgent.stderr
    assert {each_ledger.executions.get(e).queue for e in ids} == {"default"}
    supervisors.start(each_backend, app=APP, concurrency=6)
    wait_until(lambda: all(each_ledger.executions.get(e).status == "completed" for e in ids + ["early-urgent"]), 60,
               message="every execution completed")
    assert {(each_ledger.executions.get(e).queue, each_ledger.executions.get(e).priority) for e in ids} == {
        ("narrow", 0)}
    assert each_ledger.executions.get("early-urgent").priority == 5
    deliveries = [d for e in ids for d in each_ledger.executions.history(e)]
    slack = 0 if not str(each_backend).startswith("postgresql://") else 20
    assert max_overlap(deliveries, slack) <= 2



def slack_of(backend) -> int:
    """How far apart two processes' stamps of one instant may be (see the first test)."""
    return 0 if not str(backend).startswith("postgresql://") else 20


def test_three_supervisors_never_run_two_deliveries_of_one_key_at_once_but_run_keys_side_by_side(
        each_backend, each_ledger, supervisors):
    three_supervisors(supervisors, each_backend)
    ids = {f"keyed-{key}-{i}": f"tenant-{key}" for key in range(3) for i in range(4)}
    for execution_id, key in ids.items():
        each_ledger.executions.admit(execution_id, "q.keyed", queue="keyed", key=key)
    wait_until(lambda: all(each_ledger.executions.get(e).status == "completed" for e in ids), 90,
               message="every execution completed")
    by_key: dict[str, list] = {}
    for execution_id, key in ids.items():
        by_key.setdefault(key, []).extend(each_ledger.executions.history(execution_id))
    assert all(max_overlap(deliveries, slack_of(each_backend)) <= 1 for deliveries in by_key.values())
    assert max_overlap([d for deliveries in by_key.values() for d in deliveries]) >= 2  # keys side by side


def test_three_supervisors_sharing_a_rate_claim_at_most_4_in_any_second(each_backend, each_ledger, supervisors):
    three_supervisors(supervisors, each_backend)
    ids = [f"rated-{i:02d}" for i in range(14)]
    for execution_id in ids:
        each_ledger.executions.admit(execution_id, "q.rated", queue="rated")
    wait_until(lambda: all(each_ledger.executions.get(e).status == "completed" for e in ids), 90,
               message="every execution completed")
    claims = sorted(d.claimed_at for e in ids for d in each_ledger.executions.history(e))
    assert len(claims) == len(ids)
    # Any 5 claims in a row span at least a second (less the stamps' slack on PostgreSQL).
    spans = [claims[i + 4] - claims[i] for i in range(len(claims) - 4)]
    assert min(spans) >= 1000 - slack_of(each_backend), spans


def test_a_supervisor_claims_by_priority_then_due_time(each_backend, each_ledger, supervisors):
    """A backlog admitted before the supervisor starts: the priority 5 executions (q.urgent's
    default) are all claimed before the priority 0 ones, each group in the order it was due."""
    plain = [f"plain-{i}" for i in range(4)]
    urgent = [f"urgent-{i}" for i in range(4)]
    for i in range(4):
        each_ledger.executions.admit(plain[i], "q.plain")
        each_ledger.executions.admit(urgent[i], "q.urgent", priority=5)
    supervisors.start(each_backend, app=APP, concurrency=1)
    wait_until(lambda: all(each_ledger.executions.get(e).status == "completed" for e in plain + urgent), 60,
               message="every execution completed")
    # One delivery each, one at a time: a claim made in the ms its predecessor ended may share
    # its time, so the order is read with ties allowed.
    claimed = {e: [d.claimed_at for d in each_ledger.executions.history(e)] for e in plain + urgent}
    assert all(len(times) == 1 for times in claimed.values()), claimed
    order = [claimed[e][0] for e in urgent + plain]
    assert order == sorted(order), claimed  # every urgent one first, each group in due order
