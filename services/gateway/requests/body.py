"""The bodies clients send: OpenAI's speech fields plus voxmesh's extras, as typed msgspec Structs.

Decoding with msgspec gives exact, field-naming errors for wrong types and out-of-range values; unknown fields are
refused so a typo (`temprature`) is an error instead of a silently ignored setting.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import msgspec

from messages.errors import ErrorCode
from messages.requests import Priority
from services.gateway.errors import AdmissionError

Seed = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
# Counts far beyond any model's limits are refused here (out_of_range): unbounded, a JSON integer over 64 bits would
# pass validation and then fail to encode on the bus (msgpack holds 64 bits).
MAX_COUNT = 2**31 - 1
NonNegInt = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
PosInt = Annotated[int, msgspec.Meta(gt=0, le=MAX_COUNT)]
Temperature = Annotated[float, msgspec.Meta(ge=0)]
TopP = Annotated[float, msgspec.Meta(gt=0, le=1)]
Penalty = Annotated[float, msgspec.Meta(gt=0)]
TextMode = Literal["non-streaming", "streaming"]
TaskType = Literal["CustomVoice", "VoiceDesign", "Base"]


class VoiceRef(msgspec.Struct, forbid_unknown_fields=True):
    """OpenAI's voice object (`{"id": "..."}`), accepted beside a plain voice name.

    Attributes:
        id: the voice (speaker) name.
    """

    id: str


class SynthesisFields(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What to say and how; shared by `POST /v1/audio/speech` and the WebSocket's request message.

    Attributes:
        input: the text, 1..4096 characters.
        model: the served model's name; None means the served model.
        voice: a speaker of the checkpoint (custom_voice models) or a saved voice (base models), as a name or
            `{"id": name}`; case-insensitive; None means the model's first speaker (its default, GET
            /v1/audio/voices).
        language: "auto" or a language of the checkpoint; case-insensitive.
        instructions: style instruction (voice_design models).
        seed: generator seed; None draws a random one (reported in the Accepted event).
        temperature, top_k, top_p, repetition_penalty: talker sampling; None uses the checkpoint's defaults.
        max_new_tokens: cap on codec frames (12.5 per second of audio).
        min_new_tokens: frames generated before the end of speech may be drawn (at most max_new_tokens).
        ignore_eos: generate up to max_new_tokens even past the end of speech (benchmarks).
        initial_chunk_frames: frames in the first chunk (lower first-packet latency).
        text_mode: "non-streaming" (whole text in the prompt) or "streaming" (text fed along the frames).
        ref_audio: base models: the voice to clone, a base64 data URI of an audio file (WAV, FLAC, OGG, MP3) of 1
            to 30 s; any sample rate, several channels are mixed down.
        ref_text: the transcript of ref_audio (in-context cloning, the default: required there).
        x_vector_only_mode: clone from the speaker embedding alone (no transcript; a looser likeness).
        priority: "interactive" (seats kept for it, served first) or "batch" (a book read aloud: served when
            interactive work leaves room, never starved); None: the key's default (interactive).
    """

    input: str
    model: str | None = None
    voice: str | VoiceRef | None = None
    language: str = "auto"
    instructions: str | None = None
    seed: Seed | None = None
    temperature: Temperature | None = None
    top_k: NonNegInt | None = None
    top_p: TopP | None = None
    repetition_penalty: Penalty | None = None
    max_new_tokens: PosInt | None = None
    min_new_tokens: NonNegInt | None = None
    ignore_eos: bool = False
    initial_chunk_frames: PosInt | None = None
    text_mode: TextMode = "non-streaming"
    ref_audio: str | None = None
    ref_text: str | None = None
    x_vector_only_mode: bool = False
    priority: Priority | None = None

    @property
    def voice_name(self) -> str | None:
        """The voice as a name, whichever way the client wrote it."""
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice


class SpeechBody(SynthesisFields, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/audio/speech`: OpenAI's fields, voxmesh's, and those of the servers clients migrate from (vLLM-Omni,
    SGLang-Omni); peer_fields.py resolves the latter into the former before anything runs.

    Attributes:
        response_format: wav (mono s16), pcm (raw s16le mono), flac, mp3, opus (in Ogg), aac (in ADTS), ulaw or
            alaw (G.711, raw).
        sample_rate: the answer's rate (the model's 24 kHz audio resampled by libsoxr): 8000, 16000, 22050, 24000,
            44100 or 48000 (opus: 8000, 12000, 16000, 24000, 48000); None: 24000 (G.711: 8000). vLLM-Omni's field
            of the same meaning.
        speed: OpenAI's range is 0.25..4.0; only 1.0 is served (the model has no speed control, and resampling
            would change the pitch): anything else is refused rather than ignored.
        stream_format: None answers the whole file once it is complete (exact length; a failure is an HTTP error
            status); "audio" streams the file's bytes as they are made; "sse" streams server-sent events
            (`speech.audio.delta` with base64 audio, then `speech.audio.done` with usage, or `error`).
        text_mode: as SynthesisFields'; None: `non_streaming_mode`'s, else "non-streaming".
        speed, language, x_vector_only_mode: as above; null (the peers' default, sent by clients that write every
            field) is the default (1.0, "auto", false).
        stream: vLLM-Omni's and SGLang-Omni's switch: true streams (the bytes of stream_format "audio" unless
            stream_format says "sse"), false answers the whole file (a stream_format beside it is a conflict).
        non_streaming_mode: vLLM-Omni's name of the text mode: true is "non-streaming", false "streaming".
        task_type: what the model does (CustomVoice, VoiceDesign, Base); must be what the served checkpoint does.
        speaker: vLLM-Omni's and SGLang-Omni's other name of `voice`.
        initial_codec_chunk_frames: their name of `initial_chunk_frames`.
        word_timestamps: vLLM-Omni's per-word timing header; only false is served.
        stream_codec_output, suppress_bootstrap_silence: SGLang-Omni's switches; only false (their default).
        speaker_embedding ... stage_params: known fields of other models or servers that this server cannot
            honour: only null (their default) is accepted; any value is refused with `unsupported_field`
            (REFUSED_FIELDS says why for each).
    """

    response_format: str = "wav"
    sample_rate: PosInt | None = None
    speed: float | None = 1.0
    stream_format: Literal["audio", "sse"] | None = None
    text_mode: TextMode | None = None
    language: str | None = "auto"
    x_vector_only_mode: bool | None = False
    stream: bool | None = None
    non_streaming_mode: bool | None = None
    task_type: TaskType | None = None
    speaker: str | None = None
    initial_codec_chunk_frames: NonNegInt | None = None
    word_timestamps: bool = False
    stream_codec_output: bool | None = None
    suppress_bootstrap_silence: bool | None = None
    speaker_embedding: None = None
    ref_audio_2: None = None
    ambient_sound: None = None
    duration_seconds: None = None
    extra_params: None = None
    references: None = None
    token_count: None = None
    duration_tokens: None = None
    stage_params: None = None


# Known fields of vLLM-Omni's and SGLang-Omni's speech bodies that change the audio in ways this server cannot
# produce: accepted as null (their default), refused otherwise, with the reason and what to send instead.
REFUSED_FIELDS: dict[str, str] = {
    "speaker_embedding": "voices are cloned from audio here: send ref_audio (with x_vector_only_mode: true for the "
                         "embedding alone), or name a saved voice",
    "ref_audio_2": "a second speaker is a MOSS-TTSD feature; this model speaks one voice per request",
    "ambient_sound": "sound effects are a MOSS-SoundEffect feature; this model speaks text",
    "duration_seconds": "the model sets the audio's length itself; cap it with max_new_tokens (12.5 per second)",
    "extra_params": "this server passes no free-form parameters to the model; every setting is a named field",
    "references": "send the reference as ref_audio (a base64 data URI) and its transcript as ref_text",
    "token_count": "the model sets the audio's length itself; cap it with max_new_tokens",
    "duration_tokens": "the model sets the audio's length itself; cap it with max_new_tokens",
    "stage_params": "this server's stages take no per-request overrides; sampling has its own fields",
}

_AT_FIELD = re.compile(r" - at `\$\.([A-Za-z_][A-Za-z0-9_]*)[^`]*`")
_NAMED_FIELD = re.compile(r"(?:unknown|required) field `([^`]+)`")


# msgspec's validation messages, by the error code a client branches on (first match wins).
_CODE_OF_MESSAGE = (
    (re.compile(r"^Expected `[^`]+`, got `"), ErrorCode.INVALID_TYPE),
    (re.compile(r"^Expected `[^`]+` (?:of length )?[<>]=?"), ErrorCode.OUT_OF_RANGE),
    (re.compile(r"^Invalid enum value"), ErrorCode.INVALID_VALUE),
    (re.compile(r"unknown field"), ErrorCode.UNKNOWN_FIELD),
    (re.compile(r"missing required field"), ErrorCode.MISSING_FIELD),
)


def parse_body(raw: bytes | str, kind: type[SynthesisFields]) -> SynthesisFields:
    """Decode a JSON body; AdmissionError (400) naming the field on any problem, with a specific code:
    invalid_json, invalid_type, out_of_range, invalid_value, unknown_field or missing_field."""
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as exc:
        raise validation_error(exc, "body") from exc
    except msgspec.DecodeError as exc:
        raise AdmissionError(ErrorCode.INVALID_JSON, f"the body is not valid JSON: {exc}") from exc
    except RecursionError as exc:  # msgspec's depth guard: nesting no field of ours can hold
        raise too_deep("body") from exc


def too_deep(what: str) -> AdmissionError:
    """A `what` nesting arrays or objects deeper than the JSON decoder goes."""
    return AdmissionError(ErrorCode.INVALID_JSON, f"the {what} nests arrays or objects too deeply to decode (no "
                          "field of this API nests deeper than a voice's {\"id\": ...})")


def validation_error(exc: msgspec.ValidationError, what: str) -> AdmissionError:
    """msgspec's complaint about a decoded `what` ("body", "input.text message"...) as an AdmissionError with the
    field at fault as `param` and a specific code."""
    text = str(exc)
    field = _AT_FIELD.search(text) or _NAMED_FIELD.search(text)
    param = field.group(1) if field else None
    detail = _AT_FIELD.sub("", text)
    message = f"{param}: {detail}" if _AT_FIELD.search(text) else detail
    code = next((code for pattern, code in _CODE_OF_MESSAGE if pattern.search(text)), ErrorCode.INVALID_REQUEST)
    if param in REFUSED_FIELDS and code == ErrorCode.INVALID_TYPE:  # a value where only null is taken
        return AdmissionError(ErrorCode.UNSUPPORTED_FIELD, f"{param} is not supported by this server: "
                              f"{REFUSED_FIELDS[param]}; omit it or send null", param=param)
    return AdmissionError(code, f"invalid {what}: {message}", param=param)
