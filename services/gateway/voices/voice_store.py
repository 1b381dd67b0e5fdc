"""The gateway's access to voice cloning's object stores: reference audio put by content key, saved voices listed,
read, deleted, and created by asking a decode replica to compute them.

A reference is stored once per content: the segments of a long input and of a WebSocket session, and clients
sending the same recording again, reuse its key. The REF_AUDIO store expires objects; a key stored more than half
that age ago is stored again before a request names it, so it cannot expire under a request.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass

import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.object_store import ObjectStore

from messages import DecodeError, decode, encode, subjects
from messages.errors import ErrorCode, Stage
from messages.voice_clone import (REF_AUDIO_STORE, VOICES_STORE, ReferenceAudio, VoiceCreate, VoiceCreated,
                             saved_voice_key, saved_voice_prefix)
from services.bus.errors import NotProvisioned
from services.bus.object_store import (StoredObject, delete_object, list_objects, object_info, open_object_store,
                                       write_object)
from services.gateway.errors import GatewayError
from services.gateway.voices.reference_audio import ReferenceClip, read_reference

CREATE_TIMEOUT_S = 120.0
"""A decode replica computes a voice in well under a second on a GPU; a CPU under load takes longer."""
_RECENT_REFERENCES = 256


@dataclass(frozen=True, slots=True)
class StoredReference:
    key: str
    duration_s: float
    stored_at: float
    """time.monotonic() of the put."""


class VoiceStore:
    """Reference audio and saved voices of one model (the gateway's served model)."""

    def __init__(self, nc: Client, js: JetStreamContext, model: str) -> None:
        self.nc, self.js, self.model = nc, js, model
        self._stores: dict[str, ObjectStore] = {}
        self._ref_ttl_s: float | None = None
        self._recent: OrderedDict[bytes, StoredReference] = OrderedDict()
        """Hash of a data URI -> where its audio is stored: a URI seen again is neither decoded nor stored again."""

    async def _store(self, name: str) -> ObjectStore:
        if name not in self._stores:
            try:
                self._stores[name] = await open_object_store(self.js, name)
            except NotProvisioned as exc:
                raise GatewayError(ErrorCode.INTERNAL, str(exc), status=503) from exc
        return self._stores[name]

    async def reference(self, data_uri: str, param: str = "ref_audio") -> StoredReference:
        """Store a client's reference audio (decoded and checked off the event loop); its key and duration."""
        uri_hash = hashlib.sha256(data_uri.encode()).digest()
        known = self._recent.get(uri_hash)
        if known is not None and time.monotonic() - known.stored_at < await self._refresh_after_s():
            self._recent.move_to_end(uri_hash)
            return known
        clip: ReferenceClip = await asyncio.to_thread(read_reference, data_uri, param)
        audio = ReferenceAudio(sample_rate=clip.sample_rate, samples=clip.samples.astype("<f4").tobytes())
        try:
            await write_object(await self._store(REF_AUDIO_STORE), clip.key, encode(audio))
        except (nats.errors.Error, asyncio.TimeoutError) as exc:
            raise GatewayError(ErrorCode.INTERNAL, f"could not store the reference audio ({exc!r}); retry shortly",
                               status=503) from exc
        stored = StoredReference(clip.key, clip.duration_s, time.monotonic())
        self._recent[uri_hash] = stored
        while len(self._recent) > _RECENT_REFERENCES:
            self._recent.popitem(last=False)
        return stored

    async def _refresh_after_s(self) -> float:
        if self._ref_ttl_s is None:
            status = await (await self._store(REF_AUDIO_STORE)).status()
            self._ref_ttl_s = status.ttl or float("inf")
        return self._ref_ttl_s / 2

    async def saved(self, name: str) -> StoredObject | None:
        """The saved voice `name` of this model, or None."""
        try:
            key = saved_voice_key(self.model, name)
        except ValueError:
            return None
        return await object_info(await self._store(VOICES_STORE), key)

    async def saved_voices(self) -> list[StoredObject]:
        """This model's saved voices, by name (object names without the model's prefix)."""
        prefix = saved_voice_prefix(self.model)
        found = await list_objects(await self._store(VOICES_STORE), prefix)
        return [StoredObject(o.name[len(prefix):], o.revision, o.size, o.modified, o.description) for o in found]

    async def delete(self, name: str) -> bool:
        if await self.saved(name) is None:
            return False
        return await delete_object(await self._store(VOICES_STORE), saved_voice_key(self.model, name))

    async def create(self, name: str, data_uri: str, ref_text: str | None, x_vector_only: bool) -> VoiceCreated:
        """Store the reference, have a decode replica of the model compute and save the voice; its answer.
        Raises GatewayError: the replica's refusal (a bad reference: 400), or no replica to ask (503)."""
        reference = await self.reference(data_uri, "audio")
        request = VoiceCreate(name=name, model=self.model, audio_key=reference.key, ref_text=ref_text,
                              x_vector_only=x_vector_only)
        try:
            reply = await self.nc.request(subjects.voice_create(self.model), encode(request), timeout=CREATE_TIMEOUT_S)
        except nats.errors.NoRespondersError as exc:
            raise GatewayError(ErrorCode.INTERNAL, f"no decode replica of {self.model!r} is running to compute the "
                               "voice; retry once the mesh is up", status=503) from exc
        except (nats.errors.Error, asyncio.TimeoutError) as exc:
            raise GatewayError(ErrorCode.TIMEOUT, f"computing the voice did not finish ({exc!r}); retry",
                               status=504) from exc
        try:
            created = decode(reply.data, VoiceCreated)
        except DecodeError as exc:
            raise GatewayError(ErrorCode.INTERNAL, f"decode's answer was unreadable: {exc}", status=502) from exc
        if created.error is not None:
            raise GatewayError(created.error.code, created.error.message, param="audio", stage=Stage.DECODE)
        return created
