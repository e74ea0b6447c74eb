"""The checker's queue-limit invariants (`supervisor.chaos.queue_limits`) on hand-made ledgers.

Each breach is made the way only a broken claim could make it: the queue's limit is raised, a
claim takes the extra delivery, and the limit is put back before the checker reads the ledger.
Beside each, the same ledger kept at its limit passes, with the limit as its largest count: a
checker that cannot fail proves nothing, and one that fails a correct claim is no better.
"""

from __future__ import annotations

import json

import pytest

from supervisor import Completed
from supervisor.chaos.clocks import Clocks
from supervisor.chaos.evidence import SupervisorLife
from supervisor.chaos.queue_limits import QueueLimits, check_queue_limits
from test_chaos import LEASE, Ledger

QUEUE = "q"


@pytest.fixture
def ledger(tmp_path, clock, each_backend):
    """A hand-made ledger on each backend in turn."""
    made = Ledger(tmp_path, clock, each_backend)
    yield made
    made.backend.close()


def admit(ledger: Ledger, *eids: str, key=None) -> None:
    for eid in eids:
        ledger.backend.executions.admit(eid, "chaos.capped", json.dumps({"dir": ledger.folder, "plan": []}),
                                        queue=QUEUE, key=key)


def claim(ledger: Ledger, **limits):
    """One claim, with the queue's limits set to `limits` just before it."""
    ledger.backend.queues.declare(QUEUE, **limits)
    claimed = ledger.backend.executions.claim_due(limit=1, duration=LEASE)
    return claimed[0] if claimed else None


def claim_beyond(ledger: Ledger, raised: dict, **limits):
    """A claim only a claim that counted wrong could make: with the queue's limits raised to
    `raised`, then put back to `limits` before the checker reads them."""
    claimed = claim(ledger, **raised)
    assert claimed is not None
    ledger.backend.queues.declare(QUEUE, **limits)
    return claimed


def queue_violations(ledger: Ledger) -> tuple[list, dict]:
    result = ledger.check()
    found = [v for v in result.violations if v.kind.startswith("queue_")]
    return found, result.figures["queues"][QUEUE]


def caught(ledger: Ledger, kind: str):
    """The one queue violation the checker reports, of `kind`, and the queue's figures."""
    found, figures = queue_violations(ledger)
    assert [v.kind for v in found] == [kind], found
    return found[0], figures


@pytest.mark.timeout(60)
def test_two_overlapping_leases_beyond_a_concurrency_of_one_are_caught(ledger):
    admit(ledger, "e1", "e2")
    first = claim(ledger, concurrency=1)
    assert claim(ledger, concurrency=1) is None  # the claim itself holds the limit
    ledger.clock.advance(100)
    second = claim_beyond(ledger, {"concurrency": 2}, concurrency=1)
    violation, figures = caught(ledger, "queue_concurrency")
    assert violation.execution_id == second.execution_id
    assert "queue q: 2 live leases" in violation.detail and "concurrency 1" in violation.detail
    assert f"{first.execution_id}/1" in violation.detail and f"{second.execution_id}/1" in violation.detail
    assert figures["max_live"] == 2 and figures["concurrency"] == 1


@pytest.mark.timeout(60)
def test_leases_exactly_at_the_concurrency_pass(ledger):
    admit(ledger, "e1", "e2", "e3")
    first = claim(ledger, concurrency=2)
    assert claim(ledger, concurrency=2) is not None
    assert claim(ledger, concurrency=2) is None
    ledger.clock.advance(100)
    ledger.backend.executions.acknowledge(first, Completed("{}"))
    assert claim(ledger, concurrency=2) is not None  # in the slot the acknowledgement freed
    found, figures = queue_violations(ledger)
    assert found == []
    assert figures["max_live"] == 2 and figures["deliveries"] == 3


@pytest.mark.timeout(60)
def test_a_dead_holders_lease_counts_until_it_expires(chaos_ledger):
    admit(chaos_ledger, "e1", "e2")
    claim(chaos_ledger, concurrency=1)  # its holder dies: the lease is never renewed nor ended
    chaos_ledger.clock.advance(LEASE - 1)
    claim_beyond(chaos_ledger, {"concurrency": 2}, concurrency=1)  # one ms before the dead lease expired
    caught(chaos_ledger, "queue_concurrency")


@pytest.mark.timeout(60)
def test_a_claim_once_a_dead_holders_lease_expired_passes(chaos_ledger):
    admit(chaos_ledger, "e1", "e2")
    claim(chaos_ledger, concurrency=1)
    chaos_ledger.clock.advance(LEASE)
    assert claim(chaos_ledger, concurrency=1).execution_id in ("e1", "e2")
    found, figures = queue_violations(chaos_ledger)
    assert found == [] and figures["max_live"] == 1


@pytest.mark.timeout(60)
def test_two_leases_of_one_key_beyond_per_key_are_caught_and_other_keys_are_not_counted(chaos_ledger):
    admit(chaos_ledger, "r1", "r2", key="red")
    admit(chaos_ledger, "b1", key="blue")
    assert {claim(chaos_ledger, per_key=1).execution_id for _ in range(2)} == {"r1", "b1"}
    assert claim(chaos_ledger, per_key=1) is None
    clean, figures = queue_violations(chaos_ledger)
    assert clean == [] and figures["max_live_per_key"] == 1 and figures["max_live"] == 2
    assert claim_beyond(chaos_ledger, {"per_key": 2}, per_key=1).execution_id == "r2"
    violation, figures = caught(chaos_ledger, "queue_per_key")
    assert "key red" in violation.detail and figures["max_live_per_key"] == 2


@pytest.mark.timeout(60)
def test_claims_beyond_a_rate_within_its_window_are_caught(chaos_ledger):
    admit(chaos_ledger, "e1", "e2", "e3")
    for _ in range(2):
        assert claim(chaos_ledger, rate=(2, 1.0)) is not None
        chaos_ledger.clock.advance(300)
    assert claim(chaos_ledger, rate=(2, 1.0)) is None
    claim_beyond(chaos_ledger, {"rate": (3, 1.0)}, rate=(2, 1.0))  # 600 ms after the first
    violation, figures = caught(chaos_ledger, "queue_rate")
    assert "3 claims in the window" in violation.detail and figures["max_claims_in_window"] == 3


@pytest.mark.timeout(60)
def test_claims_at_the_rate_pass(chaos_ledger):
    admit(chaos_ledger, "e1", "e2", "e3")
    assert claim(chaos_ledger, rate=(2, 1.0)) is not None
    chaos_ledger.clock.advance(300)
    assert claim(chaos_ledger, rate=(2, 1.0)) is not None
    chaos_ledger.clock.advance(700)  # the first claim leaves the window
    assert claim(chaos_ledger, rate=(2, 1.0)) is not None
    found, figures = queue_violations(chaos_ledger)
    assert found == [] and figures["max_claims_in_window"] == 2


@pytest.mark.timeout(60)
def test_a_lease_acknowledged_while_a_claim_waited_for_its_queues_row_lock_is_not_held_against_it():
    """On PostgreSQL a claim reads its time before it waits for its queue's row lock: a lease
    acknowledged during the wait ends, as recorded, after the claim's time. Beyond that allowance
    the same pair is a breach."""
    limits = {QUEUE: QueueLimits(QUEUE, 1, None, None, None)}
    executions = {"e1": (QUEUE, None), "e2": (QUEUE, None)}

    def history(ended_after_claim_ms: int) -> dict:
        return {"e1": [("e1", 1, "h:1", 1_000, 2_500, 1_200 + ended_after_claim_ms, "acknowledged", "completed")],
                "e2": [("e2", 1, "h:2", 1_200, 2_700, 1_900, "acknowledged", "completed")]}

    for ended_after, slack, breaches in ((50, 1_000, []), (50, 0, ["queue_concurrency"]),
                                         (1_100, 1_000, ["queue_concurrency"])):
        found = []
        figures = check_queue_limits(limits, executions, history(ended_after), {}, Clocks(None),
                                     lambda kind, eid, detail: found.append(kind), end_slack_ms=slack)
        assert found == breaches, (ended_after, slack)
        assert figures[QUEUE]["max_live"] == (2 if breaches else 1)


@pytest.mark.timeout(60)
def test_the_rate_window_is_shortened_by_ledger_clock_skews_only():
    """A claimer whose ledger clock runs behind the fastest may count claims a faster clock
    already pruned: its window is checked shortened by the difference. With --hosts the hosts'
    wall clocks are skewed but the ledger's clock is the server's: the whole window is checked."""
    limits = {QUEUE: QueueLimits(QUEUE, None, None, 2, 1_000)}
    executions = {f"e{i}": (QUEUE, None) for i in range(3)}
    history = {f"e{i}": [(f"e{i}", 1, f"h:{10 + i}", 1_000 + 400 * i, 9_000, 1_100 + 400 * i, "acknowledged",
                          "completed")] for i in range(3)}  # three claims within 800 ms

    def breaches(**skews) -> list:
        fleet = {10 + i: [SupervisorLife(i, 10 + i, 0, **skews)] for i in range(3)}
        found = []
        check_queue_limits(limits, executions, history, {}, Clocks(fleet), lambda kind, *_: found.append(kind))
        return found

    assert breaches() == ["queue_rate"]
    assert breaches(wall_skew_ms=300, host=0) == ["queue_rate"]
    fleet = {10: [SupervisorLife(0, 10, 0, skew_ms=300)], 11: [SupervisorLife(1, 11, 0)],
             12: [SupervisorLife(2, 12, 0)]}
    found = []
    check_queue_limits(limits, executions, history, {}, Clocks(fleet),
                       lambda kind, *_: found.append(kind))
    assert found == []  # e2's claimer runs 300 ms behind e0's: e0 may have pruned itself from its window


@pytest.mark.timeout(60)
def test_a_lease_a_claim_counted_free_is_gone_for_later_claims_whose_clocks_run_behind():
    """A claimer whose clock runs ahead counts a holder's lease run out, and the ledger ends it
    (recorded `expired` at its expiry); a later claim whose clock runs behind would still read
    that expiry as in its future, but the lease was no longer there to count. Without that
    first claim, the same later claim breaches the limit."""
    limits = {QUEUE: QueueLimits(QUEUE, None, 1, None, None)}
    fleet = {10: [SupervisorLife(0, 10, 0)], 11: [SupervisorLife(1, 11, 0, skew_ms=200)],
             12: [SupervisorLife(2, 12, 0, skew_ms=-200)]}
    holder = [("e1", 1, "h:10", 1_000, 2_500, 2_500, "expired", None)]
    ahead = [("e2", 1, "h:11", 2_550, 4_050, 2_700, "acknowledged", "completed")]  # true 2,350: e1 ran out by its clock
    behind = [("e3", 1, "h:12", 2_300, 3_800, 2_400, "acknowledged", "completed")]  # true 2,500: after e2's claim

    def breaches(history: dict) -> list:
        executions = {eid: (QUEUE, "red") for eid in history}
        found = []
        check_queue_limits(limits, executions, history, {}, Clocks(fleet), lambda kind, *_: found.append(kind))
        return found

    assert breaches({"e1": holder, "e2": ahead, "e3": behind}) == []
    assert breaches({"e1": holder, "e3": behind}) == ["queue_per_key"]


@pytest.mark.timeout(60)
def test_a_delivery_claimed_and_acknowledged_within_one_ms_came_before_a_claim_in_that_ms():
    """One supervisor claims e9, which ends at once (a replay with nothing left to run), and in the
    same ms its acknowledgement's batch claims e1 of the same key: the ids sort the other way."""
    limits = {QUEUE: QueueLimits(QUEUE, None, 1, None, None)}
    executions = {"e1": (QUEUE, "green"), "e9": (QUEUE, "green")}
    history = {"e9": [("e9", 1, "h:1", 2_000, 3_500, 2_000, "acknowledged", "completed")],
               "e1": [("e1", 1, "h:1", 2_000, 3_500, 2_013, "acknowledged", "completed")]}
    found = []
    figures = check_queue_limits(limits, executions, history, {}, Clocks(None), lambda kind, *_: found.append(kind))
    assert found == [] and figures[QUEUE]["max_live_per_key"] == 1
    history["e9"][0] = ("e9", 1, "h:1", 2_000, 3_500, 2_001, "acknowledged", "completed")  # overlapping
    check_queue_limits(limits, executions, history, {}, Clocks(None), lambda kind, *_: found.append(kind))
    assert found == ["queue_per_key"]


@pytest.mark.timeout(60)
def test_of_two_claims_in_one_true_ms_the_one_whose_clock_ran_ahead_may_have_ended_what_the_other_counts():
    """The case of a ten-minute run: a dead holder's two leases expire at 2,033 by its clock. In
    true ms 1,910 two supervisors claim: one whose clock runs 142 ms ahead (it reads 2,052, counts
    both leases run out, ends them and takes a slot) and one unskewed (it reads 1,910: by its
    clock the two leases still run, but they were ended, and it sees room for one). True time
    cannot tell which committed first; the order in which the first ended the leases is one
    without a breach. Had the clock ahead not reached their expiry, the second claim breaches."""
    limits = {QUEUE: QueueLimits(QUEUE, 3, None, None, None)}
    fleet = {10: [SupervisorLife(0, 10, 0)], 11: [SupervisorLife(1, 11, 0, skew_ms=142)],
             12: [SupervisorLife(2, 12, 0)]}

    def breaches(ahead_reads: int) -> list:
        history = {
            "dead-1": [("dead-1", 1, "h:12", 1_000, 2_033, 2_033, "expired", None)],
            "dead-2": [("dead-2", 1, "h:12", 1_100, 2_033, 2_033, "expired", None)],
            "held": [("held", 1, "h:10", 1_500, 3_000, 2_600, "acknowledged", "completed")],
            # "e-ahead" sorts after "e-behind" by id: the order must come from the clocks
            "e-behind": [("e-behind", 1, "h:10", 1_910, 3_410, 2_500, "acknowledged", "completed")],
            "e-ahead": [("e-ahead", 1, "h:11", ahead_reads, ahead_reads + 1_500, 2_900, "acknowledged", "completed")],
        }
        executions = {eid: (QUEUE, None) for eid in history}
        found = []
        check_queue_limits(limits, executions, history, {}, Clocks(fleet),
                           lambda kind, eid, _: found.append((kind, eid)))
        return found

    assert breaches(2_052) == []
    # The claim ahead reads 2,032 (true 1,890: 20 ms before the other): both leases still ran by
    # its clock, so it ended nothing and took a fourth slot, and the second claim a fifth.
    assert breaches(2_032) == [("queue_concurrency", "e-ahead"), ("queue_concurrency", "e-behind")]
