"""A payload above the ledger client's `max_payload_bytes` is refused with `PayloadTooLarge`
naming it, its size and the limit, and nothing is written; one at the limit is written."""

from __future__ import annotations

import pytest

from supervisor import Completed, Failed, InvalidArgument, PayloadTooLarge, open_backend
from supervisor.ledger.arguments import DEFAULT_MAX_PAYLOAD_BYTES
from supervisor.ledger.values import StepWrite

LEASE_MS = 30_000
LIMIT = 64


def text_of(size: int, char: str = "x") -> str:
    """A JSON string of exactly `size` bytes of UTF-8, of `char` (1 to 4 bytes) between quotes."""
    width = len(char.encode())
    assert (size - 2) % width == 0
    return '"' + char * ((size - 2) // width) + '"'


BIG = text_of(LIMIT + 1)
BIG_VALUE = "x" * LIMIT  # a Python value whose JSON is above the limit


@pytest.fixture
def small(each_backend, clock):
    """A ledger opened with a limit of 64 bytes: one admitted execution, one running under a
    lease, a store holding a list almost at the limit, and a counter store."""
    with open_backend(each_backend, clock=clock, max_payload_bytes=LIMIT) as backend:
        backend.executions.admit("idle", "charge")
        backend.executions.admit("order-42", "charge", '{"amount": 5}')
        [lease] = [x for x in backend.executions.claim_due(limit=2, duration=LEASE_MS)
                   if x.execution_id == "order-42"]
        backend.heap.write_step(lease, step_key="charge", step_attempt=0, done=True, step_response_json='"ch_1"')
        backend.stores.set("box", "[" + ",".join([text_of(20)] * 2) + "]")  # 43 bytes
        backend.stores.get_or_create("counter", "1")
        yield backend, lease


def new_state_too_large(state):
    return BIG_VALUE, None


# Each case: (the name the message gives the payload, its size in bytes, call(backend, lease)).
CASES = {
    "admit input": ("input_json", 65, lambda b, l: b.executions.admit("order-1", "charge", BIG)),
    "admit input of 2-byte characters": (
        "input_json", 82, lambda b, l: b.executions.admit("order-1", "charge", text_of(82, "é"))),
    "admit input of 4-byte characters": (
        "input_json", 66, lambda b, l: b.executions.admit("order-1", "charge", text_of(66, "🎉"))),
    "admit input not even JSON": ("input_json", 65, lambda b, l: b.executions.admit("order-1", "charge", "{" * 65)),
    "write_step": ("step_response_json", 65, lambda b, l: b.heap.write_step(
        l, step_key="refund", step_attempt=0, done=True, step_response_json=BIG)),
    "write_steps": ("step_response_json", 65, lambda b, l: b.heap.write_steps(
        [StepWrite(l, "ok", 0, True, "1"), StepWrite(l, "refund", 0, True, BIG)])),
    "acknowledge a result": ("outcome.result_json", 65, lambda b, l: b.executions.acknowledge(l, Completed(BIG))),
    "acknowledge an error": ("outcome.error_json", 65, lambda b, l: b.executions.acknowledge(l, Failed(BIG))),
    "acknowledge_and_claim a result": ("outcome.result_json", 65, lambda b, l: b.executions.acknowledge_and_claim(
        [(l, Completed(BIG))], limit=1, duration=LEASE_MS)),
    "start a child": ("input_json", 65, lambda b, l: b.starts.start("req-1", "charge", BIG, parent="order-42")),
    "settle an effect": ("result_json", 65, lambda b, l: b.effects.settle("charge-fx", BIG)),
    "create a store": ("initial_json", 65, lambda b, l: b.stores.get_or_create("new", BIG)),
    "put an item": ("item_json", 65, lambda b, l: b.stores.put("box", BIG)),
    "put an item that makes the list too large": (
        "store 'box' value", 65, lambda b, l: b.stores.put("box", text_of(21))),
    "set a store": ("state_json", 65, lambda b, l: b.stores.set("box", BIG)),
    "change a store": ("store 'counter' value", 66, lambda b, l: b.stores.change(
        "counter", execution_id="order-42", step_key="bump", change=new_state_too_large)),
    "wait for a match": ("match_json", 65, lambda b, l: b.stores.wait("box", "order-42", 99, match_json=BIG)),
    "cancel with a reason": ("reason", 33 + LIMIT, lambda b, l: b.executions.cancel("idle", reason=BIG_VALUE)),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, size, call", list(CASES.values()), ids=list(CASES))
def test_a_payload_above_the_limit_is_refused_naming_it_its_size_and_the_limit_and_nothing_is_written(
        small, each_backend, db_snapshot, name, size, call):
    backend, lease = small
    before = db_snapshot(each_backend)

    with pytest.raises(PayloadTooLarge) as raised:
        call(backend, lease)

    assert str(raised.value) == (f"{name} is {size} bytes of JSON, above the payload limit of {LIMIT} bytes"
                                 " (max_payload_bytes)")
    assert isinstance(raised.value, InvalidArgument) and isinstance(raised.value, ValueError)
    assert (raised.value.name, raised.value.size, raised.value.limit) == (name, size, LIMIT)
    assert db_snapshot(each_backend) == before
    # The ledger still works, and the lease is still current.
    assert backend.executions.renew(lease, duration=LEASE_MS).status == "renewed"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("char", ["x", "é", "€", "🎉"])
def test_a_payload_at_the_limit_is_written(small, char):
    backend, lease = small
    at_limit = text_of(LIMIT - (LIMIT - 2) % len(char.encode()), char)
    assert len(at_limit.encode()) <= LIMIT

    assert backend.executions.admit("order-1", "charge", at_limit).input_json == at_limit
    record = backend.heap.write_step(lease, step_key="refund", step_attempt=0, done=True,
                                     step_response_json=at_limit)
    assert record.step_response_json == at_limit
    assert backend.executions.acknowledge(lease, Completed(at_limit)).status == "completed"
    assert backend.executions.get("order-42").result_json == at_limit


@pytest.mark.timeout(120)
def test_the_default_limit_is_4_mib_of_json(each_backend, clock, db_snapshot):
    with open_backend(each_backend, clock=clock) as backend:
        assert backend.max_payload_bytes == DEFAULT_MAX_PAYLOAD_BYTES == 4 * 1024 * 1024
        at_limit = text_of(DEFAULT_MAX_PAYLOAD_BYTES)
        backend.executions.admit("at-limit", "charge", at_limit)
        before = db_snapshot(each_backend)

        with pytest.raises(PayloadTooLarge) as raised:
            backend.executions.admit("above", "charge", text_of(DEFAULT_MAX_PAYLOAD_BYTES + 1))

        assert str(raised.value) == ("input_json is 4,194,305 bytes of JSON, above the payload limit of 4,194,304"
                                     " bytes (max_payload_bytes)")
        assert db_snapshot(each_backend) == before
        assert backend.executions.get("at-limit").input_json == at_limit


@pytest.mark.timeout(60)
def test_the_limit_is_each_clients_own_and_every_client_reads_what_is_stored(each_backend, clock):
    with open_backend(each_backend, clock=clock, max_payload_bytes=2 * LIMIT) as generous, \
            open_backend(each_backend, clock=clock, max_payload_bytes=LIMIT) as strict:
        generous.executions.admit("big", "charge", BIG)
        with pytest.raises(PayloadTooLarge):
            strict.executions.admit("big-too", "charge", BIG)
        assert strict.executions.get("big").input_json == BIG
        assert strict.executions.get("big-too") is None
