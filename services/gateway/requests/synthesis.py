"""The gateway's side of one request's flow, shared by the HTTP and WebSocket endpoints.

Admit the body (a 429 when this gateway already has its limit of live requests), subscribe to the request's audio
and terminal event FIRST, then put the request on REQUESTS (a full queue is a 429) and announce it (`accepted`), hand
the stream to the caller, and when the caller leaves before the request ended, tell the supervisor the client is
gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from messages import encode, subjects
from messages.errors import ErrorCode
from messages.events import Accepted, event_subject
from messages.requests import SynthesisRequest
from messages.streams import EVENTS_STREAM
from services.bus.ack_retry import is_transient, publish_acked
from services.bus.errors import NotProvisioned, QueueFull
from services.bus.fencing import MSG_ID
from services.bus.logs import request_context
from services.bus.submit import submit_request
from services.gateway.requests.prefill_route import PrefillRoute
from services.bus.trace_context import REQUEST_ID, inject, span_context, tracer
from services.gateway.errors import GatewayError, Overloaded
from services.gateway.requests.audio_stream import AudioStream, ClientBuffer
from services.gateway.requests.body import SynthesisFields
from services.gateway.requests.bus_watch import BusOutagePolicy
from services.gateway.requests.outcome_metrics import GatewayMetrics
from services.gateway.requests.repair import RepairPolicy
from services.gateway.requests.supervisor import Supervisor
from services.gateway.requests.validation import AdmissionPolicy
from services.gateway.tenancy.gate import TenantGate
from services.gateway.tenancy.tenant import Tenant, anonymous
from services.gateway.voices.cloning import voice_clone
from services.gateway.voices.voice_store import VoiceStore

log = logging.getLogger(__name__)

# ~100 text tokens and, under the runaway guard, ~1,700 frames: far inside decode's default max_model_len (4096).
DEFAULT_SEGMENT_CHARS = 400
# The longest request decode's default --max-new-frames allows (2048 frames, 164 s), so a client that plays its
# audio in real time as it arrives is never cut; 8.6 MB of PCM at most per request.
DEFAULT_CLIENT_BUFFER_S = 180.0
# The bound of the REQUESTS queue by default (BusConfig.max_queued_requests): one gateway alone can fill the queue,
# but not hold more requests than the mesh would keep.
DEFAULT_MAX_LIVE_REQUESTS = 256
SLOW_CLIENT_REASON = "the client read its audio too slowly (the gateway's buffer for it overflowed)"


@dataclass(slots=True)
class Synthesizer:
    """Starts requests on the mesh and streams their audio back.

    Attributes:
        nc, js, kv: the gateway's NATS connection, JetStream context and the `voxmesh` bucket.
        admission: validation and limits.
        supervisor: ends requests nobody else can end.
        num_partitions: vocoder partitions (must match provisioning).
        repair: gap-repair patience.
        retry_after_s: the Retry-After of a 429.
        metrics: outcomes, first packet, RTF and active streams of the requests started here.
        segment_chars: the longest text one request of an HTTP input carries; a longer input is split at sentence
            ends into ordered requests (http/segmented_speech.py), so none outgrows decode's max_model_len.
        max_live_requests: requests this gateway holds at once (queued, generating, streaming, parked); one more
            is refused with 429 `too_many_requests`.
        client_buffer_s: seconds of a request's audio held for a client that reads slower than the mesh makes it;
            past them the request is cancelled in every stage and ends with `slow_client`.
        outage: how long a stream may hear neither audio nor EVENTS before its client gets `bus_unavailable`.
        voices: reference audio and saved voices (base models clone a voice); None: no cloning.
        gate: the keys' limits shared by every gateway (tenancy/); None: no per-key limits.
    """

    nc: Client
    js: JetStreamContext
    kv: KeyValue
    admission: AdmissionPolicy
    supervisor: Supervisor
    num_partitions: int
    repair: RepairPolicy = RepairPolicy()
    retry_after_s: int = 1
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)
    segment_chars: int = DEFAULT_SEGMENT_CHARS
    max_live_requests: int = DEFAULT_MAX_LIVE_REQUESTS
    client_buffer_s: float = DEFAULT_CLIENT_BUFFER_S
    outage: BusOutagePolicy = BusOutagePolicy()

    def audio_stream(self, request_id: str, partition: int) -> AudioStream:
        """A stream of one request's audio, holding at most `client_buffer_s` of it for its client."""
        on_overflow = functools.partial(self.supervisor.cancel, request_id, SLOW_CLIENT_REASON,
                                        ErrorCode.SLOW_CLIENT)
        return AudioStream(self.nc, self.supervisor.terminals, request_id, partition, self.repair,
                           ClientBuffer(self.client_buffer_s, on_overflow), self.outage)
    voices: VoiceStore | None = None
    prefill_route: PrefillRoute | None = None
    """Sends long prompts to a free prefill replica (None: decode prefills every prompt)."""
    gate: TenantGate | None = None

    @contextlib.asynccontextmanager
    async def synthesize(self, fields: SynthesisFields, *, request_id: str | None = None,
                         tenant: Tenant | None = None, admitted: bool = False) -> AsyncIterator[AudioStream]:
        """Admit and start one request (under `request_id`, or a fresh id) for `tenant` (None: the anonymous one);
        yields its AudioStream (iterate `stream.chunks()`). `admitted`: the caller already holds the tenant's
        admission for this request (the segments of one HTTP input share the input's).

        Raises AdmissionError (400), Overloaded or LimitRefused (429) or GatewayError before yielding; every
        GatewayError raised inside carries the request id."""
        tenant = tenant if tenant is not None else anonymous()
        try:
            request = self.admission.admit(fields, request_id=request_id, tenant=tenant)
            self._check_room()
        except GatewayError as error:
            self.metrics.refused(error)
            raise
        live = self.supervisor.live
        live.hold(request.id)  # in the same step as the check: concurrent admissions cannot overshoot the limit
        try:
            async with contextlib.AsyncExitStack() as stack:
                if not admitted:
                    await stack.enter_async_context(self.tenant_admission(tenant))
                async with self._admitted(request, fields, tenant) as stream:
                    yield stream
        finally:
            live.release(request.id)

    @contextlib.asynccontextmanager
    async def tenant_admission(self, tenant: Tenant) -> AsyncIterator[None]:
        """Hold one admission under `tenant`'s limits for the block (no gate: nothing to hold). Raises LimitRefused
        (429) before entering."""
        if self.gate is None:
            yield
            return
        try:
            admission = await self.gate.admit(tenant)
        except GatewayError as error:
            self.metrics.refused(error)
            raise
        try:
            yield
        finally:
            await self.gate.release(admission)

    @contextlib.asynccontextmanager
    async def _admitted(self, request: SynthesisRequest, fields: SynthesisFields,
                        tenant: Tenant) -> AsyncIterator[AudioStream]:
        """`synthesize` once the request holds its place: store a reference audio, then start it."""
        try:  # a reference audio is stored (and checked) before the request is
            clone = await voice_clone(fields, self.admission.catalog, self.voices)
        except GatewayError as error:
            self.metrics.refused(error)
            raise
        if clone is not None:
            request = msgspec.structs.replace(request, clone=clone)
        async with self._started(request, tenant) as stream:
            yield stream

    def _check_room(self) -> None:
        if len(self.supervisor.live) >= self.max_live_requests:
            raise Overloaded(f"this gateway has {self.max_live_requests} requests in flight (--max-live-requests); "
                             f"retry in {self.retry_after_s}s", self.retry_after_s, ErrorCode.TOO_MANY_REQUESTS)

    @contextlib.asynccontextmanager
    async def _started(self, request: SynthesisRequest, tenant: Tenant) -> AsyncIterator[AudioStream]:
        """`synthesize` once admitted: listen, submit, announce, stream."""
        with request_context(request.id), _request_span(request) as span:
            stream = self.audio_stream(request.id, subjects.partition_for(request.id, self.num_partitions))
            try:
                async with stream:  # subscribed before the request exists anywhere, so nothing is missed
                    # Watched before it is published: a client that leaves during the publish is still noticed.
                    self.supervisor.watch(request, stream.partition, None, stream)
                    try:
                        self.supervisor.queued(request.id, await self._submit(request, span))
                        if self.gate is not None:  # its audio counts against the key's day once it ends
                            self.gate.charge_when_ended(request.id, tenant)
                    except GatewayError as error:
                        self.supervisor.forget(request.id)  # it never reached the queue
                        self.metrics.refused(error)
                        raise
                    except asyncio.CancelledError:
                        self.supervisor.client_gone(request.id)  # it may have reached the queue
                        raise
                    try:
                        with self.metrics.streaming(request, stream):
                            await self._announce(request)
                            yield stream
                    finally:
                        if stream.terminal is None:
                            log.info("client left before the request ended")
                            self.supervisor.client_gone(request.id)
                        else:  # ended; also covers a terminal that overtook watch()
                            self.supervisor.forget(request.id)
            except GatewayError as error:
                error.request_id = request.id
                raise

    async def check_voice(self, fields: SynthesisFields) -> None:
        """Refuse a bad reference (or cloning fields the model cannot take) before any text is sent; the reference
        is stored on the way, so the requests that follow find it."""
        await voice_clone(fields, self.admission.catalog, self.voices)

    async def _submit(self, request: SynthesisRequest, span: Span) -> int:
        try:  # the request carries its span's W3C trace context: decode and the vocoder continue the trace
            subject = await self.prefill_route.subject_for(request) if self.prefill_route is not None else None
            return await submit_request(self.js, request, headers=inject(context=span_context(span)),
                                        subject=subject)
        except QueueFull as exc:
            raise Overloaded(f"the request queue is full; retry in {self.retry_after_s}s", self.retry_after_s) \
                from exc
        except NotProvisioned as exc:
            raise GatewayError(ErrorCode.INTERNAL, f"the mesh is not provisioned: {exc}", status=503) from exc
        except (nats.errors.Error, asyncio.TimeoutError) as exc:
            if is_transient(exc):  # still so after the publish's own retries: the bus is out of reach from here
                raise GatewayError(ErrorCode.BUS_UNAVAILABLE, f"could not queue the request: the bus did not "
                                   f"acknowledge it ({exc!r}); this gateway's NATS server is cut off from the mesh "
                                   "or has no quorum: retry shortly, or through another gateway", status=503) \
                    from exc
            raise GatewayError(ErrorCode.INTERNAL, f"could not queue the request ({exc!r}); retry shortly",
                               status=503) from exc

    async def _announce(self, request: SynthesisRequest) -> None:
        event = Accepted(request_id=request.id, at=time.time(), model=request.model, seed=request.seed,
                         text_chars=len(request.text), tenant=request.tenant)
        try:  # retried through a leader election with one Msg-Id, as every lifecycle event: stored once, not lost
            await publish_acked(self.js, event_subject(event), encode(event), stream=EVENTS_STREAM,
                                headers={MSG_ID: f"{request.id}:{Accepted.KIND}"})
        except Exception as exc:  # the audit trail is not worth failing an admitted request for
            log.warning("could not publish the accepted event: %r", exc)


@contextlib.contextmanager
def _request_span(request: SynthesisRequest) -> Iterator[Span]:
    """The request's `gateway.request` span, from admission until its response is done (not made current: the
    response may be streamed from another task); an error that ends the request marks it."""
    span = tracer().start_span("gateway.request", kind=SpanKind.PRODUCER,
                               attributes={REQUEST_ID: request.id, "voxmesh.model": request.model})
    try:
        yield span
    except GatewayError as error:
        span.set_status(Status(StatusCode.ERROR, f"{error.code.value}: {error}"))
        raise
    finally:
        span.end()
