"""One request's spans line up across gateway, decode and vocoder: the W3C trace context travels in NATS headers.

The three services run in this process (the real gateway, decode and vocoder on a real nats-server), with an
OpenTelemetry SDK provider whose spans land in memory; nothing but the message headers connects their spans, since
each service's handlers run in tasks of their own connection. Exporting is off unless configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider

from messages import subjects
from messages.streams import CODES_STREAM
from services.bus.trace_context import REQUEST_ID
from services.decode import service as decode_service
from services.decode.settings import DecodeSettings
from services.runtime.tracing import TracingConfigError, configure_tracing, exporter_name
from services.vocoder import service as vocoder_service
from services.vocoder.service import VocoderSettings
from tests.support.gateway_fixtures import gateway_app, gateway_settings
from tests.support.gateway_standin import MODEL, NUM_PARTITIONS

WAIT_S = 120.0


class SpanLog(SpanProcessor):
    """Ended spans, kept while recording; wakes a waiter (on its loop) whenever one ends."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []
        self.recording = False
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    def on_end(self, span: ReadableSpan) -> None:
        if not self.recording:
            return
        with self._lock:
            self.spans.append(span)
            for loop, event in self._waiters:
                loop.call_soon_threadsafe(event.set)

    def of_request(self, request_id: str) -> list[ReadableSpan]:
        with self._lock:
            return [span for span in self.spans if span.attributes.get(REQUEST_ID) == request_id]

    async def until(self, found) -> None:
        """Until `found()` is true of the spans so far."""
        event = asyncio.Event()
        waiter = (asyncio.get_running_loop(), event)
        with self._lock:
            self._waiters.append(waiter)
        try:
            while not found():
                await asyncio.wait_for(event.wait(), WAIT_S)
                event.clear()
        finally:
            with self._lock:
                self._waiters.remove(waiter)


_SPANS = SpanLog()


@pytest.fixture(scope="module")
def span_log() -> Iterator[SpanLog]:
    """The process's tracer provider records into `_SPANS` while this module's tests run (a provider is set once
    per process; the API's proxy tracers, which the services hold, follow it)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(_SPANS)
        trace.set_tracer_provider(provider)
    _SPANS.recording = True
    try:
        yield _SPANS
    finally:
        _SPANS.recording = False


@contextlib.asynccontextmanager
async def decode_and_vocoder(url: str, checkpoint) -> AsyncIterator[None]:
    common = dict(nats_url=url, model_dir=str(checkpoint), model_name=MODEL, num_partitions=NUM_PARTITIONS)
    stop = asyncio.Event()
    services = [asyncio.create_task(decode_service.serve(DecodeSettings(replica="decode-traced", shutdown_grace_s=0.0,
                                                                        **common), stop)),
                asyncio.create_task(vocoder_service.serve(VocoderSettings(replica="vocoder-traced", **common), stop))]
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*services), WAIT_S)


async def test_one_requests_spans_form_one_trace_from_gateway_through_decode_to_vocoder(
        span_log, gateway_bus, tiny_checkpoint):
    settings = gateway_settings(gateway_bus, tiny_checkpoint, vocoder_grace_s=WAIT_S)
    async with decode_and_vocoder(gateway_bus.url, tiny_checkpoint), gateway_app(settings) as app:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway",
                                     timeout=WAIT_S) as client:
            response = await client.post("/v1/audio/speech", json={"model": MODEL, "input": "Trace me.",
                                                                   "voice": "vivian", "max_new_tokens": 8})
        assert response.status_code == 200, response.text
        request_id = response.headers["x-request-id"]

        def names() -> list[str]:
            return [span.name for span in span_log.of_request(request_id)]

        # The gateway's span ends with the response, decode's when the request leaves it, the vocoder's per message.
        await span_log.until(lambda: {"gateway.request", "decode.request"} <= set(names())
                             and any(span.attributes.get("voxmesh.message") == "CodesEnd"
                                     for span in span_log.of_request(request_id)))
        codes_headers = await _codes_headers(gateway_bus.js, request_id)

    spans = span_log.of_request(request_id)
    by_name = {span.name: [s for s in spans if s.name == span.name] for span in spans}
    (gateway,), (decode,) = by_name["gateway.request"], by_name["decode.request"]
    trace_id = gateway.context.trace_id
    assert all(span.context.trace_id == trace_id for span in spans), [(s.name, s.context.trace_id) for s in spans]
    # Under FastAPI's own HTTP span, when FastAPI makes one: either way it starts in the gateway, not on the bus.
    assert gateway.kind is trace.SpanKind.PRODUCER and (gateway.parent is None or not gateway.parent.is_remote)
    assert decode.parent.span_id == gateway.context.span_id and decode.parent.is_remote
    vocoder = by_name["vocoder.codes"]
    assert {span.attributes["voxmesh.message"] for span in vocoder} >= {"TakeoverMarker", "CodesChunk", "CodesEnd"}
    assert all(span.parent.span_id == decode.context.span_id and span.parent.is_remote for span in vocoder)
    # What carried it: every codes message of the request has decode's span in its `traceparent` header.
    expected = f"00-{trace_id:032x}-{decode.context.span_id:016x}-"  # then the flags (sampled)
    assert codes_headers and all(headers.get("traceparent", "").startswith(expected) for headers in codes_headers), \
        codes_headers


async def _codes_headers(js, request_id: str) -> list[dict[str, str]]:
    """The headers of every message of the request on CODES, in order."""
    subject = subjects.codes(subjects.partition_for(request_id, NUM_PARTITIONS), request_id)
    info = await js.stream_info(CODES_STREAM, subjects_filter=subject)
    count = (info.state.subjects or {}).get(subject, 0)
    sub = await js.subscribe(subject, stream=CODES_STREAM, ordered_consumer=True)
    try:
        return [dict((await sub.next_msg(timeout=WAIT_S)).headers or {}) for _ in range(count)]
    finally:
        await sub.unsubscribe()


def test_exporting_is_off_unless_configured():
    assert exporter_name({}) == "none"
    assert exporter_name({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}) == "otlp"
    assert exporter_name({"OTEL_TRACES_EXPORTER": "console"}) == "console"
    assert exporter_name({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}) == "none"
    with pytest.raises(TracingConfigError, match="choose one of otlp, console, none"):
        exporter_name({"OTEL_TRACES_EXPORTER": "zipkin"})
    before = trace.get_tracer_provider()
    configure_tracing("decode", {})()  # nothing installed, and the returned stop is a no-op
    assert trace.get_tracer_provider() is before
