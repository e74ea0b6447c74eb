"""The app of the supervised tracing tests (SPEC section 13): it sets OpenTelemetry's tracer
provider up as an app would, in its module, with a batch processor (whose spans a worker must
flush before it exits) and an exporter that appends each finished span as a JSON line to the file
`$TRACED_SPANS` names, from every process that imports it.

`traced.order` (sync) and `traced.async_order` (async) reserve, charge (the first attempt fails
and is retried: one flag file per execution under `$TRACED_SPANS`), start `traced.ship` as a
child and wait for it; the charge step makes a span of the app's own. `traced.broken` fails.
"""

from __future__ import annotations

import json
import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from worker import RetryableError, workflow


class JsonLinesExporter(SpanExporter):
    """Each span as one JSON line, appended in one write (several processes share the file)."""

    def __init__(self, path: str):
        self.path = path

    def export(self, spans) -> SpanExportResult:
        lines = "".join(json.dumps(as_dict(span)) + "\n" for span in spans)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, lines.encode())
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def as_dict(span) -> dict:
    context = span.get_span_context()
    return {"name": span.name, "trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}",
            "parent_id": None if span.parent is None else f"{span.parent.span_id:016x}",
            "attributes": dict(span.attributes), "status": span.status.status_code.name,
            "events": [event.name for event in span.events], "pid": os.getpid()}


SPANS = os.environ.get("TRACED_SPANS")
if SPANS:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(JsonLinesExporter(SPANS)))
    trace.set_tracer_provider(provider)

tracer = trace.get_tracer("traced_app")


def charge(execution_id: str) -> str:
    with tracer.start_as_current_span("app.charge"):
        try:  # the first attempt of each execution fails, and is retried at once
            os.close(os.open(f"{SPANS}.charged.{execution_id}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return "charged"
        raise RetryableError("the card was declined", interval=0.01)


@workflow("traced.order")
def order(ctx, input):
    ctx.run("reserve", lambda: "reserved")
    ctx.run("charge", charge, ctx.execution_id)
    shipped = ctx.wait_for(ctx.start("ship", "traced.ship", input))
    return {"order": input, "shipped": shipped}


@workflow("traced.async_order")
async def async_order(ctx, input):
    async def reserve():
        return "reserved"

    async def async_charge():
        return charge(ctx.execution_id)

    await ctx.run("reserve", reserve)
    await ctx.run("charge", async_charge)
    shipped = await ctx.wait_for(await ctx.start("ship", "traced.ship", input))
    return {"order": input, "shipped": shipped}


@workflow("traced.ship")
def ship(ctx, input):
    return ctx.run("label", lambda: f"label-{input}")


@workflow("traced.broken")
def broken(ctx, input):
    raise ValueError("no such product")
