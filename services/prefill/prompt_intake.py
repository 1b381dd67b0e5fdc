"""Taking requests from the prefill queue: prefill each, offer its KV by UCX, hand it to decode, ack.

A cloned voice's prompt is computed here (`VoicePrompts`, beside the engine loop) and handed to decode with the request,
so decode does no audio work for it. A request this replica cannot prefill (another model, bad fields, reference audio
it cannot use, a prompt its pool cannot hold) is put on decode's own queue unchanged: decode serves it or ends it with
the one terminal event it owes, as for any request, so prefill never ends a request itself. A replica that dies
mid-prefill leaves the message unacked: it is redelivered (a new attempt) to a live replica. A hand-off published twice
(redelivery after a publish whose ack was lost) is harmless: decode's ownership claim takes the first, and acks the
second.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from nats.js import JetStreamContext, api

from messages import encode, subjects
from messages.mtp import PrefillHandoff
from messages.requests import SynthesisRequest
from messages.streams import REQUESTS_STREAM
from services.bus.errors import QueueFull
from services.bus.pull_consumer import Capacity, Delivery
from services.bus.submit import submit_request
from services.decode.request_check import Admission, RequestRefused, ServedModel, admit
from services.decode.voice_prompts import VoicePrompts
from services.decode.voice_records import ready_voice
from services.prefill.prefiller import PrefillRefused, Prefiller
from services.prefill.settings import PrefillSettings
from services.transfer.agent import KvTransferAgent

log = logging.getLogger(__name__)

REQUEUE_RETRY_S = 1.0  # decode's queue was full: try again after this


@dataclass(slots=True)
class PrefillCounts:
    handed_over: int = 0
    sent_to_decode: int = 0


class PrefillIntake:
    """The handler of the prefill queue's pull consumer."""

    def __init__(self, js: JetStreamContext, prefiller: Prefiller, agent: KvTransferAgent, served: ServedModel,
                 settings: PrefillSettings, replica: str, capacity: Capacity, fingerprint: str,
                 voices: VoicePrompts | None = None) -> None:
        self.js, self.prefiller, self.agent = js, prefiller, agent
        self.served, self.settings, self.replica, self.capacity = served, settings, replica, capacity
        self.fingerprint = fingerprint
        """The checkpoint's (`checkpoint_fingerprint`): decode refuses KV made from another checkpoint."""
        self.voices = voices
        """A base checkpoint's voice prompts (None: this checkpoint does not clone)."""
        self.counts = PrefillCounts()

    async def handle(self, request: SynthesisRequest, delivery: Delivery) -> None:
        """One request (its capacity slot is given back once it is handed on; a raise leaves that to the consumer,
        which also naks the message)."""
        admission, why = await self._admitted(request)
        if admission is None:
            await self._to_decode(request, delivery, why)
            return
        attempt = delivery.num_delivered
        try:
            done = await self.prefiller.prefill(f"{request.id}:{attempt}", admission)
        except PrefillRefused as exc:
            await self._to_decode(request, delivery, str(exc))
            return
        transfer = self.agent.offer(request.id, attempt, done.prompt_kv, self.settings.handoff_ttl_s)
        voice = admission.prompt.voice
        handoff = PrefillHandoff(request=request, fingerprint=self.fingerprint, prefill_replica=self.replica,
                                 prompt_tokens=done.num_prompt_tokens, attempt=attempt, transfer=transfer,
                                 first_frame=done.first_frame.tolist(),
                                 voice=None if voice is None else ready_voice(voice))
        headers = {**delivery.headers, api.Header.MSG_ID.value: f"{request.id}:handoff:{attempt}"}
        await self.js.publish(subjects.handoff_queue(request.model), encode(handoff), stream=REQUESTS_STREAM,
                              headers=headers)
        await delivery.ack()
        self.counts.handed_over += 1
        self.capacity.release()

    async def _admitted(self, request: SynthesisRequest) -> tuple[Admission | None, str]:
        """The request ready for the engine (with its voice prompt, if cloned), or None and why decode should have it
        instead (decode then ends a bad one with its one terminal event)."""
        if request.clone is not None and self.voices is None:
            return None, "a cloned voice, which this checkpoint cannot clone"
        try:
            admission = admit(request, self.served, self.settings)
            if request.clone is not None:
                admission = await self.voices.attach(admission)
            return admission, ""
        except RequestRefused as exc:
            return None, exc.message

    async def _to_decode(self, request: SynthesisRequest, delivery: Delivery, why: str) -> None:
        log.info("request %s goes to decode unprefilled (%s)", request.id, why)
        try:
            await submit_request(self.js, request, headers=delivery.headers, msg_id=f"{request.id}:unprefilled")
        except QueueFull:
            await delivery.nak(REQUEUE_RETRY_S)
        else:
            await delivery.ack()
            self.counts.sent_to_decode += 1
        self.capacity.release()
