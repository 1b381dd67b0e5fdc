"""Which voice a request clones: its own reference audio (stored, then named by key) or a saved voice (named by name
and revision). Base checkpoints speak only in a cloned voice; the others refuse the cloning fields."""

from __future__ import annotations

from messages.errors import ErrorCode
from messages.voice_clone import VoiceClone
from services.gateway.errors import AdmissionError, GatewayError
from services.gateway.requests.body import SynthesisFields
from services.gateway.requests.catalog import VoiceCatalog
from services.gateway.voices.voice_store import VoiceStore


def check_cloning_fields(fields: SynthesisFields, catalog: VoiceCatalog) -> None:
    """What needs no store: cloning fields on a model that cannot clone, a missing transcript, audio and a saved
    voice at once, no voice at all on a base model. AdmissionError (400) naming the field."""
    if catalog.model_type != "base":
        given = next((name for name in ("ref_audio", "ref_text") if getattr(fields, name) is not None), None)
        if given is not None or fields.x_vector_only_mode:
            raise AdmissionError(ErrorCode.VOICE_CLONING_UNSUPPORTED, f"this {catalog.model_type} model cannot clone "
                                 "a voice: ref_audio, ref_text and x_vector_only_mode need a base model",
                                 param=given or "x_vector_only_mode")
        return
    if fields.ref_audio is None:
        if fields.voice_name is None:
            raise AdmissionError(ErrorCode.VOICE_REQUIRED, "a base model speaks in a cloned voice: give ref_audio (a "
                                 "base64 data URI of 1-30 s of speech, with its transcript in ref_text) or the name "
                                 "of a saved voice (POST /v1/audio/voices)", param="voice")
        return
    if fields.voice_name is not None:
        raise AdmissionError(ErrorCode.INVALID_REQUEST, "give either ref_audio or a saved voice, not both",
                             param="voice")
    if not fields.x_vector_only_mode and not (fields.ref_text or "").strip():
        raise AdmissionError(ErrorCode.REF_TEXT_REQUIRED, "in-context cloning needs ref_text, the transcript of "
                             "ref_audio; or set x_vector_only_mode to clone from the voice alone", param="ref_text")


async def voice_clone(fields: SynthesisFields, catalog: VoiceCatalog, store: VoiceStore | None) -> VoiceClone | None:
    """The request's cloned voice (None on models that do not clone); stores its reference audio on the way."""
    check_cloning_fields(fields, catalog)
    if catalog.model_type != "base":
        return None
    if store is None:
        raise GatewayError(ErrorCode.INTERNAL, "voice cloning is not set up on this gateway", status=503)
    if fields.ref_audio is not None:
        reference = await store.reference(fields.ref_audio)
        text = None if fields.x_vector_only_mode else fields.ref_text
        return VoiceClone(audio_key=reference.key, ref_text=text, x_vector_only=fields.x_vector_only_mode)
    name = fields.voice_name.lower()
    saved = await store.saved(name)
    if saved is None:
        raise AdmissionError(ErrorCode.UNKNOWN_VOICE, f"no saved voice {name!r} for this model; GET /v1/audio/voices "
                             "lists them, POST /v1/audio/voices saves one", param="voice")
    return VoiceClone(voice=name, voice_revision=saved.revision)
