"""Voice cloning where a prompt is prefilled: the ready voice prompt of a base model's request, computed beside the
step loop (decode's, or a prefill replica's, which hands the prompt to decode with the request: `prime`).

A request names its voice by key: reference audio in the REF_AUDIO store, or a saved voice in VOICES. The audio
work (resampling, mel, speaker encoder, codec encoder) runs on its own thread or process (`voice_work.py`), never on
the engine's thread, and
the result is cached by (key, transcript, mode): the segments of one long input or one WebSocket session, and
every request naming a saved voice, pay for it once. Concurrent requests for one uncached key share one
computation. Saved voices are made here too (`create`, the `voice-create` endpoint: any replica of the model).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import numpy as np
from nats.js import JetStreamContext
from nats.micro.request import Request

from messages import DecodeError, decode, encode
from messages.base import ErrorInfo
from messages.errors import ErrorCode, Stage
from messages.voice_clone import (REF_AUDIO_STORE, VOICES_STORE, ReferenceAudio, SavedVoice, VoiceClone, VoiceCreate,
                             VoiceCreated, saved_voice_key)
from services.bus.object_store import open_object_store, read_object, write_object
from services.decode.request_check import Admission, RequestRefused
from services.decode.voice_records import saved_voice, voice_prompt
from services.decode.voice_work import PromptMaker, VoiceWorkLost
from services.metrics.timings import Timings
from services.model.voice.errors import ReferenceAudioError
from services.model.voice.voice_prompt import VoicePrompt

log = logging.getLogger(__name__)

CACHE_SIZE = 64
"""Voice prompts kept: each is a few kB (an x-vector and up to 375 frames of 16 codes)."""

_CODES = {
    "ref_audio_too_short": ErrorCode.REF_AUDIO_TOO_SHORT,
    "ref_audio_too_long": ErrorCode.REF_AUDIO_TOO_LONG,
    "ref_text_required": ErrorCode.REF_TEXT_REQUIRED,
    "voice_cloning_unsupported": ErrorCode.VOICE_CLONING_UNSUPPORTED,
}
"""The model's reference-audio codes as the bus names them; the rest (unreadable, sample rate) are invalid_ref_audio."""

CacheKey = tuple[str, str | None, str | None, bool]


def cache_key(clone: VoiceClone) -> CacheKey:
    """What a computed prompt is kept under: the saved voice (and the revision the gateway saw), or the reference
    audio with the transcript and mode it was computed for."""
    if clone.voice is not None:
        return ("voice", clone.voice, clone.voice_revision, False)
    return ("audio", clone.audio_key, None if clone.x_vector_only else clone.ref_text, clone.x_vector_only)


def refusal(error: ReferenceAudioError) -> RequestRefused:
    return RequestRefused(_CODES.get(error.code, ErrorCode.INVALID_REF_AUDIO), error.message)


class VoicePrompts:
    """Voice prompts of one base checkpoint's requests; `close()` stops its thread."""

    def __init__(self, js: JetStreamContext, maker: PromptMaker, model: str, cache_size: int = CACHE_SIZE) -> None:
        self.js, self.maker, self.model = js, maker, model
        """`maker` runs the audio work, so neither the event loop nor the engine thread waits for it."""
        self._cache: OrderedDict[CacheKey, VoicePrompt] = OrderedDict()
        self._cache_size = cache_size
        self._pending: dict[CacheKey, asyncio.Future[VoicePrompt]] = {}
        self.num_computed = 0
        self.num_cache_hits = 0
        self.num_primed = 0
        self.timings = {"audio_read": Timings(), "compute": Timings()}
        """Wall times of the reference audio's read from its object store, and of its audio work as this replica
        waits for it (the worker's queue included): where a cloned voice's first packet goes (STATS, /metrics)."""

    async def attach(self, admission: Admission) -> Admission:
        """The admission with its request's voice prompt. Raises RequestRefused (a code for the client to act on)."""
        clone = admission.request.clone
        if clone is None:
            return admission
        voice = await self.prompt_for(clone)
        return dataclasses.replace(admission, prompt=dataclasses.replace(admission.prompt, voice=voice))

    async def prompt_for(self, clone: VoiceClone) -> VoicePrompt:
        key = cache_key(clone)
        if clone.voice is not None:
            return await self._cached(key, lambda: self._load_saved(clone))
        if clone.audio_key is None:
            raise RequestRefused(ErrorCode.VOICE_REQUIRED, "the request names neither reference audio nor a voice")
        return await self._cached(key, lambda: self._from_key(clone.audio_key, clone.ref_text, clone.x_vector_only))

    def prime(self, clone: VoiceClone, prompt: VoicePrompt) -> None:
        """Keep a prompt computed elsewhere (a prefill replica's, with its hand-off) for `clone`: the request's
        `attach`, and a replay after a preemption while it stays cached, take it instead of the audio work."""
        if clone.voice is None and clone.audio_key is None:
            return  # names no voice: `attach` refuses it as it would have
        self._keep(cache_key(clone), prompt)
        self.num_primed += 1

    async def _cached(self, key: CacheKey, make: Callable[[], Awaitable[VoicePrompt]]) -> VoicePrompt:
        if (prompt := self._cache.get(key)) is not None:
            self._cache.move_to_end(key)
            self.num_cache_hits += 1
            return prompt
        future = self._pending.get(key)
        if future is None:
            future = asyncio.ensure_future(make())
            self._pending[key] = future
            future.add_done_callback(lambda done: self._settle(key, done))
        return await asyncio.shield(future)  # a request cancelled meanwhile does not cancel the others' wait

    def _settle(self, key: CacheKey, done: asyncio.Future[VoicePrompt]) -> None:
        self._pending.pop(key, None)
        if done.cancelled() or done.exception() is not None:
            return
        self._keep(key, done.result())

    def _keep(self, key: CacheKey, prompt: VoicePrompt) -> None:
        self._cache[key] = prompt
        self._cache.move_to_end(key)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    async def _from_key(self, audio_key: str, ref_text: str | None, x_vector_only: bool) -> VoicePrompt:
        return await self._compute(await self._reference(audio_key), ref_text, x_vector_only)

    async def _compute(self, audio: ReferenceAudio, ref_text: str | None, x_vector_only: bool) -> VoicePrompt:
        samples = np.frombuffer(audio.samples, dtype="<f4")
        started = time.perf_counter()
        try:
            prompt = await self.maker.make_prompt(samples, audio.sample_rate, ref_text, x_vector_only)
        except ReferenceAudioError as exc:
            raise refusal(exc) from exc
        except VoiceWorkLost as exc:
            raise RequestRefused(ErrorCode.INTERNAL, str(exc)) from exc
        self.timings["compute"].observe(time.perf_counter() - started)
        self.num_computed += 1
        return prompt

    async def _reference(self, audio_key: str) -> ReferenceAudio:
        started = time.perf_counter()
        found = await self._read(REF_AUDIO_STORE, audio_key)
        self.timings["audio_read"].observe(time.perf_counter() - started)
        if found is None:
            raise RequestRefused(ErrorCode.INVALID_REF_AUDIO, "the reference audio is no longer stored (it expires an "
                                 "hour after its last use): send ref_audio again")
        try:
            return decode(found, ReferenceAudio)
        except DecodeError as exc:
            raise RequestRefused(ErrorCode.INVALID_REF_AUDIO, f"the stored reference audio is unreadable: {exc}") from exc

    async def _load_saved(self, clone: VoiceClone) -> VoicePrompt:
        found = await self._read(VOICES_STORE, saved_voice_key(self.model, clone.voice))
        if found is None:
            raise RequestRefused(ErrorCode.UNKNOWN_VOICE, f"the saved voice {clone.voice!r} was deleted")
        try:
            record = decode(found, SavedVoice)
            return voice_prompt(record, self.maker.tokenizer)
        except (DecodeError, ReferenceAudioError, ValueError) as exc:
            raise RequestRefused(ErrorCode.UNKNOWN_VOICE, f"the saved voice {clone.voice!r} is unreadable ({exc}): "
                                 "save it again") from exc

    async def _read(self, store_name: str, name: str) -> bytes | None:
        try:
            store = await open_object_store(self.js, store_name)
            found = await read_object(store, name)
        except Exception as exc:  # noqa: BLE001 - the bus failed this read; the request fails alone
            raise RequestRefused(ErrorCode.INTERNAL, f"could not read {name!r} from {store_name} ({exc!r})") from exc
        return None if found is None else found[1]

    async def create(self, request: VoiceCreate) -> VoiceCreated:
        """Compute a voice from stored reference audio and save it in VOICES (replacing one of the same name)."""
        try:
            if request.model != self.model:
                raise RequestRefused(ErrorCode.UNKNOWN_MODEL, f"this replica serves {self.model!r}, not "
                                     f"{request.model!r}")
            audio = await self._reference(request.audio_key)
            prompt = await self._compute(audio, request.ref_text, request.x_vector_only)
            record = saved_voice(prompt, name=request.name, model=self.model, ref_text=request.ref_text,
                                 duration_s=len(audio.samples) / 4 / audio.sample_rate)
            store = await open_object_store(self.js, VOICES_STORE)
            stored = await write_object(store, saved_voice_key(self.model, request.name), encode(record),
                                        description="x-vector" if record.x_vector_only else "in-context")
        except RequestRefused as exc:
            return VoiceCreated(name=request.name, error=ErrorInfo(code=exc.code, stage=Stage.DECODE,
                                                                    message=exc.message))
        log.info("saved voice %r (%d reference frames)", request.name, prompt.num_ref_frames)
        return VoiceCreated(name=request.name, revision=stored.revision, num_ref_frames=prompt.num_ref_frames)

    async def handle_create(self, request: Request) -> None:
        """The `voice-create` micro endpoint: a VoiceCreate in, a VoiceCreated out."""
        try:
            message = decode(request.data, VoiceCreate)
        except DecodeError as exc:
            await request.respond_error("400", f"not a VoiceCreate: {exc}")
            return
        await request.respond(encode(await self.create(message)))

    def close(self) -> None:
        for future in self._pending.values():
            future.cancel()
        self.maker.close()
