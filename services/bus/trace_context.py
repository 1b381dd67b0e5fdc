"""W3C trace context carried in NATS headers, so one request's spans line up across gateway, decode and vocoder.

The gateway's request span goes out in the `traceparent` (and `tracestate`) header of the request it puts on
REQUESTS; decode continues it from that message and puts its own span's context on every codes message of the
request; the vocoder continues from each codes message and puts its span's context on the terminal event.

Only the OpenTelemetry API is used here. With no SDK configured (`services.runtime.tracing`) its tracer records
nothing and costs next to nothing, but an incoming trace context still passes through unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACER_NAME = "voxmesh"
REQUEST_ID = "voxmesh.request_id"  # the span attribute naming the request (the same id as its subjects)

_propagator = TraceContextTextMapPropagator()


def tracer() -> trace.Tracer:
    """voxmesh's tracer, from whatever provider is installed when it is asked for (none: a no-op one)."""
    return trace.get_tracer(TRACER_NAME)


def inject(headers: dict[str, str] | None = None, *, context: Context | None = None) -> dict[str, str]:
    """`headers` (or a new dict) with the trace context of `context` (default: the current one) added."""
    carrier = dict(headers or {})
    _propagator.inject(carrier, context=context)
    return carrier


def extract(headers: Mapping[str, str] | None) -> Context:
    """The trace context a message's headers carry (an empty context when they carry none)."""
    return _propagator.extract(dict(headers or {}))


def span_context(span: trace.Span) -> Context:
    """A context whose current span is `span`, for a span that is not made current (it outlives a task)."""
    return trace.set_span_in_context(span)
