"""Bad arguments raise ValueError naming the argument, and write nothing (SPEC section 2)."""

from __future__ import annotations

import pytest

from supervisor import Completed, ExecutionLease, Failed, Suspended, open_backend
from supervisor.ledger.values import StepWrite

LEASE_MS = 30_000


class NotAnOutcome:
    status = "completed"
    result_json = "1"


@pytest.fixture
def leased(backend):
    """A ledger with one admitted execution, one running under a lease with a recorded step."""
    backend.executions.admit("idle", "charge")
    backend.executions.admit("order-42", "charge", '{"amount": 5}')
    [lease] = [x for x in backend.executions.claim_due(limit=2, duration=LEASE_MS) if x.execution_id == "order-42"]
    backend.heap.write_step(lease, step_key="charge", step_attempt=0, done=True, step_response_json='"ch_1"')
    return backend, lease


def lease_like(lease):
    return {"execution_id": lease.execution_id, "token": lease.token, "expires_at": lease.expires_at}


# Each case: (argument named in the message, call(backend, lease)).
CASES = {
    # admit
    "admit execution_id int": ("execution_id", lambda b, l: b.executions.admit(42, "charge")),
    "admit execution_id None": ("execution_id", lambda b, l: b.executions.admit(None, "charge")),
    "admit execution_id bytes": ("execution_id", lambda b, l: b.executions.admit(b"order-1", "charge")),
    "admit execution_id empty": ("execution_id", lambda b, l: b.executions.admit("", "charge")),
    "admit execution_id too long": ("execution_id", lambda b, l: b.executions.admit("x" * 256, "charge")),
    "admit execution_id newline": ("execution_id", lambda b, l: b.executions.admit("order\n1", "charge")),
    "admit execution_id NUL": ("execution_id", lambda b, l: b.executions.admit("order\x001", "charge")),
    "admit execution_id DEL": ("execution_id", lambda b, l: b.executions.admit("order\x7f", "charge")),
    "admit execution_id C1 control": ("execution_id", lambda b, l: b.executions.admit("order\x85", "charge")),
    "admit execution_id a space": ("execution_id", lambda b, l: b.executions.admit(" ", "charge")),
    "admit execution_id blank": ("execution_id", lambda b, l: b.executions.admit("   ", "charge")),
    "admit workflow None": ("workflow", lambda b, l: b.executions.admit("order-1", None)),
    "admit workflow blank": ("workflow", lambda b, l: b.executions.admit("order-1", "  ")),
    "admit key blank": ("key", lambda b, l: b.executions.admit("order-1", "charge", key=" ")),
    "admit workflow empty": ("workflow", lambda b, l: b.executions.admit("order-1", "")),
    "admit workflow tab": ("workflow", lambda b, l: b.executions.admit("order-1", "char\tge")),
    "admit input_json truncated": ("input_json", lambda b, l: b.executions.admit("order-1", "charge", '{"a": ')),
    "admit input_json NaN": ("input_json", lambda b, l: b.executions.admit("order-1", "charge", "NaN")),
    "admit input_json nested Infinity": (
        "input_json", lambda b, l: b.executions.admit("order-1", "charge", '{"a": -Infinity}')),
    "admit input_json empty": ("input_json", lambda b, l: b.executions.admit("order-1", "charge", "")),
    "admit input_json trailing": ("input_json", lambda b, l: b.executions.admit("order-1", "charge", "1 2")),
    "admit input_json not str": ("input_json", lambda b, l: b.executions.admit("order-1", "charge", {"a": 1})),
    "admit input_json bytes": ("input_json", lambda b, l: b.executions.admit("order-1", "charge", b"null")),
    "admit now str": ("now", lambda b, l: b.executions.admit("order-1", "charge", now="1000")),
    "admit now float": ("now", lambda b, l: b.executions.admit("order-1", "charge", now=1000.0)),
    "admit now bool": ("now", lambda b, l: b.executions.admit("order-1", "charge", now=True)),
    # get
    "get execution_id empty": ("execution_id", lambda b, l: b.executions.get("")),
    "get execution_id int": ("execution_id", lambda b, l: b.executions.get(42)),
    "get now str": ("now", lambda b, l: b.executions.get("order-42", now="later")),
    "get_with_steps execution_id empty": ("execution_id", lambda b, l: b.executions.get_with_steps("")),
    "get_with_steps execution_id int": ("execution_id", lambda b, l: b.executions.get_with_steps(42)),
    "get_with_steps now str": ("now", lambda b, l: b.executions.get_with_steps("order-42", now="later")),
    # request_wake
    "request_wake execution_id empty": ("execution_id", lambda b, l: b.executions.request_wake("", 5)),
    "request_wake execution_id unknown": ("execution_id", lambda b, l: b.executions.request_wake("nobody", 5)),
    "request_wake at None": ("at", lambda b, l: b.executions.request_wake("idle", None)),
    "request_wake at float": ("at", lambda b, l: b.executions.request_wake("idle", 5.0)),
    "request_wake at bool": ("at", lambda b, l: b.executions.request_wake("idle", False)),
    "request_wake at str": ("at", lambda b, l: b.executions.request_wake("idle", "5")),
    "request_wake now bool": ("now", lambda b, l: b.executions.request_wake("idle", 5, now=True)),
    "request_wake at year 10000": ("at", lambda b, l: b.executions.request_wake("idle", 253_402_300_800_000)),
    "request_wake at before 1970": ("at", lambda b, l: b.executions.request_wake("idle", -1)),
    "list since beyond": ("since", lambda b, l: b.executions.list(since=2 ** 62)),
    # claim_due
    "claim_due limit negative": ("limit", lambda b, l: b.executions.claim_due(limit=-1, duration=LEASE_MS)),
    "claim_due limit float": ("limit", lambda b, l: b.executions.claim_due(limit=1.0, duration=LEASE_MS)),
    "claim_due limit bool": ("limit", lambda b, l: b.executions.claim_due(limit=True, duration=LEASE_MS)),
    "claim_due limit None": ("limit", lambda b, l: b.executions.claim_due(limit=None, duration=LEASE_MS)),
    "claim_due duration zero": ("duration", lambda b, l: b.executions.claim_due(limit=1, duration=0)),
    "claim_due duration negative": ("duration", lambda b, l: b.executions.claim_due(limit=1, duration=-5)),
    "claim_due duration bool": ("duration", lambda b, l: b.executions.claim_due(limit=1, duration=True)),
    "claim_due duration str": ("duration", lambda b, l: b.executions.claim_due(limit=1, duration="30s")),
    "claim_due now float": ("now", lambda b, l: b.executions.claim_due(limit=1, duration=LEASE_MS, now=1.5)),
    "claim_due now bool": ("now", lambda b, l: b.executions.claim_due(limit=1, duration=LEASE_MS, now=False)),
    # renew
    "renew lease None": ("lease", lambda b, l: b.executions.renew(None, duration=LEASE_MS)),
    "renew lease dict": ("lease", lambda b, l: b.executions.renew(lease_like(l), duration=LEASE_MS)),
    "renew lease tuple": ("lease", lambda b, l: b.executions.renew(tuple(lease_like(l).values()), duration=LEASE_MS)),
    "renew duration zero": ("duration", lambda b, l: b.executions.renew(l, duration=0)),
    "renew duration negative": ("duration", lambda b, l: b.executions.renew(l, duration=-1)),
    "renew duration bool": ("duration", lambda b, l: b.executions.renew(l, duration=True)),
    "renew duration float": ("duration", lambda b, l: b.executions.renew(l, duration=100.0)),
    "renew now str": ("now", lambda b, l: b.executions.renew(l, duration=LEASE_MS, now="now")),
    # release
    "release lease str": ("lease", lambda b, l: b.executions.release("order-42")),
    "release lease dict": ("lease", lambda b, l: b.executions.release(lease_like(l))),
    "release now bool": ("now", lambda b, l: b.executions.release(l, now=True)),
    # acknowledge
    "acknowledge lease object": ("lease", lambda b, l: b.executions.acknowledge(object(), Suspended())),
    "acknowledge lease None": ("lease", lambda b, l: b.executions.acknowledge(None, Completed("1"))),
    "acknowledge outcome None": ("outcome", lambda b, l: b.executions.acknowledge(l, None)),
    "acknowledge outcome str": ("outcome", lambda b, l: b.executions.acknowledge(l, "completed")),
    "acknowledge outcome class": ("outcome", lambda b, l: b.executions.acknowledge(l, Suspended)),
    "acknowledge outcome lookalike": ("outcome", lambda b, l: b.executions.acknowledge(l, NotAnOutcome())),
    "acknowledge result_json invalid": ("result_json", lambda b, l: b.executions.acknowledge(l, Completed("{"))),
    "acknowledge result_json NaN": ("result_json", lambda b, l: b.executions.acknowledge(l, Completed("NaN"))),
    "acknowledge result_json None": ("result_json", lambda b, l: b.executions.acknowledge(l, Completed(None))),
    "acknowledge error_json Infinity": ("error_json", lambda b, l: b.executions.acknowledge(l, Failed("Infinity"))),
    "acknowledge error_json int": ("error_json", lambda b, l: b.executions.acknowledge(l, Failed(3))),
    "acknowledge now str": ("now", lambda b, l: b.executions.acknowledge(l, Suspended(), now="x")),
    # write_step
    "write_step lease None": ("lease", lambda b, l: b.heap.write_step(
        None, step_key="s", step_attempt=0, done=True, step_response_json="1")),
    "write_step lease dict": ("lease", lambda b, l: b.heap.write_step(
        lease_like(l), step_key="s", step_attempt=0, done=True, step_response_json="1")),
    # A lease whose token is not a 64-bit int: SQLite would let a token "1" through the fence as 1.
    "write_step lease token str": ("lease", lambda b, l: b.heap.write_step(
        ExecutionLease(l.execution_id, str(l.token), l.expires_at), step_key="s", step_attempt=0, done=True,
        step_response_json="1")),
    "write_step lease token beyond 64 bits": ("lease", lambda b, l: b.heap.write_step(
        ExecutionLease(l.execution_id, 2**64, l.expires_at), step_key="s", step_attempt=0, done=True,
        step_response_json="1")),
    "write_steps lease token str": ("lease", lambda b, l: b.heap.write_steps(
        [StepWrite(l, "s", 0, True, "1"), StepWrite(ExecutionLease(l.execution_id, str(l.token), l.expires_at),
                                                    "t", 0, True, "1")])),
    "write_steps lease execution_id int": ("lease", lambda b, l: b.heap.write_steps(
        [StepWrite(ExecutionLease(42, l.token, l.expires_at), "s", 0, True, "1")])),
    "write_step step_key empty": ("step_key", lambda b, l: b.heap.write_step(
        l, step_key="", step_attempt=0, done=True, step_response_json="1")),
    "write_step step_key int": ("step_key", lambda b, l: b.heap.write_step(
        l, step_key=1, step_attempt=0, done=True, step_response_json="1")),
    "write_step step_key control": ("step_key", lambda b, l: b.heap.write_step(
        l, step_key="s\r", step_attempt=0, done=True, step_response_json="1")),
    "write_step step_key too long": ("step_key", lambda b, l: b.heap.write_step(
        l, step_key="s" * 256, step_attempt=0, done=True, step_response_json="1")),
    "write_step step_attempt negative": ("step_attempt", lambda b, l: b.heap.write_step(
        l, step_key="s", step_attempt=-1, done=True, step_response_json="1")),
    "write_step step_attempt str": ("step_attempt", lambda b, l: b.heap.write_step(
        l, step_key="s", step_attempt="0", done=True, step_response_json="1")),
    "write_step step_attempt bool": ("step_attempt", lambda b, l: b.heap.write_step(
        l, step_key="s", step_attempt=False, done=True, step_response_json="1")),
    "write_step done int": ("done", lambda b, l: b.heap.write_step(
        l, step_key="s", step_attempt=0, done=1, step_response_json="1")),
    "write_step done str": ("done", lambda b, l: b.heap.write_step(
        l, step_key="s", step_attempt=0, done="yes", step_response_json="1")),
    "write_step step_response_json NaN": ("step_response_json", lambda b, l: b.heap.write_step(
        l, step_key="s", step_attempt=0, done=True, step_response_json="NaN")),
    "write_step step_response_json invalid": ("step_response_json", lambda b, l: b.heap.write_step(
        l, step_key="s", step_attempt=0, done=True, step_response_json="{'a': 1}")),
    "write_step step_response_json None": ("step_response_json", lambda b, l: b.heap.write_step(
        l, step_key="s", step_attempt=0, done=True, step_response_json=None)),
    # read_step
    "read_step execution_id empty": ("execution_id", lambda b, l: b.heap.read_step("", "charge")),
    "read_step step_key None": ("step_key", lambda b, l: b.heap.read_step("order-42", None)),
    # fork
    "fork execution_id int": ("execution_id", lambda b, l: b.executions.fork(42, "f", from_step="charge")),
    "fork new_id None": ("new_id", lambda b, l: b.executions.fork("order-42", None, from_step="charge")),
    "fork new_id too long": ("new_id", lambda b, l: b.executions.fork("order-42", "f" * 256, from_step="charge")),
    "fork new_id taken": ("new_id", lambda b, l: b.executions.fork("order-42", "idle", from_step="charge")),
    "fork from_step int": ("from_step", lambda b, l: b.executions.fork("order-42", "f", from_step=1)),
    "fork from_step not recorded": ("from_step", lambda b, l: b.executions.fork("order-42", "f", from_step="ship")),
    "fork trace_context not JSON": ("trace_context", lambda b, l: b.executions.fork(
        "order-42", "f", from_step="charge", trace_context="{")),
    "fork now str": ("now", lambda b, l: b.executions.fork("order-42", "f", from_step="charge", now="soon")),
}


@pytest.mark.parametrize("argument, call", list(CASES.values()), ids=list(CASES))
def test_bad_argument_raises_value_error_naming_it_and_writes_nothing(
        leased, each_backend, db_snapshot, argument, call):
    backend, lease = leased
    before = db_snapshot(each_backend)

    with pytest.raises(ValueError) as raised:
        call(backend, lease)

    assert argument in str(raised.value)
    assert db_snapshot(each_backend) == before
    # The ledger still works, and the lease is still current.
    assert backend.executions.renew(lease, duration=LEASE_MS).status == "renewed"


def increasing_then_decreasing(n):
    return 100 if n < 5 else 50


OPEN_CASES = {
    "path int": ("path", lambda path, clock: open_backend(42, clock=clock)),
    "clock not callable": ("clock", lambda path, clock: open_backend(path, clock=1000)),
    "redelivery_delay not callable": ("redelivery_delay", lambda path, clock: open_backend(
        path, clock=clock, redelivery_delay=1000)),
    "redelivery_delay zero": ("redelivery_delay", lambda path, clock: open_backend(
        path, clock=clock, redelivery_delay=lambda n: 0)),
    "redelivery_delay negative": ("redelivery_delay", lambda path, clock: open_backend(
        path, clock=clock, redelivery_delay=lambda n: -1000)),
    "redelivery_delay float": ("redelivery_delay", lambda path, clock: open_backend(
        path, clock=clock, redelivery_delay=lambda n: 1000.0)),
    "redelivery_delay bool": ("redelivery_delay", lambda path, clock: open_backend(
        path, clock=clock, redelivery_delay=lambda n: True)),
    "redelivery_delay None result": ("redelivery_delay", lambda path, clock: open_backend(
        path, clock=clock, redelivery_delay=lambda n: None)),
    "redelivery_delay decreasing": ("redelivery_delay", lambda path, clock: open_backend(
        path, clock=clock, redelivery_delay=increasing_then_decreasing)),
    "durability unknown": ("durability", lambda path, clock: open_backend(path, clock=clock, durability="fast")),
    "durability upper case": ("durability", lambda path, clock: open_backend(path, clock=clock, durability="FULL")),
    "durability None": ("durability", lambda path, clock: open_backend(path, clock=clock, durability=None)),
    "max_payload_bytes zero": ("max_payload_bytes", lambda path, clock: open_backend(
        path, clock=clock, max_payload_bytes=0)),
    "max_payload_bytes negative": ("max_payload_bytes", lambda path, clock: open_backend(
        path, clock=clock, max_payload_bytes=-1)),
    "max_payload_bytes str": ("max_payload_bytes", lambda path, clock: open_backend(
        path, clock=clock, max_payload_bytes="4MB")),
    "max_payload_bytes float": ("max_payload_bytes", lambda path, clock: open_backend(
        path, clock=clock, max_payload_bytes=4e6)),
    "max_payload_bytes bool": ("max_payload_bytes", lambda path, clock: open_backend(
        path, clock=clock, max_payload_bytes=True)),
}


@pytest.mark.parametrize("argument, call", list(OPEN_CASES.values()), ids=list(OPEN_CASES))
def test_bad_open_backend_argument_raises_value_error_naming_it_and_writes_nothing(
        leased, each_backend, clock, db_snapshot, argument, call):
    before = db_snapshot(each_backend)

    with pytest.raises(ValueError) as raised:
        call(each_backend, clock)

    assert argument in str(raised.value)
    assert db_snapshot(each_backend) == before


@pytest.mark.parametrize("argument, call", list(OPEN_CASES.values()), ids=list(OPEN_CASES))
def test_bad_open_backend_argument_creates_no_file(tmp_path, clock, argument, call):
    path = tmp_path / "new.db"

    with pytest.raises(ValueError) as raised:
        call(path, clock)

    assert argument in str(raised.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("reading", [1.5, "1000", None, True])
def test_a_clock_reading_that_is_not_an_int_raises_value_error_naming_the_clock(
        leased, each_backend, db_snapshot, reading):
    before = db_snapshot(each_backend)
    with open_backend(each_backend, clock=lambda: reading) as backend:
        with pytest.raises(ValueError, match="clock"):
            backend.executions.admit("order-43", "charge")
        with pytest.raises(ValueError, match="clock"):
            backend.executions.claim_due(limit=5, duration=LEASE_MS)
        # An explicit now does not consult the clock.
        assert backend.executions.get("order-42", now=0).status == "running"
    assert db_snapshot(each_backend) == before


def test_a_lease_for_an_unknown_execution_is_lost_not_an_error(leased, each_backend, db_snapshot):
    backend, lease = leased
    ghost = ExecutionLease("nobody", 1, lease.expires_at)
    before = db_snapshot(each_backend)

    assert backend.executions.renew(ghost, duration=LEASE_MS).status == "lost"
    assert backend.executions.release(ghost).status == "lost"
    assert backend.executions.acknowledge(ghost, Completed("1")).status == "lost"
    assert backend.heap.write_step(ghost, step_key="s", step_attempt=0, done=True,
                                   step_response_json="1").status == "lost"
    assert db_snapshot(each_backend) == before
