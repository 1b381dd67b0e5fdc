"""Reference audio on the WebSocket: a `session.update` (or one-shot request) carrying `ref_audio` may exceed the
socket's 64 KiB message limit, up to what a reference may be; the `session.updated` echo names the reference's size
instead of sending megabytes back."""

from __future__ import annotations

import msgspec

from services.gateway.voices.reference_audio import MAX_REF_AUDIO_BYTES
from services.gateway.ws.protocol import SessionConfig

VOICE_MESSAGE_BYTES = MAX_REF_AUDIO_BYTES * 4 // 3 + 64 * 1024
"""The base64 of the largest reference file, and room for the message's other fields."""


class _Envelope(msgspec.Struct):
    type: str | None = None
    ref_audio: str | None = None


def carries_ref_audio(raw: str) -> bool:
    """Whether a text message is a session.update or a one-shot request with `ref_audio` (others stay small)."""
    try:
        envelope = msgspec.json.decode(raw, type=_Envelope)
    except msgspec.DecodeError:  # ValidationError too: the size rule refuses it, the parser would anyway
        return False
    return envelope.ref_audio is not None and envelope.type in (None, "session.update")


def echoed(config: SessionConfig) -> SessionConfig:
    """The session settings to echo in `session.updated`: `ref_audio` as its size, not its bytes."""
    reference = config.speech.get("ref_audio")
    if reference is None:
        return config
    speech = {**config.speech, "ref_audio": f"<{len(reference)} characters>"}
    return msgspec.structs.replace(config, speech=speech)
