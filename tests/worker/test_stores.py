"""Named durable JSON stores (SPEC section 4, RFC 005) and the rows of RFC 002's fencing table
that concern them.

Workflows run in-process through `run_delivery` against a real SQLite ledger under `tmp_path`,
one backend per holder, all on one `FakeClock` (see `holders.py`). The `yieldstar store`
commands run as subprocesses.
"""

from __future__ import annotations

import json

import pytest

from faults import cli
from holders import LEASE_MS, Interposed, World, deliveries, result_of, step_rows, table
from supervisor import Completed, LeaseLost, Suspended, UnknownExecution, open_backend
from supervisor.ledger.sqlite.backend import wall_clock
from worker import Registry
from worker._runtime.driver import run_delivery

registry = Registry()


# -- workflows --------------------------------------------------------------------------------

def _store_op(ctx, op: dict):
    store = ctx.store(op["store"])
    if op["op"] == "update":
        return store.update("change", lambda n: n + op["by"])
    if op["op"] == "update_from":
        return store.update_from("change", op["items"])
    if op["op"] == "delete_from":
        return store.delete_from("change", op["names"])
    if op["op"] == "take":
        return store.take("change", op["match"])
    raise AssertionError(op)


@registry.workflow("store-op")
def store_op(ctx, input):
    """One store change under the step key "change"; returns what the change returned."""
    return {"result": _store_op(ctx, input)}


@registry.workflow("snapshot")
def snapshot(ctx, input):
    """Observe the "config" store (creating it if nobody has), wait a minute, return what it saw."""
    seen = ctx.store("config").get_or_create("config", input["initial"])
    ctx.sleep("later", 60)
    return {"seen": seen}


@registry.workflow("bookkeeping")
def bookkeeping(ctx, input):
    """Three receipted changes to the "books" store, a timer, and their recorded results."""
    books = ctx.store("books")
    counted = books.update("count", lambda state: {**state, "count": state["count"] + 1})
    merged = books.update_from("merge", {input["name"]: input["amount"]})
    removed = books.delete_from("remove", ["scratch"])
    ctx.sleep("pause", 10)
    return {"counted": counted, "merged": merged, "removed": removed}


@registry.workflow("consumer")
def consumer(ctx, input):
    """Take the first item of the "mail" store that matches `input["match"]`, waiting for one."""
    return ctx.store("mail").take("take", input["match"])


@registry.workflow("producer")
def producer(ctx, input):
    """Append `input["item"]` to the "mail" store, once."""
    return ctx.store("mail").update("send", lambda items: items + [input["item"]])


@registry.workflow("take-then-rest")
def take_then_rest(ctx, input):
    item = ctx.store("mail").take("take", input["match"])
    ctx.sleep("rest", 60)
    return item


def store_state(backend, name: str):
    state = backend.stores.get(name)
    return None if state is None else json.loads(state.state_json)


# -- RFC 002 fencing table: store update, updateFrom, deleteFrom, matched take -------------------

STORE_OPS = {
    "update": dict(initial=10, op={"op": "update", "by": 5}, result=15, final=15),
    "update_from": dict(initial={"a": 1}, op={"op": "update_from", "items": {"b": 2}},
                        result={"a": 1, "b": 2}, final={"a": 1, "b": 2}),
    "delete_from": dict(initial={"a": 1, "b": 2}, op={"op": "delete_from", "names": ["a", "zz"]},
                        result={"a": 1}, final={"b": 2}),
    "take": dict(initial=[{"to": "bob"}, {"to": "alice", "n": 1}, {"to": "alice", "n": 2}],
                 op={"op": "take", "match": {"to": "alice"}},
                 result={"to": "alice", "n": 1}, final=[{"to": "bob"}, {"to": "alice", "n": 2}]),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("first", ["stale commits first", "current commits first"])
@pytest.mark.parametrize("name", sorted(STORE_OPS))
def test_a_stale_holder_commits_an_idempotent_store_update_the_store_reflects_the_step_exactly_once_and_the_current_holder_receives_the_recorded_result(
        world, holder, name, first):
    case = STORE_OPS[name]
    holder.stores.set("s", json.dumps(case["initial"]))
    version_before = holder.stores.get("s").version
    holder.executions.admit("e1", "store-op", json.dumps({**case["op"], "store": "s"}))
    stale_lease = world.claim(world.holder(), "e1")  # token 1
    current = Interposed(holder, "stores.change")

    def meanwhile():
        # Token 1 is frozen just before its store change: its lease runs out, and token 2 claims.
        lease = world.take_over(holder, stale_lease)
        if first == "current commits first":
            assert world.deliver(current, lease, registry) == Completed(json.dumps({"result": case["result"]}))
        meanwhile.lease = lease

    stale = Interposed(world.holder(), "stores.change", before=meanwhile)
    assert world.deliver(stale, stale_lease, registry) == LeaseLost()  # its change went in; its step write did not
    if first == "stale commits first":
        assert world.deliver(current, meanwhile.lease, registry) == Completed(json.dumps({"result": case["result"]}))

    # Both holders made the change; the store reflects it once, and both got the one recorded result.
    (stale_receipt,) = stale.replies
    (current_receipt,) = current.replies
    assert {stale_receipt.applied, current_receipt.applied} == {True, False}
    assert stale_receipt.applied == (first == "stale commits first")
    assert json.loads(stale_receipt.result_json) == json.loads(current_receipt.result_json) == case["result"]
    assert store_state(holder, "s") == case["final"]
    assert holder.stores.get("s").version == version_before + 1
    assert table(world.path, "SELECT store, execution_id, step_key FROM store_receipts") == [("s", "e1", "change")]
    # The workflow's records are the current holder's, and its outcome stands.
    assert step_rows(world.path, "e1") == [("change", 1, {"value": case["result"]}, 2)]
    assert result_of(holder.executions.get("e1")) == {"result": case["result"]}
    assert holder.executions.acknowledge(stale_lease, Completed('"stale"')) == LeaseLost()
    assert result_of(holder.executions.get("e1")) == {"result": case["result"]}


# -- RFC 002 fencing table: store getOrCreate, idempotent by identity ----------------------------

@pytest.mark.timeout(30)
def test_store_get_or_create_admits_one_initial_state_and_a_replay_sees_the_recorded_snapshot_after_the_store_changed(
        world, holder):
    holder.executions.admit("e1", "snapshot", json.dumps({"initial": {"colour": "red"}}))
    world.clock.advance(1)  # e1 is due first
    holder.executions.admit("e2", "snapshot", json.dumps({"initial": {"colour": "blue"}}))
    stale_lease = world.claim(world.holder(), "e1")
    current = Interposed(holder, "stores.get_or_create")

    def meanwhile():
        # Token 1 is frozen before get_or_create; token 2 creates the store and records its snapshot.
        assert world.deliver(current, world.take_over(holder, stale_lease), registry) == Suspended()
        holder.stores.set("config", json.dumps({"colour": "green"}))  # and the store moves on

    stale = Interposed(world.holder(), "stores.get_or_create", before=meanwhile)
    assert world.deliver(stale, stale_lease, registry) == LeaseLost()

    # One initial state: token 2's. The stale call found the store (as it is now) and created nothing.
    assert [json.loads(s.state_json) for s in current.replies + stale.replies] == [{"colour": "red"},
                                                                                 {"colour": "green"}]
    assert step_rows(world.path, "e1") == [("config", 1, {"value": {"colour": "red"}}, 2),
                                           ("later", 1, {"until": world.clock.now + 60_000}, 2)]
    # A later execution with another initial state finds the store too.
    assert world.claim_and_deliver(holder, "e2", registry) == Suspended()
    assert store_state(holder, "config") == {"colour": "green"}
    assert holder.stores.get("config").version == 2  # created once, set once

    world.clock.advance(60_000)
    assert world.claim_and_deliver(holder, "e1", registry) == Completed(json.dumps({"seen": {"colour": "red"}}))
    assert world.claim_and_deliver(holder, "e2", registry) == Completed(json.dumps({"seen": {"colour": "green"}}))
    assert store_state(holder, "config") == {"colour": "green"}


# -- receipts: once per (store, execution, step key) ----------------------------------------------

class Crash(BaseException):
    """Stands in for the worker process dying."""


@pytest.mark.timeout(30)
def test_update_update_from_and_delete_from_apply_once_per_store_execution_and_step_key_even_when_replayed(
        world, holder):
    holder.stores.set("books", json.dumps({"count": 0, "scratch": True}))
    version_before = holder.stores.get("books").version
    holder.executions.admit("e1", "bookkeeping", json.dumps({"name": "tea", "amount": 3}))
    world.clock.advance(1)  # e1 is due first
    holder.executions.admit("e2", "bookkeeping", json.dumps({"name": "cups", "amount": 2}))

    # The first delivery dies right after the "merge" change committed, before its step was recorded.
    def die():
        raise Crash()

    lease = world.claim(holder, "e1")
    dying = Interposed(holder, "heap.write_step", before=die, when=lambda lease, step_key, **_: step_key == "merge")
    with pytest.raises(Crash):
        world.deliver(dying, lease, registry)
    assert [r.step_key for r in dying.replies] == ["count"]
    assert store_state(holder, "books") == {"count": 1, "scratch": True, "tea": 3}

    # The replay finds "count" recorded, and the receipt of "merge": neither is applied again.
    world.clock.now = lease.expires_at + 1
    changes = Interposed(holder, "stores.change")
    assert world.claim_and_deliver(changes, "e1", registry) == Suspended()
    assert [(r.step_key, r.applied) for r in changes.replies] == [("merge", False), ("remove", True)]
    assert store_state(holder, "books") == {"count": 1, "tea": 3}

    # Another execution's steps with the same keys are other receipts: they apply, once each.
    assert world.claim_and_deliver(holder, "e2", registry) == Suspended()
    assert store_state(holder, "books") == {"count": 2, "tea": 3, "cups": 2}

    # Replayed to the end: every result is the recorded one, and nothing applies again.
    world.clock.advance(10_000)
    expected = {
        "e1": {"counted": {"count": 1, "scratch": True}, "merged": {"count": 1, "scratch": True, "tea": 3},
               "removed": {"scratch": True}},
        "e2": {"counted": {"count": 2, "tea": 3}, "merged": {"count": 2, "tea": 3, "cups": 2}, "removed": {}},
    }
    for execution_id in ("e1", "e2"):
        assert world.claim_and_deliver(holder, execution_id, registry) == Completed(json.dumps(expected[execution_id]))
    assert store_state(holder, "books") == {"count": 2, "tea": 3, "cups": 2}
    assert holder.stores.get("books").version == version_before + 3 + 3
    assert sorted(table(world.path, "SELECT execution_id, step_key FROM store_receipts")) == [
        ("e1", "count"), ("e1", "merge"), ("e1", "remove"), ("e2", "count"), ("e2", "merge"), ("e2", "remove")]


# -- a store as a mailbox between two workflows -----------------------------------------------------

@pytest.mark.timeout(30)
def test_a_store_is_a_mailbox_between_workflows_a_taker_waits_for_a_matching_item_and_gets_it_exactly_once(
        world, holder):
    holder.stores.set("mail", json.dumps([{"to": "bob", "text": "hi bob"}]))
    for execution_id in ("alice-1", "alice-2"):
        holder.executions.admit(execution_id, "consumer", json.dumps({"match": {"to": "alice"}}))
        assert world.claim_and_deliver(holder, execution_id, registry) == Suspended()
        assert holder.executions.get(execution_id).due_at is None  # waiting for the store, not for a time

    # A letter for somebody else wakes both takers; they find nothing for them and wait again.
    holder.executions.admit("send-carol", "producer", json.dumps({"item": {"to": "carol", "text": "hi carol"}}))
    assert world.claim_and_deliver(holder, "send-carol", registry) == Completed(json.dumps(
        [{"to": "bob", "text": "hi bob"}, {"to": "carol", "text": "hi carol"}]))
    assert [holder.executions.get(e).due_at for e in ("alice-1", "alice-2")] == [world.clock.now] * 2
    for _ in range(2):
        assert world.claim_and_deliver(holder, None, registry) == Suspended()
    assert [holder.executions.get(e).status for e in ("alice-1", "alice-2")] == ["suspended"] * 2

    # One letter for alice: exactly one taker gets it (whichever comes first); the other keeps waiting.
    letter = {"to": "alice", "text": "hello"}
    holder.executions.admit("send-alice", "producer", json.dumps({"item": letter}))
    assert world.claim_and_deliver(holder, "send-alice", registry).status == "completed"
    outcomes = {}
    for _ in range(2):
        lease = world.claim(holder)
        outcomes[lease.execution_id] = world.deliver(holder, lease, registry)
    assert sorted(outcomes) == ["alice-1", "alice-2"]
    assert sorted(o.status for o in outcomes.values()) == ["completed", "suspended"]
    (winner,) = [e for e, o in outcomes.items() if o.status == "completed"]
    (waiting,) = [e for e, o in outcomes.items() if o.status == "suspended"]
    assert result_of(holder.executions.get(winner)) == letter
    assert store_state(holder, "mail") == [{"to": "bob", "text": "hi bob"}, {"to": "carol", "text": "hi carol"}]

    # A second letter goes to the other taker; the items that match nobody stay.
    second = {"to": "alice", "text": "hello again"}
    holder.stores.put("mail", json.dumps(second))
    assert world.claim_and_deliver(holder, waiting, registry) == Completed(json.dumps(second))
    assert result_of(holder.executions.get(winner)) == letter
    assert store_state(holder, "mail") == [{"to": "bob", "text": "hi bob"}, {"to": "carol", "text": "hi carol"}]
    assert [r.step_key for r in holder.heap.steps(winner)] == ["take"]


@pytest.mark.timeout(30)
def test_a_taker_waits_for_a_mailbox_nobody_created_yet_and_yieldstar_store_put_wakes_it(tmp_path):
    # The wall clock here: the command line writes with it too.
    world = World(tmp_path / "ledger.db", clock=wall_clock)
    try:
        holder = world.holder()
        holder.executions.admit("alice", "consumer", json.dumps({"match": {"to": "alice"}}))
        assert world.claim_and_deliver(holder, "alice", registry) == Suspended()
        assert holder.stores.get("mail") is None

        put = cli(world.path, "store", "put", "mail", '{"to": "bob"}')
        assert put.returncode == 0, put.stderr
        assert json.loads(put.stdout) == [{"to": "bob"}]
        assert world.claim_and_deliver(holder, "alice", registry) == Suspended()

        put = cli(world.path, "store", "put", "mail", '{"to": "alice", "text": "hi"}')
        assert put.returncode == 0, put.stderr
        assert holder.executions.get("alice").due_at is not None  # woken by the put
        assert world.claim_and_deliver(holder, "alice", registry) == Completed(
            json.dumps({"to": "alice", "text": "hi"}))
        assert store_state(holder, "mail") == [{"to": "bob"}]
    finally:
        world.close()


# -- RFC 002 fencing table: store waiter registration, unfenced ------------------------------------

@pytest.mark.timeout(30)
def test_a_stale_store_waiter_registration_causes_at_most_one_extra_delivery_and_the_outcome_is_unchanged(
        world, holder):
    holder.stores.set("mail", "[]")
    holder.executions.admit("e1", "take-then-rest", json.dumps({"match": {"to": "alice"}}))
    stale_lease = world.claim(world.holder(), "e1")

    def meanwhile():
        # Token 1 is frozen just before registering as a waiter; token 2 registers and suspends.
        assert world.deliver(holder, world.take_over(holder, stale_lease), registry) == Suspended()

    stale = Interposed(world.holder(), "stores.wait", before=meanwhile)
    # Unfenced, its registration goes in: it is the one token 2 made already. Only its
    # acknowledgement, a fenced write, is refused.
    assert run_delivery(stale, stale_lease, registry) == Suspended()
    assert stale.replies == [False]
    assert holder.executions.acknowledge(stale_lease, Suspended()) == LeaseLost()
    assert table(world.path, "SELECT kind, target, waiter FROM waiters") == [("store", "mail", "e1")]

    # One item: one wake, one delivery; the taker moves on to its timer.
    holder.stores.put("mail", json.dumps({"to": "alice", "n": 1}))
    assert world.claim_and_deliver(holder, "e1", registry) == Suspended()
    assert table(world.path, "SELECT kind, target, waiter FROM waiters") == []
    claims = deliveries(holder, "e1")

    # A stale holder registers again, late, on the store the execution no longer waits on.
    assert world.holder().stores.wait("mail", "e1", holder.stores.get("mail").version) is False
    holder.stores.put("mail", json.dumps({"to": "bob"}))  # wakes it: the one extra delivery
    holder.stores.put("mail", json.dumps({"to": "alice", "n": 2}))  # registrations are one-shot: no more
    assert world.claim_and_deliver(holder, "e1", registry) == Suspended()  # replay absorbs it
    assert holder.executions.claim_due(limit=1, duration=LEASE_MS) == []
    assert deliveries(holder, "e1") == claims + 1

    world.clock.advance(60_000)
    assert world.claim_and_deliver(holder, "e1", registry) == Completed(json.dumps({"to": "alice", "n": 1}))
    assert store_state(holder, "mail") == [{"to": "bob"}, {"to": "alice", "n": 2}]
    assert [key for key, *_ in step_rows(world.path, "e1")] == ["take", "rest"]


# -- the `yieldstar store` commands -----------------------------------------------------------------

@pytest.mark.timeout(60)
def test_yieldstar_store_ls_get_put_and_set_read_and_write_stores(tmp_path):
    db = tmp_path / "ledger.db"
    missing = cli(db, "store", "ls")  # reading never creates a ledger
    assert (missing.returncode, missing.stdout, missing.stderr) == (2, "", f"yieldstar: no ledger at {db}\n")
    assert not db.exists()

    put = cli(db, "store", "put", "mail", '{"to": "alice"}')
    assert (put.returncode, json.loads(put.stdout)) == (0, [{"to": "alice"}])
    put = cli(db, "store", "put", "mail", '"postcard"')
    assert (put.returncode, json.loads(put.stdout)) == (0, [{"to": "alice"}, "postcard"])
    set_ = cli(db, "store", "set", "config", '{"colour": "red", "sizes": [1, 2]}')
    assert (set_.returncode, json.loads(set_.stdout)) == (0, {"colour": "red", "sizes": [1, 2]})

    got = cli(db, "store", "get", "mail")
    assert (got.returncode, json.loads(got.stdout), got.stderr) == (0, [{"to": "alice"}, "postcard"], "")
    listed = cli(db, "store", "ls")
    assert listed.returncode == 0
    lines = [line.split("\t") for line in listed.stdout.splitlines()]
    assert [(name, json.loads(state)) for name, _, state in lines] == [
        ("config", {"colour": "red", "sizes": [1, 2]}), ("mail", [{"to": "alice"}, "postcard"])]
    assert all(version.startswith("version=") for _, version, _ in lines)

    with open_backend(db) as holder:
        assert json.loads(holder.stores.get("config").state_json) == {"colour": "red", "sizes": [1, 2]}
        assert json.loads(holder.stores.get("mail").state_json) == [{"to": "alice"}, "postcard"]


@pytest.mark.timeout(60)
def test_yieldstar_store_get_of_an_unknown_store_exits_1(tmp_path):
    db = tmp_path / "ledger.db"
    cli(db, "store", "set", "config", "{}")
    got = cli(db, "store", "get", "nope")
    assert got.returncode == 1
    assert got.stdout == ""
    assert "nope" in got.stderr and "Traceback" not in got.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args, says", [
    (("store", "put", "mail", "{not json"), "not valid JSON"),
    (("store", "set", "config", "[1, 2"), "not valid JSON"),
    (("store", "put", "config", '"an item"'), "not a list"),  # config holds an object
], ids=["put bad JSON", "set bad JSON", "put into an object store"])
def test_yieldstar_store_put_and_set_refuse_bad_input_with_a_message_and_change_nothing(tmp_path, args, says,
                                                                                      db_snapshot):
    db = tmp_path / "ledger.db"
    assert cli(db, "store", "set", "config", '{"colour": "red"}').returncode == 0
    assert cli(db, "store", "put", "mail", '{"to": "alice"}').returncode == 0
    before = db_snapshot(db)

    refused = cli(db, *args)

    assert refused.returncode != 0
    assert refused.stdout == ""
    assert refused.stderr.startswith("yieldstar: ") and refused.stderr.count("\n") == 1, refused.stderr
    assert "Traceback" not in refused.stderr
    assert says in refused.stderr
    assert db_snapshot(db) == before


@pytest.mark.timeout(30)
def test_a_waiter_registration_for_an_execution_never_admitted_is_refused_and_cannot_block_later_wakes(
        world, holder, db_snapshot):
    holder.stores.set("mail", "[]")
    holder.executions.admit("child", "consumer", "null")
    before = db_snapshot(world.path)
    for register in (lambda: holder.stores.wait("mail", "nobody", holder.stores.get("mail").version),
                     lambda: holder.effects.wait("fx", "nobody"),
                     lambda: holder.executions.await_outcome("child", "nobody")):
        with pytest.raises(UnknownExecution, match="nobody"):
            register()
    assert db_snapshot(world.path) == before
    # What would have woken "nobody" still commits.
    assert store_state(holder, "mail") == [] and holder.stores.put("mail", "1").state_json == "[1]"
    assert holder.effects.settle("fx", "1").status == "settled"
