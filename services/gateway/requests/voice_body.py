"""The body of `POST /v1/audio/voices`, a typed msgspec Struct: the route decodes it and the OpenAPI document
(services/gateway/http/openapi.py) describes it, from this one definition."""

from __future__ import annotations

import msgspec


class VoiceBody(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/audio/voices`.

    Attributes:
        name: the voice's name (1-64 of letters, digits, '_' and '-'; case-insensitive). Saving a name again
            replaces that voice.
        audio: the voice to clone: a base64 data URI of an audio file (WAV, FLAC, OGG, MP3) of 1 to 30 s.
        ref_text: the transcript of `audio` (in-context cloning, the default: required there).
        x_vector_only_mode: keep the speaker embedding alone (no transcript; a looser likeness).
    """

    name: str
    audio: str
    ref_text: str | None = None
    x_vector_only_mode: bool = False
