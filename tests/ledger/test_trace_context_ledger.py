"""The trace context of a start (SPEC section 13), on each backend: `admit(trace_context=)` and a
child start's `trace_context=` are stored with the execution and come back with every claim of
it (first deliveries and later ones, by `claim_deliveries` and by a batch that acknowledges and
claims), a repeat admission keeps the first context, and bad input is refused naming
`trace_context` with nothing written."""

from __future__ import annotations

import json

import pytest

from supervisor import InvalidArgument, Suspended

pytestmark = pytest.mark.timeout(60)

LEASE_MS = 60_000
CONTEXT = json.dumps({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                      "tracestate": "vendor=abc"})


def claimed_by_id(claims) -> dict:
    return {each.lease.execution_id: each for each in claims}


def test_a_stored_trace_context_comes_back_with_every_claim_of_its_execution(backend, clock):
    backend.executions.admit("traced", "wf", trace_context=CONTEXT)
    backend.executions.admit("untraced", "wf")
    first = claimed_by_id(backend.executions.claim_deliveries(limit=10, duration=LEASE_MS))
    assert first["traced"].trace_context == CONTEXT and first["traced"].input_json == "null"
    assert first["untraced"].trace_context is None
    # A later delivery (no input sent: the worker reads its steps) carries it too, from the
    # batch that acknowledges the first one and claims again.
    backend.executions.request_wake("traced", clock.now)
    replies, again = backend.executions.acknowledge_and_claim_deliveries(
        [(first["traced"].lease, Suspended())], limit=10, duration=LEASE_MS)
    assert replies == [Suspended()]
    (second,) = again
    assert second.lease.token == 2 and second.input_json is None and second.trace_context == CONTEXT


def test_a_repeat_admission_keeps_the_first_context_and_does_not_conflict(backend):
    first = backend.executions.admit("again", "wf", trace_context=CONTEXT)
    other = json.dumps({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
    assert backend.executions.admit("again", "wf", trace_context=other) == first
    assert backend.executions.admit("again", "wf") == first
    (claimed,) = backend.executions.claim_deliveries(limit=10, duration=LEASE_MS)
    assert claimed.trace_context == CONTEXT


def test_a_child_start_stores_its_trace_context(backend):
    backend.executions.admit("parent", "wf")
    child = backend.starts.start("parent:child", "child-wf", "1", parent="parent", trace_context=CONTEXT)
    plain = backend.starts.start("parent:plain", "child-wf", "2", parent="parent")
    claimed = claimed_by_id(backend.executions.claim_deliveries(limit=10, duration=LEASE_MS))
    assert claimed[child].trace_context == CONTEXT and claimed[child].input_json == "1"
    assert claimed[plain].trace_context is None and claimed["parent"].trace_context is None


@pytest.mark.parametrize("bad, says", [
    (42, "must be a JSON str"),
    ("not json", "not valid JSON"),
    ('["00-abc"]', "JSON object of str values"),
    ('{"traceparent": 1}', "JSON object of str values"),
    (json.dumps({"baggage": "x" * 20_000}), "at most 16384"),
])
def test_a_bad_trace_context_is_refused_naming_it_and_nothing_is_written(backend, each_backend, db_snapshot, bad, says):
    backend.executions.admit("parent", "wf")
    before = db_snapshot(each_backend)
    with pytest.raises(InvalidArgument, match="^trace_context ") as refused:
        backend.executions.admit("bad", "wf", trace_context=bad)
    with pytest.raises(InvalidArgument, match="trace_context"):
        backend.starts.start("parent:bad", "wf", parent="parent", trace_context=bad)
    assert says in str(refused.value)
    assert db_snapshot(each_backend) == before
