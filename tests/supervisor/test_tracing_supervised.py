"""OpenTelemetry traces with real processes (SPEC section 13), on a SQLite file: this test starts
executions inside a span of its own, a supervisor runs them in its worker processes, whose app
(`tests/apps/traced_app.py`) sets a tracer provider up and appends every finished span to a file,
and the spans read back from that file make one trace: each delivery a `yieldstar.delivery` span,
a child of the starter's span, with its execution, workflow, token and outcome; each step attempt
a `yieldstar.step` span, a child of its delivery, with its key and attempt (a retried step's two
attempts two spans, the failed one with an error status); the app's own span inside a step a child
of the step's; a child workflow's deliveries children of the delivery that started it; a start
made outside any span a trace of its own. In workers of one delivery and of several (sync
workflows on threads, async ones as tasks), for sync and async workflows alike. The app's batch
processor, a thread it starts on import, does not keep its workers from being forked from the
template process, and each forked worker exports its own spans.
"""

from __future__ import annotations

import json
import os
import signal
from collections import defaultdict

import psutil
import pytest
from opentelemetry.sdk.trace import TracerProvider

from faults import TESTS, wait_until
from supervisor import open_backend
from worker import Client
from worker._runtime.template import WORKER_FLAG

pytestmark = [pytest.mark.usefixtures("dump_on_hang"), pytest.mark.timeout(120)]

APP = str(TESTS / "apps" / "traced_app.py")


def read_spans(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("workers", [None, 1], ids=["a-process-per-delivery", "one-worker-of-several"])
def test_deliveries_and_step_attempts_are_spans_in_the_trace_of_the_span_that_started_them(
        tmp_path, supervisors, workers):
    db, spans_file = tmp_path / "ledger.db", tmp_path / "spans.jsonl"
    starter = TracerProvider().get_tracer("test")  # not the process's global provider: a span is enough
    with Client(db) as client:
        with starter.start_as_current_span("checkout") as checkout:
            for workflow in ("traced.order", "traced.async_order"):
                client.start(workflow, 7, id=workflow)
            client.start("traced.broken", id="broken")
        client.start("traced.ship", 8, id="untraced")  # outside any span
    started = checkout.get_span_context()
    trace_id, checkout_id = f"{started.trace_id:032x}", f"{started.span_id:016x}"

    process = supervisors.start(db, app=APP, concurrency=4, workers=workers, until_idle=True, ready=False,
                                env={"TRACED_SPANS": str(spans_file)})
    assert process.wait(90) == 0, process.log()
    spans = read_spans(spans_file)
    assert spans, process.log()
    deliveries = [s for s in spans if s["name"] == "yieldstar.delivery"]
    by_execution = defaultdict(list)
    for span in deliveries:
        by_execution[span["attributes"]["yieldstar.execution_id"]].append(span)
    for spans_of in by_execution.values():
        spans_of.sort(key=lambda s: s["attributes"]["yieldstar.token"])
    delivery_of = {s["span_id"]: s for s in deliveries}
    # Every span came from a worker process, and every delivery was traced once.
    assert os.getpid() not in {s["pid"] for s in spans}
    assert len(delivery_of) == len(deliveries)

    for workflow in ("traced.order", "traced.async_order"):
        # reserve and charge (failed), then charge again, start the child and wait, then the end
        # (in delivery 2 itself when the child, run by another worker, finished before the wait).
        order = by_execution[workflow]
        assert [(s["attributes"]["yieldstar.token"], s["attributes"]["yieldstar.outcome"]) for s in order] in (
            [(1, "suspended"), (2, "suspended"), (3, "completed")], [(1, "suspended"), (2, "completed")]), order
        for span in order:
            assert span["trace_id"] == trace_id and span["parent_id"] == checkout_id
            assert span["attributes"]["yieldstar.workflow"] == workflow
        steps = [s for s in spans if s["name"] == "yieldstar.step" and s["parent_id"] in {d["span_id"] for d in order}]
        assert sorted((delivery_of[s["parent_id"]]["attributes"]["yieldstar.token"], s["attributes"]["yieldstar.step_key"],
                       s["attributes"]["yieldstar.attempt"], s["status"]) for s in steps) == [
            (1, "charge", 1, "ERROR"), (1, "reserve", 1, "UNSET"), (2, "charge", 2, "UNSET")]
        assert all(s["trace_id"] == trace_id for s in steps)
        failed_charge = next(s for s in steps if s["attributes"]["yieldstar.attempt"] == 1
                             and s["attributes"]["yieldstar.step_key"] == "charge")
        assert failed_charge["events"] == ["exception"]
        # The app's span inside each attempt of the charge is a child of that attempt's span.
        charges = {s["span_id"] for s in steps if s["attributes"]["yieldstar.step_key"] == "charge"}
        assert len([s for s in spans if s["name"] == "app.charge" and s["parent_id"] in charges]) == 2
        # The child started in delivery 2 runs in that delivery's trace, as its child.
        (child,) = [e for e in by_execution if e.startswith(workflow + "/")]
        (child_delivery,) = by_execution[child]
        assert child_delivery["parent_id"] == order[1]["span_id"] and child_delivery["trace_id"] == trace_id
        assert child_delivery["attributes"]["yieldstar.workflow"] == "traced.ship"
        assert child_delivery["attributes"]["yieldstar.outcome"] == "completed"
        (label,) = [s for s in spans if s["parent_id"] == child_delivery["span_id"]]
        assert label["name"] == "yieldstar.step" and label["attributes"]["yieldstar.step_key"] == "label"

    (broken,) = by_execution["broken"]
    assert broken["parent_id"] == checkout_id and broken["attributes"]["yieldstar.outcome"] == "failed"
    assert broken["status"] == "ERROR"
    (untraced,) = by_execution["untraced"]
    assert untraced["parent_id"] is None and untraced["trace_id"] != trace_id
    assert sorted(by_execution) == ["broken", "traced.async_order", "traced.async_order/ship", "traced.order",
                                    "traced.order/ship", "untraced"]


def test_an_app_whose_provider_has_a_batch_processor_gets_forked_workers_and_each_exports_its_spans(
        tmp_path, supervisors):
    db, spans_file = tmp_path / "ledger.db", tmp_path / "spans.jsonl"
    starter = TracerProvider().get_tracer("test")
    with Client(db) as client:
        with starter.start_as_current_span("checkout") as checkout:
            for i in range(6):
                client.start("traced.ship", i, id=f"ship-{i}")
    supervisor = supervisors.start(db, app=APP, concurrency=2, env={"TRACED_SPANS": str(spans_file)})
    workers = supervisor.workers()
    # Forked from the template (which wrote the worker's flag over its own), not fresh interpreters.
    assert all(psutil.Process(pid).cmdline()[2] == WORKER_FLAG for pid in workers), supervisor.log()
    assert "cannot be forked" not in supervisor.log()

    def all_completed() -> bool:
        with open_backend(db) as backend:
            return all(backend.executions.get(f"ship-{i}").status == "completed" for i in range(6))

    wait_until(all_completed, timeout=30, message="the six executions completed")
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(60) == 0, supervisor.log()
    # Each worker's batch processor, started anew in it by OpenTelemetry, exported its spans at its exit.
    spans = read_spans(spans_file)
    deliveries = [s for s in spans if s["name"] == "yieldstar.delivery"]
    started = checkout.get_span_context()
    assert sorted(s["attributes"]["yieldstar.execution_id"] for s in deliveries) == [f"ship-{i}" for i in range(6)]
    assert all(s["trace_id"] == f"{started.trace_id:032x}" and s["parent_id"] == f"{started.span_id:016x}"
               for s in deliveries)
    steps = {s["parent_id"] for s in spans if s["name"] == "yieldstar.step"}
    assert steps == {s["span_id"] for s in deliveries}
    assert {s["pid"] for s in spans} <= set(workers)
