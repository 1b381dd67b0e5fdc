"""The gateway's side of one request's flow, shared by the HTTP and WebSocket endpoints.

Admit the body, subscribe to the request's audio and terminal event FIRST, then put the request on REQUESTS (a full
queue is a 429) and announce it (`accepted`), hand the stream to the caller, and when the caller leaves before the
request ended, tell the supervisor the client is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from messages import encode, subjects
from messages.errors import ErrorCode
from messages.events import Accepted, event_subject
from messages.requests import SynthesisRequest
from messages.streams import EVENTS_STREAM
from services.bus.errors import NotProvisioned, QueueFull
from services.bus.logs import request_context
from services.bus.submit import submit_request
from services.gateway.errors import GatewayError, Overloaded
from services.gateway.requests.audio_stream import AudioStream
from services.gateway.requests.body import SynthesisFields
from services.gateway.requests.outcome_metrics import GatewayMetrics
from services.gateway.requests.repair import RepairPolicy
from services.gateway.requests.supervisor import Supervisor
from services.gateway.requests.validation import AdmissionPolicy
from services.gateway.voices.cloning import voice_clone
from services.gateway.voices.voice_store import VoiceStore

log = logging.getLogger(__name__)

# ~100 text tokens and, under the runaway guard, ~1,700 frames: far inside decode's default max_model_len (4096).
DEFAULT_SEGMENT_CHARS = 400


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
        voices: reference audio and saved voices (base models clone a voice); None: no cloning.
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
    voices: VoiceStore | None = None

    @contextlib.asynccontextmanager
    async def synthesize(self, fields: SynthesisFields, *,
                         request_id: str | None = None) -> AsyncIterator[AudioStream]:
        """Admit and start one request (under `request_id`, or a fresh id); yields its AudioStream (iterate
        `stream.chunks()`).

        Raises AdmissionError (400), Overloaded (429) or GatewayError before yielding; every GatewayError raised
        inside carries the request id."""
        try:
            request = self.admission.admit(fields, request_id=request_id)
            clone = await voice_clone(fields, self.admission.catalog, self.voices)
        except GatewayError as error:
            self.metrics.refused(error)
            raise
        if clone is not None:
            request = msgspec.structs.replace(request, clone=clone)
        with request_context(request.id):
            stream = AudioStream(self.nc, self.supervisor.terminals, request.id, subjects.partition_for(request.id, self.num_partitions),
                                 self.repair)
            try:
                async with stream:  # subscribed before the request exists anywhere, so nothing is missed
                    # Watched before it is published: a client that leaves during the publish is still noticed.
                    self.supervisor.watch(request, stream.partition, None, stream)
                    try:
                        self.supervisor.queued(request.id, await self._submit(request))
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

    async def _submit(self, request: SynthesisRequest) -> int:
        try:
            return await submit_request(self.js, request)
        except QueueFull as exc:
            raise Overloaded(f"the request queue is full; retry in {self.retry_after_s}s", self.retry_after_s) \
                from exc
        except NotProvisioned as exc:
            raise GatewayError(ErrorCode.INTERNAL, f"the mesh is not provisioned: {exc}", status=503) from exc
        except (nats.errors.Error, asyncio.TimeoutError) as exc:
            raise GatewayError(ErrorCode.INTERNAL, f"could not queue the request ({exc!r}); retry shortly",
                               status=503) from exc

    async def _announce(self, request: SynthesisRequest) -> None:
        event = Accepted(request_id=request.id, at=time.time(), model=request.model, seed=request.seed,
                         text_chars=len(request.text))
        try:
            await self.js.publish(event_subject(event), encode(event), stream=EVENTS_STREAM)
        except Exception as exc:  # the audit trail is not worth failing an admitted request for
            log.warning("could not publish the accepted event: %r", exc)
