"""Voice cloning on the bus: how a request names its voice, and what the two object stores hold.

Audio never rides in a bus message (1 MiB at most): the gateway puts reference audio in the REF_AUDIO store under a key
derived from its content, and a request carries that key; the replica that prefills the prompt (a prefill replica where
the topology has one, else decode) fetches it, computes the voice prompt beside its step loop and caches it by key; a
prefill replica hands it to decode ready (`ReadyVoice`). A saved voice is computed once (by a decode replica, asked on
`tts.voice.<model>.create`) and kept in the VOICES store, which outlives restarts; a request naming one skips the audio
work altogether.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from messages import subjects
from messages.base import ErrorInfo, Message, NonNegInt, PosInt, Seconds, UnixTime

REF_AUDIO_STORE = "voxmesh-ref-audio"
"""Object store of reference audio (`ReferenceAudio`), keyed by content; objects expire (BusConfig)."""
VOICES_STORE = "voxmesh-voices"
"""Object store of saved voices (`SavedVoice`), keyed by `saved_voice_key`; kept until deleted."""

VoiceName = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9_-]{0,63}$")]
"""A saved voice's name: lower case letters, digits, '_' and '-', up to 64 characters."""
ObjectKey = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,128}$")]


def saved_voice_key(model: str, name: str) -> str:
    """The VOICES object of one model's saved voice (a voice prompt is only valid for the weights it was made by)."""
    return f"{subjects.slug(model)}.{subjects.token(name)}"


def saved_voice_prefix(model: str) -> str:
    """What every VOICES object of one model starts with."""
    return f"{subjects.slug(model)}."


class VoiceClone(msgspec.Struct, kw_only=True, frozen=True):
    """How a request's voice is cloned (base checkpoints): from reference audio, or from a saved voice.

    Attributes:
        audio_key: the reference audio's object in REF_AUDIO_STORE; decode computes the voice prompt from it.
        voice: a saved voice's name (its VOICES object is `saved_voice_key(model, voice)`), already computed.
        voice_revision: the saved voice's object id as the gateway saw it: decode reuses a cached prompt only for it.
        ref_text: the transcript of the reference audio (in-context cloning; None with x_vector_only).
        x_vector_only: clone from the speaker embedding alone, without transcript or reference codes.
    """

    audio_key: ObjectKey | None = None
    voice: VoiceName | None = None
    voice_revision: str | None = None
    ref_text: str | None = None
    x_vector_only: bool = False


class ReadyVoice(msgspec.Struct, kw_only=True, frozen=True):
    """A computed voice prompt as a prefill replica hands it to decode with a cloned request (`PrefillHandoff.voice`),
    so decode never repeats the reference audio's work (a few kB: an x-vector and at most 375 frames of codes).

    Attributes:
        speaker_embedding: float32 little-endian x-vector (the talker's width).
        ref_codes: int16 little-endian reference frames, `num_codebooks` codes each (in-context clones).
        num_codebooks: codes per reference frame.
        ref_text_ids: the reference transcript's token ids, without its template (in-context clones).
    """

    speaker_embedding: bytes
    ref_codes: bytes | None = None
    num_codebooks: PosInt = 16
    ref_text_ids: list[NonNegInt] | None = None


class ReferenceAudio(Message, tag="reference_audio", kw_only=True, frozen=True):
    """A REF_AUDIO object: decoded, mono reference audio at its own sample rate.

    Attributes:
        sample_rate: samples per second.
        samples: float32 little-endian samples in [-1, 1].
    """

    sample_rate: PosInt
    samples: bytes


class SavedVoice(Message, tag="saved_voice", kw_only=True, frozen=True):
    """A VOICES object: a computed voice prompt and what it was made from.

    Attributes:
        name: the voice's name.
        model: the model (weights) it was computed by.
        created_at: unix time of its computation.
        duration_s: seconds of reference audio.
        x_vector_only: True when it clones from the speaker embedding alone.
        ref_text: the reference transcript (in-context voices).
        speaker_embedding: float32 little-endian x-vector (the talker's width).
        ref_codes: int16 little-endian reference frames, `num_codebooks` codes each (in-context voices).
        num_codebooks: codes per reference frame.
    """

    name: VoiceName
    model: str
    created_at: UnixTime
    duration_s: Seconds
    x_vector_only: bool
    ref_text: str | None
    speaker_embedding: bytes
    ref_codes: bytes | None
    num_codebooks: PosInt


class VoiceCreate(Message, tag="voice_create", kw_only=True, frozen=True):
    """Core NATS request to a model's decode replicas (queue group): compute a voice and save it in VOICES.

    Attributes:
        name: the voice's name (an existing voice of that name is replaced).
        model: the model it is for.
        audio_key: the reference audio in REF_AUDIO_STORE.
        ref_text: its transcript (in-context voices).
        x_vector_only: save the speaker embedding alone.
    """

    name: VoiceName
    model: str
    audio_key: ObjectKey
    ref_text: str | None = None
    x_vector_only: bool = False


class VoiceCreated(Message, tag="voice_created", kw_only=True, frozen=True):
    """Decode's answer to a VoiceCreate.

    Attributes:
        name: the voice.
        revision: the saved object's id (None when it failed).
        num_ref_frames: reference codec frames kept (0 for x-vector voices).
        error: why it failed (a bad reference, or this replica's model cannot clone), None on success.
    """

    name: VoiceName
    revision: str | None = None
    num_ref_frames: NonNegInt = 0
    error: ErrorInfo | None = None
