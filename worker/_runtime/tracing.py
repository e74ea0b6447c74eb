"""OpenTelemetry traces of deliveries and step attempts, joined to the trace of their start
(SPEC section 13; `pip install 'yieldstar[otel]'`).

    process that starts                ledger                      worker process
    client.start in a span ---> executions.trace_context ---> claim -> Run.trace_context
      (`current_context`: the                                       |
       propagator's carrier,                                 span yieldstar.delivery, child
       as JSON)                                              of the stored context
                                                               +- span yieldstar.step per
    ctx.start in a delivery --> the child's trace_context         step attempt
      (`DeliveryTrace.child_context`: the delivery span's)

A delivery is one span `yieldstar.delivery` (attributes `yieldstar.execution_id`,
`yieldstar.workflow`, `yieldstar.token`, `yieldstar.outcome`: the outcome its worker reports,
`completed`, `failed`, `suspended`, `retry` or `lost`), a child of the context its execution's
start stored, in whichever process or host runs it; each attempt of a step that runs a function
(`ctx.run`, `ctx.effect`, an item of `ctx.parallel`) is a span `yieldstar.step`
(`yieldstar.step_key`, `yieldstar.attempt`), a child of its delivery's span and the current span
while the step's function runs, so that the spans the function makes are its children. A replayed
step runs nothing and has no span. A workflow that failed, and an attempt whose function raised,
end with an error status.

Who traces: the process's global tracer provider, as the app's module (which every worker
imports) or OpenTelemetry's own environment variables (`OTEL_PYTHON_TRACER_PROVIDER`, or the
`opentelemetry-instrument` launcher) set it. It costs nothing where nobody set one: a process that
has not imported OpenTelemetry, and has no such variable, has set no provider, and this module
then imports nothing and answers None at a dictionary look-up (`sys.modules`); one that imported
it but set no provider (the API's proxy) answers None once it has asked the API for the provider.
A delivery's trace is decided when it starts, so an app that sets its provider late traces the
deliveries after that.

The stored trace context is the propagator's carrier (a W3C `traceparent`, and whatever else the
process's propagators write: `tracestate`, `baggage`) as JSON text, written and read with the
global propagator (`opentelemetry.propagate`), as any service in the trace would.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any, Optional

from supervisor.ledger.values import DeliveryOutcome, ExecutionLease, Failed

DELIVERY_SPAN = "yieldstar.delivery"
STEP_SPAN = "yieldstar.step"
# The variable by which OpenTelemetry's API loads a tracer provider by itself, in a process that
# has not imported it yet (`opentelemetry.environment_variables`).
PROVIDER_VARIABLE = "OTEL_PYTHON_TRACER_PROVIDER"

# (provider, tracer): the tracer of the provider last seen, or None for a provider that records
# nothing; replaced when the app sets another provider. Read and written whole (one tuple).
_seen: tuple[Any, Any] = (None, None)
_traced = False  # some delivery of this process was traced: its spans may wait in a batch
# OpenTelemetry's functions that each step calls, bound where a provider is first seen (until
# then this module has imported nothing of it).
_attach = _detach = _set_span_in_context = _Context = None


def _opentelemetry_trace():
    """OpenTelemetry's `trace` module if this process may have a provider set, else None
    (without importing anything: see the module doc)."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None and PROVIDER_VARIABLE in os.environ:
        try:
            from opentelemetry import trace
        except ImportError:  # the variable is set, but the extra is not installed
            return None
    return trace


def _tracer():
    """The tracer of the global provider, or None where no provider is set."""
    global _seen, _attach, _detach, _set_span_in_context, _Context
    trace = _opentelemetry_trace()
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    seen, tracer = _seen
    if provider is not seen:
        none_set = isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))
        tracer = None if none_set else provider.get_tracer("yieldstar")
        if tracer is not None and _attach is None:
            from opentelemetry.context import Context, attach, detach

            _attach, _detach, _set_span_in_context, _Context = attach, detach, trace.set_span_in_context, Context
        _seen = (provider, tracer)
    return tracer


def current_context() -> Optional[str]:
    """The trace context of the span current in the caller, as a start stores it (the global
    propagator's carrier as JSON text), or None outside any span."""
    trace = sys.modules.get("opentelemetry.trace")  # no span can be current where it is not loaded
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    return _inject(None)


def _inject(context) -> Optional[str]:
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    return json.dumps(carrier, separators=(",", ":"), sort_keys=True) if carrier else None


def begin_delivery(lease: ExecutionLease, trace_context: Optional[str],
                   workflow: Optional[str] = None) -> Optional["DeliveryTrace"]:
    """Start the span of the delivery of `lease` (a child of `trace_context`, the one its start
    stored), or None if this process traces nothing."""
    tracer = _tracer()
    if tracer is None:
        return None
    return DeliveryTrace(tracer, lease, trace_context, workflow)


def _parent(trace_context: Optional[str]):
    """The context a start stored, as the global propagator reads it back; an empty one where
    none was stored: nothing to read (nor the propagators to load), and the delivery's span
    starts a trace of its own."""
    if not trace_context:
        return _Context()
    # A context stored by an older or foreign writer that is not a carrier starts a trace of its
    # own rather than failing the delivery (the ledger checks what it stores).
    try:
        carrier = json.loads(trace_context)
    except ValueError:
        return _Context()
    if not isinstance(carrier, dict):
        return _Context()
    from opentelemetry import propagate

    return propagate.extract(carrier, context=_Context())


class DeliveryTrace:
    """The span of one delivery, and what its steps and child starts need of it.

    Its hooks are on every delivery's and every step's path, so they do no more than the spans
    need: the stored context is read once, where there is one; the attributes are given once,
    at the span's start or (those known only at its end) in one call; a step's span is made
    current by attaching a context, the cheapest way OpenTelemetry offers (no context manager),
    and an attempt that did not raise records nothing more."""

    __slots__ = ("_tracer", "_workflow", "span", "context")

    def __init__(self, tracer, lease: ExecutionLease, trace_context: Optional[str], workflow: Optional[str]):
        global _traced
        from opentelemetry import trace

        _traced = True
        self._tracer = tracer
        self._workflow = workflow
        parent = _parent(trace_context)
        attributes = {"yieldstar.execution_id": lease.execution_id, "yieldstar.token": lease.token}
        if workflow is not None:
            attributes["yieldstar.workflow"] = workflow
        self.span = tracer.start_span(DELIVERY_SPAN, context=parent, kind=trace.SpanKind.CONSUMER,
                                      attributes=attributes)
        # The starter's context (its baggage included), with this delivery's span current in it.
        self.context = trace.set_span_in_context(self.span, parent)

    def attach(self) -> object:
        """Make the delivery's span current in the calling thread or task; returns the token for
        `detach`."""
        return _attach(self.context)

    def detach(self, token: object) -> None:
        _detach(token)

    def step(self, key: str, attempt: int) -> "StepSpan":
        """The span of attempt `attempt` of step `key`, started, and current in the caller."""
        return StepSpan(self, key, attempt)

    def child_context(self) -> Optional[str]:
        """The trace context a start made in this delivery stores: its span's."""
        return _inject(self.context)

    def end(self, outcome: DeliveryOutcome, workflow: Optional[str]) -> None:
        span = self.span
        if workflow is None or workflow == self._workflow:  # known at the start, and given then
            span.set_attribute("yieldstar.outcome", outcome.status)
        else:
            span.set_attributes({"yieldstar.workflow": workflow, "yieldstar.outcome": outcome.status})
        if isinstance(outcome, Failed):
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, _error_summary(outcome.error_json)))
        span.end()


def _error_summary(error_json: str) -> str:
    """"Type: message" of a failed workflow's error."""
    try:
        error = json.loads(error_json)
    except ValueError:
        return error_json
    if not isinstance(error, dict):
        return str(error)
    return f"{error.get('type', 'Error')}: {error.get('message', '')}"


class StepSpan:
    """The span of one step attempt, current in the caller from its start to `end`."""

    __slots__ = ("span", "_token")

    def __init__(self, delivery: DeliveryTrace, key: str, attempt: int):
        self.span = span = delivery._tracer.start_span(
            STEP_SPAN, context=delivery.context, attributes={"yieldstar.step_key": key, "yieldstar.attempt": attempt})
        self._token = _attach(_set_span_in_context(span, delivery.context))

    def failed(self, exc: BaseException) -> None:
        """The attempt's function raised `exc` (recorded as the attempt's error)."""
        from opentelemetry.trace import Status, StatusCode

        self.span.record_exception(exc)
        self.span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))

    def end(self) -> None:
        _detach(self._token)
        self.span.end()


class _NoStep:
    """A step attempt's span where nothing is traced: each call does nothing."""

    __slots__ = ()

    def failed(self, exc: BaseException) -> None:
        pass

    def end(self) -> None:
        pass


NO_STEP = _NoStep()


# The names OpenTelemetry's SDK gives the thread of a batch span processor (since 1.33; before).
BATCH_SPAN_THREADS = ("OtelBatchSpanRecordProcessor", "OtelBatchSpanProcessor")


def batch_span_processor(thread: threading.Thread) -> Optional[Any]:
    """The OpenTelemetry batch span processor whose thread `thread` is, else None.

    Such a thread need not keep a template from forking workers (`worker._runtime.template`):
    the SDK starts it anew in a forked child, with new locks and an empty queue
    (`os.register_at_fork`), and it holds nothing else but while it exports, which it does only
    for spans in its queue; a template that flushed it (`force_flush`) and makes no span never
    forks while it exports. An app that sets a provider up in its module (docs/tracing.md) starts
    one when imported."""
    if thread.name not in BATCH_SPAN_THREADS:
        return None
    owner = getattr(getattr(thread, "_target", None), "__self__", None)  # the bound method it runs
    module = type(owner).__module__
    return owner if module.startswith("opentelemetry.sdk.") and hasattr(owner, "force_flush") else None


def flush(timeout_ms: int = 5000) -> None:
    """Export the spans the provider still holds (a batch processor's queue) before the process
    exits without running `atexit` (`os._exit`); nothing if it traced no delivery."""
    provider = _seen[0]
    force_flush = getattr(provider, "force_flush", None) if _traced else None
    if force_flush is not None:
        try:
            force_flush(timeout_ms)
        except Exception:  # noqa: BLE001 - an exporter's failure must not keep a worker from exiting
            pass
