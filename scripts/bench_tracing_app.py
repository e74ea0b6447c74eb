"""The benchmark workflows (`worker.apps.bench`) in an app that sets an OpenTelemetry tracer
provider up, for `scripts/bench_tracing.py`: a batch processor, as production would use, and an
exporter that only counts the spans, so that the figures are the runtime's and the SDK's work,
not an exporter's I/O. Loaded by path."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from worker.apps.bench import echo1, noop3  # noqa: F401 - registers the workflows


class CountingExporter(SpanExporter):
    exported = 0

    def export(self, spans) -> SpanExportResult:
        CountingExporter.exported += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(CountingExporter()))
trace.set_tracer_provider(provider)
