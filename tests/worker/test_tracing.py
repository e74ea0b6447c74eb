"""OpenTelemetry traces in one process (SPEC section 13): the trace context a start stores, from
`Client.start` and `AsyncClient.start` inside a span; and, in processes of their own (a tracer
provider is global to a process), the spans of in-process deliveries (`worker.testing`): a
process that set no provider imports nothing of OpenTelemetry and traces nothing, and traces from
the moment its app sets one; parallel steps on threads are spans of their delivery; and a provider
that OpenTelemetry's own environment variable names is found without the app importing anything.
The supervised tests (`tests/supervisor/test_tracing_supervised.py`) show it across processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from supervisor import open_backend
from worker import AsyncClient, Client
from worker._runtime.tracing import BATCH_SPAN_THREADS, batch_span_processor

pytestmark = pytest.mark.timeout(60)

TRACEPARENT = "00-{trace_id:032x}-{span_id:016x}-{flags:02x}"


def stored_contexts(db) -> dict:
    with open_backend(db) as backend:
        return {c.lease.execution_id: c.trace_context
                for c in backend.executions.claim_deliveries(limit=10, duration=60_000)}


def traceparent_of(span) -> str:
    context = span.get_span_context()
    return TRACEPARENT.format(trace_id=context.trace_id, span_id=context.span_id, flags=context.trace_flags)


def test_a_start_inside_a_span_stores_its_trace_context_and_one_outside_stores_none(tmp_path):
    tracer = TracerProvider().get_tracer("test")
    db = tmp_path / "ledger.db"
    with Client(db) as client:
        with tracer.start_as_current_span("checkout") as span:
            client.start("wf", 1, id="inside")
        client.start("wf", 2, id="outside")

        async def start_async() -> object:
            async with AsyncClient(db) as aclient:
                with tracer.start_as_current_span("async checkout") as async_span:
                    await aclient.start("wf", 3, id="async")  # its call runs on the client's thread
            return async_span

        async_span = asyncio.run(start_async())
    stored = stored_contexts(db)
    assert json.loads(stored["inside"]) == {"traceparent": traceparent_of(span)}
    assert json.loads(stored["async"]) == {"traceparent": traceparent_of(async_span)}
    assert stored["outside"] is None


def run_script(code: str, **env: str) -> dict:
    """Run `code` in a fresh interpreter; it prints one JSON object, returned."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=50,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}, **env})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


WORKFLOWS = """
import json, sys
from worker import Registry, RetryableError
from worker.testing import run_workflow

registry = Registry()
flaky = []

@registry.workflow("order")
def order(ctx, input):
    ctx.run("reserve", lambda: "ok")
    def charge():
        flaky.append(1)
        if len(flaky) == 1:
            raise RetryableError("declined", interval=0.01)
        return "charged"
    ctx.run("charge", charge)
    return ctx.parallel("pack", lambda item: item * 2, [1, 2, 3])

def loaded():
    return sorted(name for name in sys.modules if name.startswith("opentelemetry"))

def spans(exporter):
    return [{"name": s.name, "trace": s.context.trace_id, "id": s.context.span_id,
             "parent": s.parent.span_id if s.parent else None, "attributes": dict(s.attributes),
             "status": s.status.status_code.name} for s in exporter.get_finished_spans()]
"""


def test_a_process_traces_nothing_and_imports_nothing_of_opentelemetry_until_its_app_sets_a_provider():
    found = run_script(WORKFLOWS + """
before = run_workflow(registry, "order", execution_id="before").status
untouched = loaded()
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
flaky.clear()
# Imported, but no provider set: the API's proxy, which records nothing.
unset = run_workflow(registry, "order", execution_id="unset").status
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
flaky.clear()
with trace.get_tracer("test").start_as_current_span("test") as outer:
    after = run_workflow(registry, "order", execution_id="after").status
print(json.dumps({"statuses": [before, unset, after], "untouched": untouched, "spans": spans(exporter),
                  "outer": [outer.context.trace_id, outer.context.span_id]}))
""")
    assert found["statuses"] == ["completed"] * 3
    assert found["untouched"] == []
    trace_id, outer_id = found["outer"]
    spans = [s for s in found["spans"] if s["name"] != "test"]
    assert all(s["trace"] == trace_id for s in spans)
    deliveries = sorted((s for s in spans if s["name"] == "yieldstar.delivery"),
                        key=lambda s: s["attributes"]["yieldstar.token"])
    assert [(s["attributes"]["yieldstar.execution_id"], s["attributes"]["yieldstar.token"],
             s["attributes"]["yieldstar.workflow"], s["attributes"]["yieldstar.outcome"], s["parent"])
            for s in deliveries] == [("after", 1, "order", "suspended", outer_id), ("after", 2, "order", "completed", outer_id)]
    first, second = (s["id"] for s in deliveries)
    steps = sorted((s["parent"], s["attributes"]["yieldstar.step_key"], s["attributes"]["yieldstar.attempt"], s["status"])
                   for s in spans if s["name"] == "yieldstar.step")
    # The items of ctx.parallel ran on threads of their own, each a span of its delivery.
    assert steps == sorted([(first, "reserve", 1, "UNSET"), (first, "charge", 1, "ERROR"),
                            (second, "charge", 2, "UNSET"),
                            *((second, f"pack[{i}]", 1, "UNSET") for i in range(3))])


def test_a_provider_named_by_opentelemetrys_environment_variable_traces_an_app_that_imports_none():
    found = run_script(WORKFLOWS + """
run_workflow(registry, "order", execution_id="first")
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
exporter = InMemorySpanExporter()
provider = trace.get_tracer_provider()  # the one the variable named, loaded by the first delivery
provider.add_span_processor(SimpleSpanProcessor(exporter))
flaky.clear()
run_workflow(registry, "order", execution_id="second")
print(json.dumps({"provider": type(provider).__module__, "spans": spans(exporter)}))
""", OTEL_PYTHON_TRACER_PROVIDER="sdk_tracer_provider")
    assert found["provider"] == "opentelemetry.sdk.trace"
    deliveries = [s for s in found["spans"] if s["name"] == "yieldstar.delivery"]
    assert [s["attributes"]["yieldstar.execution_id"] for s in deliveries] == ["second", "second"]
    assert all(s["parent"] is None for s in deliveries)  # started outside any span: a trace of its own
    assert len({s["trace"] for s in deliveries}) == 2


def test_a_delivery_reads_a_stored_context_only_where_its_start_stored_one_and_its_steps_see_the_starters_baggage():
    found = run_script(WORKFLOWS + """
from opentelemetry import baggage, context, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
seen = []

@registry.workflow("tenant")
def tenant(ctx, input):
    def look():
        seen.append([baggage.get_baggage("tenant"), trace.get_current_span().get_span_context().span_id])
    ctx.run("look", look)

run_workflow(registry, "tenant", execution_id="untraced")  # started outside any span: nothing stored
read_nothing = "opentelemetry.propagate" not in sys.modules
token = context.attach(baggage.set_baggage("tenant", "acme"))
with trace.get_tracer("test").start_as_current_span("checkout") as outer:
    run_workflow(registry, "tenant", execution_id="traced")
context.detach(token)
print(json.dumps({"read_nothing": read_nothing, "seen": seen, "spans": spans(exporter),
                  "outer": [outer.context.trace_id, outer.context.span_id]}))
""")
    # Nothing stored, nothing to read: the delivery made a trace of its own without the propagator.
    assert found["read_nothing"]
    by_execution = {s["attributes"]["yieldstar.execution_id"]: s for s in found["spans"]
                    if s["name"] == "yieldstar.delivery"}
    assert by_execution["untraced"]["parent"] is None
    trace_id, outer_id = found["outer"]
    traced = by_execution["traced"]
    assert (traced["trace"], traced["parent"]) == (trace_id, outer_id)
    assert traced["attributes"] == {"yieldstar.execution_id": "traced", "yieldstar.token": 1,
                                    "yieldstar.workflow": "tenant", "yieldstar.outcome": "completed"}
    steps = {s["parent"]: s["id"] for s in found["spans"] if s["name"] == "yieldstar.step"}
    # Each step's function ran with its step's span current; the starter's baggage came through the ledger.
    assert found["seen"] == [[None, steps[by_execution["untraced"]["id"]]], ["acme", steps[traced["id"]]]]


def test_only_opentelemetrys_own_batch_span_processor_threads_are_taken_for_threads_a_fork_starts_anew():
    before = set(threading.enumerate())
    processor = BatchSpanProcessor(InMemorySpanExporter())
    gate = threading.Event()
    impostor = threading.Thread(target=gate.wait, name=BATCH_SPAN_THREADS[0], daemon=True)
    impostor.start()
    try:
        (started,) = set(threading.enumerate()) - before - {impostor}
        found = batch_span_processor(started)
        assert found is not None and type(found).__module__.startswith("opentelemetry.sdk.")
        # A thread of the same name that is not the SDK's, and any other thread, are not.
        assert batch_span_processor(impostor) is None
        assert batch_span_processor(threading.main_thread()) is None
    finally:
        gate.set()
        impostor.join()
        processor.shutdown()
