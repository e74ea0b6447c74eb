"""Effects (SPEC section 4, RFC 004): external operations that must not repeat, the rows of RFC
002's fencing table that concern them, settling from outside (Python API and `yieldstar settle`),
and the RFC's order shop, where a frozen worker's retry charges nobody twice.

Workflows run in-process through `run_delivery` against a real SQLite ledger under `tmp_path`,
one backend per holder, all on one `FakeClock` (see `holders.py`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import worker.apps.demo_shop  # noqa: F401  registers the shop's "order" workflow
from faults import cli
from holders import LEASE_MS, ROOT, Interposed, World, deliveries, result_of, step_rows, table
from supervisor import Completed, InvalidArgument, LeaseLost, Suspended, open_backend
from supervisor.ledger.sqlite.backend import wall_clock
from supervisor.ledger.values import EffectState, SettleConflict
from worker import Registry, default_registry
from worker.apps.demo_shop import PaymentProvider
from worker._runtime.driver import run_delivery

registry = Registry()
requests: list[str] = []  # effect ids the "approval" workflow asked the outside world to work on


@pytest.fixture(autouse=True)
def no_requests_yet():
    requests.clear()
    yield
    requests.clear()


@registry.workflow("approval")
def approval(ctx, input):
    """Ask a person for an approval; they answer later, from outside, by settling the effect."""
    decision = ctx.effect("approve", requests.append, external=True)
    return {"decision": decision}


@registry.workflow("charge-by-token")
def charge_by_token(ctx, input):
    """An external system that breaks its idempotency contract: each holder gets its own answer."""
    return ctx.effect("charge", lambda effect_id: {"charged_by_token": ctx.token})


def conflicts(world, effect_id: str) -> int:
    (row,) = table(world.path, "SELECT conflicts FROM effects WHERE effect_id = $p", effect_id)
    return row[0]


# -- EffectClient.begin and settle ----------------------------------------------------------------

@pytest.mark.timeout(30)
def test_effect_begin_is_idempotent_a_repeat_returns_the_current_state_and_begun_counts(holder):
    assert holder.effects.get("pay-42") is None
    assert holder.effects.begin("pay-42") == EffectState("pay-42", "pending", None, 1)
    assert holder.effects.begin("pay-42") == EffectState("pay-42", "pending", None, 2)
    holder.effects.settle("pay-42", '{"charge_id": "ch_1"}')
    again = holder.effects.begin("pay-42")
    assert (again.status, json.loads(again.result_json), again.begun) == ("settled", {"charge_id": "ch_1"}, 3)
    assert holder.effects.get("pay-42") == again
    with pytest.raises(InvalidArgument, match="effect_id"):
        holder.effects.begin("")


@pytest.mark.timeout(30)
def test_effect_settle_keeps_the_first_result_and_reports_a_different_later_one_as_settle_conflict_without_applying_it(
        world, holder):
    holder.effects.begin("pay-42")
    first = holder.effects.settle("pay-42", '{"charge_id": "ch_1", "amount": 1999}')
    assert (first.status, json.loads(first.result_json)) == ("settled", {"charge_id": "ch_1", "amount": 1999})
    # The same result again, however it is spelled, is no conflict.
    assert holder.effects.settle("pay-42", '{ "amount": 1999, "charge_id": "ch_1" }') == first

    other = world.holder().effects.settle("pay-42", '{"charge_id": "ch_2", "amount": 1999}')

    assert other == SettleConflict("pay-42", first.result_json, '{"charge_id": "ch_2", "amount": 1999}')
    assert other.status == "conflict"
    assert holder.effects.get("pay-42") == first  # not applied
    assert conflicts(world, "pay-42") == 1
    with pytest.raises(InvalidArgument, match="result_json"):
        holder.effects.settle("pay-42", "{not json")
    assert holder.effects.get("pay-42") == first


@pytest.mark.timeout(30)
@pytest.mark.parametrize("first", ["current settles first", "stale settles first"])
def test_effect_settle_from_a_stale_and_a_current_holder_keeps_the_first_result_and_reports_the_other_as_a_conflict(
        world, holder, first):
    holder.executions.admit("e1", "charge-by-token")
    stale_lease = world.claim(world.holder(), "e1")
    current = Interposed(holder, "effects.settle")
    stale_backend = world.holder()

    def meanwhile():
        # Token 1 got its answer from the external system and is frozen before settling.
        lease = world.take_over(holder, stale_lease)
        if first == "stale settles first":
            # Token 2 asks too, and gets another answer; token 1 settles while token 2 is on its way.
            current._before = lambda: stale_backend.effects.settle("e1/charge", '{"charged_by_token": 1}')
        world.deliver(current, lease, registry)

    stale = Interposed(stale_backend, "effects.settle", before=meanwhile)
    assert world.deliver(stale, stale_lease, registry) == LeaseLost()

    kept, lost = ({"charged_by_token": 2}, {"charged_by_token": 1}) if first == "current settles first" else (
        {"charged_by_token": 1}, {"charged_by_token": 2})
    (conflict,) = [r for r in stale.replies + current.replies if isinstance(r, SettleConflict)]
    assert (json.loads(conflict.kept_result_json), json.loads(conflict.offered_result_json)) == (kept, lost)
    state = holder.effects.get("e1/charge")
    assert (state.status, json.loads(state.result_json), state.begun) == ("settled", kept, 2)
    assert conflicts(world, "e1/charge") == 1
    # The current holder recorded, and the workflow returned, the kept result whoever settled it.
    assert result_of(holder.executions.get("e1")) == kept
    assert step_rows(world.path, "e1") == [("charge", 1, {"value": kept}, 2)]


# -- the order shop: a frozen worker's retry charges nobody twice ---------------------------------

@pytest.mark.timeout(30)
def test_order_shop_a_frozen_workers_retry_charges_nobody_twice(world, holder, tmp_path):
    provider = PaymentProvider(str(tmp_path / "provider.jsonl"))
    holder.executions.admit("order-43", "order", json.dumps({"order_id": 43, "provider": provider.path}))
    stale_lease = world.claim(world.holder(), "order-43")  # worker A, token 1

    def meanwhile():
        # A's card charge went through; A freezes before the answer is recorded. Its lease runs
        # out, B claims with token 2, replays, and asks the provider again with the same key.
        assert len(provider.charges()) == 1
        done = world.deliver(holder, world.take_over(holder, stale_lease), default_registry)
        assert done.status == "completed"

    stale = Interposed(world.holder(), "effects.settle", before=meanwhile)
    # A thaws: it settles the same result (the provider answered it with the first charge) and
    # its step write is refused, so it stops.
    assert run_delivery(stale, stale_lease, default_registry) == LeaseLost()
    assert holder.executions.acknowledge(stale_lease, Completed("null")) == LeaseLost()

    (charge,) = provider.charges()
    assert charge["idempotency_key"] == "order-43/charge"
    assert result_of(holder.executions.get("order-43")) == {"order_id": 43, "charge_id": charge["charge_id"]}
    assert [r.status for r in stale.replies] == ["settled"]  # the same result: no conflict
    state = holder.effects.get("order-43/charge")
    assert (state.status, state.begun, conflicts(world, "order-43/charge")) == ("settled", 2, 0)
    assert json.loads(state.result_json) == {"charge_id": charge["charge_id"], "amount": 1999}
    assert [(key, token) for key, _, _, token in step_rows(world.path, "order-43")] == [("load", 1), ("charge", 2)]


# -- effects settled from outside -----------------------------------------------------------------

@pytest.mark.timeout(30)
def test_an_external_effect_suspends_the_workflow_until_settled_through_the_python_api(world, holder):
    holder.executions.admit("e1", "approval")
    assert world.claim_and_deliver(holder, "e1", registry) == Suspended()
    assert requests == ["e1/approve"]  # the effect id, to pass on as the idempotency key
    assert holder.executions.get("e1").due_at is None
    assert holder.effects.get("e1/approve").status == "pending"

    # A stray wake replays the workflow: it asks for nothing again and waits on.
    holder.executions.request_wake("e1", world.clock.now)
    assert world.claim_and_deliver(holder, "e1", registry) == Suspended()
    assert requests == ["e1/approve"]

    settled = world.holder().effects.settle("e1/approve", '{"approved": true, "by": "ops"}')  # another process
    assert settled.status == "settled"
    assert holder.executions.get("e1").due_at == world.clock.now  # woken
    assert world.claim_and_deliver(holder, "e1", registry) == Completed(
        json.dumps({"decision": {"approved": True, "by": "ops"}}))
    assert requests == ["e1/approve"]  # fn ran once across every replay
    assert deliveries(holder, "e1") == 3
    assert [key for key, *_ in step_rows(world.path, "e1")] == ["approve#requested", "approve"]


@pytest.mark.timeout(30)
def test_an_effect_settled_before_the_workflow_reaches_it_returns_at_once_and_requests_nothing(world, holder):
    holder.executions.admit("e1", "approval")
    holder.effects.settle("e1/approve", '"pre-approved"')
    assert world.claim_and_deliver(holder, "e1", registry) == Completed(json.dumps({"decision": "pre-approved"}))
    assert requests == []


@pytest.mark.timeout(60)
def test_an_external_effect_suspends_the_workflow_until_yieldstar_settle_settles_it(tmp_path):
    world = World(tmp_path / "ledger.db", clock=wall_clock)  # the command line writes with the wall clock
    try:
        holder = world.holder()
        holder.executions.admit("e1", "approval")
        assert world.claim_and_deliver(holder, "e1", registry) == Suspended()
        (effect_id,) = requests

        settled = cli(world.path, "settle", effect_id, "--result", '{"approved": false}')

        assert settled.returncode == 0, settled.stderr
        assert json.loads(settled.stdout) == {"effect_id": effect_id, "status": "settled",
                                              "result": {"approved": False}, "begun": 1}
        assert holder.executions.get("e1").due_at is not None  # woken
        assert world.claim_and_deliver(holder, "e1", registry) == Completed(
            json.dumps({"decision": {"approved": False}}))
        assert requests == [effect_id]
    finally:
        world.close()


@pytest.mark.timeout(60)
def test_yieldstar_settle_reports_a_different_second_result_as_a_conflict_and_accepts_the_same_one_again(tmp_path):
    db = tmp_path / "ledger.db"
    first = cli(db, "settle", "ship-7", "--result", '{"tracking": "T1"}', "--create")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["result"] == {"tracking": "T1"}

    same = cli(db, "settle", "ship-7", "--result", '{ "tracking" : "T1" }')
    assert (same.returncode, json.loads(same.stdout)["result"], same.stderr) == (0, {"tracking": "T1"}, "")

    other = cli(db, "settle", "ship-7", "--result", '{"tracking": "T2"}')
    assert other.returncode != 0
    assert other.stdout == ""
    assert other.stderr.startswith("yieldstar: ") and "Traceback" not in other.stderr
    assert "already settled" in other.stderr and "T1" in other.stderr and "T2" in other.stderr

    bad = cli(db, "settle", "ship-7", "--result", "{oops")
    assert bad.returncode != 0 and "not valid JSON" in bad.stderr and "Traceback" not in bad.stderr

    with open_backend(db) as holder:
        assert json.loads(holder.effects.get("ship-7").result_json) == {"tracking": "T1"}
    assert table(db, "SELECT conflicts FROM effects WHERE effect_id = 'ship-7'") == [(1,)]


# -- RFC 002 fencing table: EffectClient.wait, unfenced --------------------------------------------

@pytest.mark.timeout(30)
def test_a_stale_effect_wait_registration_causes_at_most_one_extra_delivery_and_the_outcome_is_unchanged(
        world, holder):
    holder.executions.admit("e1", "approval")
    stale_lease = world.claim(world.holder(), "e1")

    def meanwhile():
        # Token 1 asked for the approval and is frozen before registering as a waiter; token 2
        # replays (the request is recorded: not asked again), registers and suspends.
        assert world.deliver(holder, world.take_over(holder, stale_lease), registry) == Suspended()

    stale = Interposed(world.holder(), "effects.wait", before=meanwhile)
    assert run_delivery(stale, stale_lease, registry) == Suspended()  # its registration went in
    assert holder.executions.acknowledge(stale_lease, Suspended()) == LeaseLost()  # its acknowledgement did not
    assert table(world.path, "SELECT kind, target, waiter FROM waiters") == [("effect", "e1/approve", "e1")]
    claims = deliveries(holder, "e1")

    holder.effects.settle("e1/approve", '"yes"')
    # A stale registration after the settle finds it settled and registers nothing.
    assert world.holder().effects.wait("e1/approve", "e1").status == "settled"
    assert table(world.path, "SELECT kind, target, waiter FROM waiters") == []

    assert world.claim_and_deliver(holder, "e1", registry) == Completed(json.dumps({"decision": "yes"}))
    assert holder.executions.claim_due(limit=1, duration=LEASE_MS) == []
    assert deliveries(holder, "e1") == claims + 1
    assert requests == ["e1/approve"]


@pytest.mark.timeout(60)
def test_the_order_shop_script_plays_the_frozen_worker_and_the_customer_is_charged_once(tmp_path):
    script = ROOT / "scripts" / "order_shop.py"
    played = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=55,
                            env={**os.environ, "TMPDIR": str(tmp_path)}, stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert played.returncode == 0, played.stdout + played.stderr
    assert "PASS  customer charged once" in played.stdout and "FAIL" not in played.stdout
    assert "provider charges for order-43: 1" in played.stdout
    assert os.listdir(tmp_path) == []  # its temporary ledger is gone
