"""Host faults as a delivery meets them (issue 10, the child's side): derived ids that two
executions could share (finding 1), storage errors inside a delivery (finding 2), and a child
whose clock lags the claimer's (finding 7).

Workflows run in-process through `run_delivery` or `worker.testing.run_workflow` on a real SQLite
ledger under `tmp_path`. The full-disk tests mount a small tmpfs (root only) and fill it for real
while a step runs; the corruption test damages a page of the real file.
"""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path
from typing import Optional

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from faults import damage_table, fill_disk, tmpfs
from supervisor import Completed, Retry, Suspended, open_backend
from supervisor.ledger.arguments import identifier
from supervisor.ledger.errors import StorageUnavailable
from worker import Registry
from worker._runtime.driver import run_delivery
from worker._runtime.derived_ids import derived_id
from worker.testing import FakeClock, WorkflowStuck, run_workflow

pytestmark = pytest.mark.timeout(30)

LEASE_MS = 30_000

registry = Registry()
calls: collections.Counter = collections.Counter()
charges: list[str] = []  # the effect ids the payment provider was called with, in order


@pytest.fixture(autouse=True)
def fresh_state():
    calls.clear()
    charges.clear()
    yield
    calls.clear()
    charges.clear()
    disk.free()
    step_ledger.clear()
    server.update(down=False, goes_down=False)


# -- finding 1: two executions never share a derived id -------------------------------------------

def charge(effect_id: str) -> dict:
    """A payment provider that charges once per idempotency key it is given."""
    charges.append(effect_id)
    return {"receipt": f"r-{len(charges)}", "key": effect_id}


@registry.workflow("hf.customer")
def customer(ctx, input):
    receipt = ctx.effect(input["charge"], charge)
    shipment = ctx.start(input["ship"], "hf.shipment", {"for": ctx.execution_id})
    return {"receipt": receipt, "shipment": shipment}


@registry.workflow("hf.shipment")
def shipment(ctx, input):
    return input


@registry.workflow("hf.family")
def family(ctx, input):
    """A parent that starts a child keyed `b`, then charges with key `b/c`: its child `a/b`
    charges with key `c`."""
    child = ctx.start("b", "hf.family_child")
    return {"child": child, "receipt": ctx.effect("b/c", charge)}


@registry.workflow("hf.family_child")
def family_child(ctx, input):
    return {"receipt": ctx.effect("c", charge)}


# What a ledger id may hold (SPEC section 2): no control characters.
_ID_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=255)


@pytest.mark.timeout(60)
@settings(max_examples=300, deadline=None)
@given(execution_id=_ID_TEXT, key=_ID_TEXT)
def test_a_derived_id_is_a_valid_ledger_id_and_ordinary_ids_keep_their_form(execution_id, key):
    derived = derived_id(execution_id, key)
    identifier("derived id", derived)  # at most 255 characters, and nothing a ledger id may not hold
    if "/" not in execution_id and "%" not in execution_id and len(execution_id) + 1 + len(key) <= 255:
        assert derived == f"{execution_id}/{key}"


# Ids built from the characters the encoding gives a meaning to, short or long enough to be hashed.
_TRICKY = st.text(alphabet="ab/%2F#", min_size=1, max_size=6)
_PART = st.one_of(_TRICKY, st.builds(lambda n, s: "x" * n + s, st.integers(100, 240), _TRICKY))


def _splits(whole: str) -> list[tuple[str, str]]:
    """Every (execution id, key) that `execution_id + "/" + key` would turn into `whole`."""
    return [(whole[:i], whole[i + 1:]) for i, c in enumerate(whole)
            if c == "/" and 0 < i <= 255 and 0 < len(whole) - i - 1 <= 255]


@pytest.mark.timeout(60)
@settings(max_examples=500, deadline=None)
@given(wholes=st.lists(st.lists(_PART, min_size=2, max_size=4).map("/".join), min_size=1, max_size=4),
       others=st.lists(st.tuples(_PART, _PART), max_size=8))
def test_finding_1_no_two_different_execution_and_key_pairs_map_to_one_id(wholes, others):
    pairs = {pair for whole in wholes for pair in _splits(whole)} | set(others)
    ids = {}
    for pair in pairs:
        derived = derived_id(*pair)
        assert derived == derived_id(*pair)  # the same on every replay and every holder
        assert ids.setdefault(derived, pair) == pair, f"{pair} and {ids[derived]} share the id {derived!r}"


def test_finding_1_cust_and_cust_7_each_pay_once_with_their_own_receipt_and_get_their_own_child(tmp_path):
    clock = FakeClock()
    with open_backend(tmp_path / "ledger.db", clock=clock, redelivery_delay=lambda n: 1) as ledger:
        cust = run_workflow(registry, "hf.customer", {"charge": "7/charge", "ship": "7/ship"},
                            execution_id="cust", backend=ledger, clock=clock)
        cust_7 = run_workflow(registry, "hf.customer", {"charge": "charge", "ship": "ship"},
                              execution_id="cust/7", backend=ledger, clock=clock)

        assert charges == ["cust/7/charge", "cust%2F7/charge"]  # the provider was called once for each
        assert json.loads(cust.result_json) == {
            "receipt": {"receipt": "r-1", "key": "cust/7/charge"}, "shipment": "cust/7/ship"}
        assert json.loads(cust_7.result_json) == {
            "receipt": {"receipt": "r-2", "key": "cust%2F7/charge"}, "shipment": "cust%2F7/ship"}
        for parent, child in (("cust", "cust/7/ship"), ("cust/7", "cust%2F7/ship")):
            assert json.loads(ledger.executions.get(child).input_json) == {"for": parent}
        for effect_id, receipt in (("cust/7/charge", "r-1"), ("cust%2F7/charge", "r-2")):
            state = ledger.effects.get(effect_id)
            assert (state.status, json.loads(state.result_json)["receipt"], state.begun) == ("settled", receipt, 1)


def test_finding_1_a_parent_and_its_own_child_never_share_an_effect_id(tmp_path):
    clock = FakeClock()
    with open_backend(tmp_path / "ledger.db", clock=clock, redelivery_delay=lambda n: 1) as ledger:
        parent = run_workflow(registry, "hf.family", execution_id="a", backend=ledger, clock=clock)
        assert json.loads(parent.result_json)["child"] == "a/b"
        child = run_workflow(registry, "hf.family_child", execution_id="a/b", backend=ledger, clock=clock)

        assert charges == ["a/b/c", "a%2Fb/c"]
        assert json.loads(parent.result_json)["receipt"]["receipt"] == "r-1"
        assert json.loads(child.result_json) == {"receipt": {"receipt": "r-2", "key": "a%2Fb/c"}}


@registry.workflow("hf.shadowed_request")
def shadowed_request(ctx, input):
    ctx.run("approve#requested", lambda: "the workflow's own step")
    return ctx.effect("approve", charge, external=True)


def test_a_step_named_like_an_external_effects_request_is_refused_not_taken_for_the_request():
    record = run_workflow(registry, "hf.shadowed_request")

    error = json.loads(record.error_json)
    assert (record.status, error["type"]) == ("failed", "InvalidArgument")
    assert "'approve#requested'" in error["message"] and "twice" in error["message"]
    assert charges == []


# -- finding 2: a storage error inside a delivery is never a workflow outcome ----------------------

class SmallDisk:
    """A tmpfs of its own, which a test fills for real at a chosen moment."""

    def __init__(self) -> None:
        self.folder: Optional[Path] = None
        self.armed = False  # the next `fill_if_armed()` fills the disk

    def fill_if_armed(self) -> None:
        if not self.armed:
            return
        self.armed = False
        fd = os.open(self.folder / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            fill_disk(fd)
        finally:
            os.close(fd)

    def free(self) -> None:
        if self.folder is not None and (self.folder / "filler").exists():
            (self.folder / "filler").unlink()


disk = SmallDisk()
step_ledger: list = []  # the backend a step of "hf.swallow" writes to itself, when it does


@pytest.fixture
def small_disk(tmp_path):
    with tmpfs(tmp_path / "small-disk", "2m") as folder:
        disk.folder = folder
        try:
            yield disk
        finally:
            disk.armed = False
            disk.folder = None


def work(fills: bool, writes_itself: bool) -> str:
    """A step that may fill the disk (when armed), and may then call the ledger itself."""
    calls["work"] += 1
    if fills:
        disk.fill_if_armed()
    if writes_itself:
        step_ledger[0].stores.put("audit", '"worked"')
    return "worked"


def fallback() -> str:
    calls["fallback"] += 1
    return "fell back"


@registry.workflow("hf.swallow")
def swallow(ctx, input):
    """A workflow that would take another path on any error around its steps."""
    try:
        if input["where"] == "a start":
            ctx.run("work", work, False, False)
            disk.fill_if_armed()  # between steps, in the workflow's own code
            ctx.start("child", "hf.shipment")
        else:
            ctx.run("work", work, True, input["where"] == "the step's own ledger call")
    except Exception:
        return ctx.run("fallback", fallback)
    return "ok"


def claim(ledger):
    (lease,) = ledger.executions.claim_due(limit=1, duration=LEASE_MS)
    return lease


@pytest.mark.parametrize("where", ["the step's write", "the step's own ledger call", "a start"])
def test_finding_2_a_full_disk_in_a_delivery_is_a_retry_and_the_execution_completes_once_it_clears(
        small_disk, where):
    clock = FakeClock()
    with open_backend(small_disk.folder / "ledger.db", clock=clock, redelivery_delay=lambda n: 1) as ledger:
        step_ledger.append(ledger)
        ledger.executions.admit("e1", "hf.swallow", json.dumps({"where": where}))
        lease = claim(ledger)
        small_disk.armed = True

        outcome = run_delivery(ledger, lease, registry)

        assert not small_disk.armed, "the disk was never filled"
        assert isinstance(outcome, Retry), outcome
        assert outcome.storage_error == "unavailable" and "full" in outcome.reason
        assert calls["fallback"] == 0  # `except Exception` did not catch the failed write
        record = ledger.executions.get("e1")
        assert (record.status, record.error_json) == ("running", None)
        assert [r.step_key for r in ledger.heap.steps("e1")] == (["work"] if where == "a start" else [])

        small_disk.free()
        assert ledger.executions.release(lease).status == "released"
        clock.advance(1)
        lease = claim(ledger)
        assert run_delivery(ledger, lease, registry) == Completed('"ok"')
        ledger.executions.acknowledge(lease, Completed('"ok"'))

        assert ledger.executions.get("e1").status == "completed"
        assert calls == {"work": 1 if where == "a start" else 2}  # the unrecorded step ran again
        assert [r.step_key for r in ledger.heap.steps("e1")] == (["work", "child"] if where == "a start" else ["work"])


server = {"down": False, "goes_down": False}  # the database server behind "hf.clocked"'s clock


@registry.workflow("hf.clocked")
def clocked(ctx, input):
    if server["goes_down"]:  # after the delivery's own reads, just before the workflow asks the time
        server["goes_down"], server["down"] = False, True
    try:
        started = ctx.now_ms()
    except Exception:
        return ctx.run("fallback", fallback)
    return ctx.run("work", work, False, False) + f" at {started}"


def test_finding_2_a_clock_that_cannot_reach_its_database_unwinds_the_workflow(tmp_path):
    """On a backend whose clock is its database server's, reading the time is a ledger call."""
    clock = FakeClock()

    def server_clock() -> int:
        if server["down"]:
            raise StorageUnavailable("could not reach the database server for its clock")
        return clock()

    with open_backend(tmp_path / "ledger.db", clock=clock, redelivery_delay=lambda n: 1) as ledger, \
            open_backend(tmp_path / "ledger.db", clock=server_clock) as child:
        ledger.executions.admit("e1", "hf.clocked")
        lease = claim(ledger)
        server["goes_down"] = True

        outcome = run_delivery(child, lease, registry)

        assert outcome == Retry("could not reach the database server for its clock", storage_error="unavailable")
        assert server["down"] and calls == {}  # the time was asked for, and nothing ran past it
        server["down"] = False
        ledger.executions.release(lease)
        clock.advance(1)
        lease = claim(ledger)
        assert run_delivery(child, lease, registry) == Completed(json.dumps(f"worked at {clock.now}"))


@registry.workflow("hf.two_steps")
def two_steps(ctx, input):
    first = ctx.run("first", lambda: "one")
    ctx.sleep("pause", 1)
    return [first, ctx.run("second", lambda: "two")]


def test_finding_2_a_corrupt_ledger_ends_the_delivery_as_a_retry_naming_corruption(tmp_path):
    path = tmp_path / "ledger.db"
    clock = FakeClock()
    with open_backend(path, clock=clock, redelivery_delay=lambda n: 1) as ledger:
        ledger.executions.admit("e1", "hf.two_steps")
        lease = claim(ledger)
        assert run_delivery(ledger, lease, registry) == Suspended()
        ledger.executions.acknowledge(lease, Suspended())
    damage_table(path, "steps")  # the execution's recorded steps: read at the start of a delivery
    clock.advance(1_000)

    with open_backend(path, clock=clock, redelivery_delay=lambda n: 1) as ledger:
        lease = claim(ledger)
        outcome = run_delivery(ledger, lease, registry)

        assert isinstance(outcome, Retry) and outcome.storage_error == "corrupt", outcome
        assert ledger.executions.get("e1").status == "running"  # not failed: the supervisor stops on it

        ledger.executions.release(lease)
        with pytest.raises(WorkflowStuck, match="unusable.*corrupt"):  # the in-process runner says so too
            run_workflow(registry, "hf.two_steps", execution_id="e1", backend=ledger, clock=clock)


# -- finding 7: a wake found early costs at most one extra delivery --------------------------------

@registry.workflow("hf.nap")
def nap(ctx, input):
    ctx.sleep("nap", 10)
    return "rested"


def test_finding_7_a_wake_found_early_costs_at_most_one_extra_delivery(tmp_path):
    path = tmp_path / "ledger.db"
    claimer_clock = FakeClock()  # the clock that decides claimability: the supervisor's claims
    # The child's clock runs 5 s behind the claimer's.
    with open_backend(path, clock=claimer_clock, redelivery_delay=lambda n: 1) as supervisor, \
            open_backend(path, clock=lambda: claimer_clock.now - 5_000) as child:
        supervisor.executions.admit("e1", "hf.nap")
        due = None
        after_due = 0
        for _ in range(50):
            leases = supervisor.executions.claim_due(limit=1, duration=LEASE_MS)
            if not leases:
                claimer_clock.now = supervisor.executions.next_ready_at()
                continue
            (lease,) = leases
            claimed_at = claimer_clock.now
            outcome = run_delivery(child, lease, registry, claimed_at=claimed_at)
            assert supervisor.executions.acknowledge(lease, outcome) == outcome
            if due is not None and claimed_at >= due:
                after_due += 1
            if outcome.status == "completed":
                break
            due = json.loads(supervisor.heap.read_step("e1", "nap").step_response_json)["until"]
        else:
            pytest.fail(f"not completed after 50 deliveries, {after_due} of them after the timer was due")

        assert outcome == Completed('"rested"')
        assert 1 <= after_due <= 2
        assert len(supervisor.executions.history("e1")) <= 3
