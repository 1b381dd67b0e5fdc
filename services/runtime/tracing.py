"""Exporting a service's spans: off unless configured, with OpenTelemetry's own environment variables.

The services always carry the W3C trace context across the bus (`services.bus.trace_context`); whether their spans
go anywhere is this module's choice, made once per process from the standard variables:

- `OTEL_TRACES_EXPORTER`: `otlp` (OTLP over HTTP to `OTEL_EXPORTER_OTLP_ENDPOINT` or
  `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), `console` (JSON on stderr) or `none`. Left unset it is `otlp` when an
  endpoint is set, `none` otherwise.
- `OTEL_SERVICE_NAME`: default `voxmesh-<service>`.

Exporting needs the SDK and the OTLP exporter (`pip install 'voxmesh[tracing]'`; the image has them).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

EXPORTER = "OTEL_TRACES_EXPORTER"
ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
SERVICE_NAME = "OTEL_SERVICE_NAME"
EXPORTERS = ("otlp", "console", "none")


class TracingConfigError(ValueError):
    """The tracing variables ask for an exporter that is unknown or not installed; the message says what to do."""


def exporter_name(environ: Mapping[str, str]) -> str:
    """The exporter the environment asks for (`none` when nothing is configured)."""
    name = environ.get(EXPORTER, "").strip().lower()
    if not name:
        return "otlp" if any(environ.get(variable) for variable in ENDPOINTS) else "none"
    if name not in EXPORTERS:
        raise TracingConfigError(f"{EXPORTER}={name!r}: choose one of {', '.join(EXPORTERS)}")
    return name


def configure_tracing(service: str, environ: Mapping[str, str] | None = None) -> Callable[[], None]:
    """Install a tracer provider exporting this process's spans if the environment asks for it; returns the call
    that flushes and stops it at exit (a no-op when nothing was installed)."""
    environ = os.environ if environ is None else environ
    name = exporter_name(environ)
    if name == "none":
        return lambda: None
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as error:
        raise TracingConfigError(f"{EXPORTER}={name} needs the OpenTelemetry SDK: pip install 'voxmesh[tracing]' "
                                 f"({error})") from None
    if name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as error:
            raise TracingConfigError(f"the OTLP exporter is not installed: pip install 'voxmesh[tracing]' "
                                     f"({error})") from None
        exporter = OTLPSpanExporter()  # reads the endpoint, headers and timeout from the OTEL_* variables
    else:
        exporter = ConsoleSpanExporter()
    resource = Resource.create({"service.name": environ.get(SERVICE_NAME) or f"voxmesh-{service}"})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    log.info("tracing: exporting spans with the %s exporter", name)
    return provider.shutdown
