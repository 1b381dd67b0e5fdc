"""The bodies clients send: OpenAI's speech fields plus voxmesh's extras, as typed msgspec Structs.

Decoding with msgspec gives exact, field-naming errors for wrong types and out-of-range values; unknown fields are
refused so a typo (`temprature`) is an error instead of a silently ignored setting.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec

from messages.errors import ErrorCode
from services.gateway.errors import AdmissionError

Seed = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
PosInt = Annotated[int, msgspec.Meta(gt=0)]
Temperature = Annotated[float, msgspec.Meta(ge=0)]
TopP = Annotated[float, msgspec.Meta(gt=0, le=1)]
Penalty = Annotated[float, msgspec.Meta(gt=0)]


class SynthesisFields(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What to say and how; shared by `POST /v1/audio/speech` and the WebSocket's request message.

    Attributes:
        input: the text, 1..4096 characters.
        model: the served model's name; None means the served model.
        voice: a speaker of the checkpoint (custom_voice models); case-insensitive.
        language: "auto" or a language of the checkpoint; case-insensitive.
        instructions: style instruction (voice_design models).
        seed: generator seed; None draws a random one (reported in the Accepted event).
        temperature, top_k, top_p, repetition_penalty: talker sampling; None uses the checkpoint's defaults.
        max_new_tokens: cap on codec frames (12.5 per second of audio).
        ignore_eos: generate up to max_new_tokens even past the end of speech (benchmarks).
        initial_chunk_frames: frames in the first chunk (lower first-packet latency).
        text_mode: "non-streaming" (whole text in the prompt) or "streaming" (text fed along the frames).
    """

    input: str
    model: str | None = None
    voice: str | None = None
    language: str = "auto"
    instructions: str | None = None
    seed: Seed | None = None
    temperature: Temperature | None = None
    top_k: NonNegInt | None = None
    top_p: TopP | None = None
    repetition_penalty: Penalty | None = None
    max_new_tokens: PosInt | None = None
    ignore_eos: bool = False
    initial_chunk_frames: PosInt | None = None
    text_mode: Literal["non-streaming", "streaming"] = "non-streaming"


class SpeechBody(SynthesisFields, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/audio/speech`.

    Attributes:
        response_format: "wav" (24 kHz mono s16) or "pcm" (raw 24 kHz s16le mono).
        speed: only 1.0 (the model has no speed control; refused rather than ignored).
    """

    response_format: str = "wav"
    speed: float = 1.0


RESPONSE_FORMATS = ("wav", "pcm")

_AT_FIELD = re.compile(r" - at `\$\.([A-Za-z_][A-Za-z0-9_]*)[^`]*`")
_NAMED_FIELD = re.compile(r"(?:unknown|required) field `([^`]+)`")


def parse_body(raw: bytes | str, kind: type[SynthesisFields]) -> SynthesisFields:
    """Decode a JSON body; AdmissionError (400, `invalid_request`) naming the field on any problem."""
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as exc:
        text = str(exc)
        field = _AT_FIELD.search(text) or _NAMED_FIELD.search(text)
        param = field.group(1) if field else None
        detail = _AT_FIELD.sub("", text)
        message = f"{param}: {detail}" if _AT_FIELD.search(text) else detail
        raise AdmissionError(ErrorCode.INVALID_REQUEST, f"invalid body: {message}", param=param) from exc
    except msgspec.DecodeError as exc:
        raise AdmissionError(ErrorCode.INVALID_REQUEST, f"the body is not valid JSON: {exc}") from exc
