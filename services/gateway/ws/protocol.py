"""The messages of the streaming WebSocket `/v1/audio/speech/stream`, as typed msgspec Structs tagged by `type`.

Client -> server (JSON text messages):
- `session.update`: any of the speech fields of `POST /v1/audio/speech` except `input` (voice, language, seed,
  sampling extras...), `format` and `sample_rate`; fields left out keep their value. Applies to text segmented (and
  requests resumed) after it.
- `input.text` {text}: more text; each sentence is synthesized as soon as its end is certain.
- `input.flush`: synthesize what is buffered now, sentence end or not.
- `input.done`: no more text; the server answers `session.done` after the last segment's audio, then closes.
- `cancel` {request_id?}: stop one request of this socket, or (no id) everything: buffered text, queued segments and
  the request being streamed; each request whose `audio.start` was sent ends with an `error` of code `cancelled`.
- `resume` {request_id, last_seq}: after a disconnect, within the resume window, get the chunks after `last_seq`.
- A JSON object without `type` is one complete request (the speech fields with `input`), served in turn.

Server -> client: `session.updated`, `audio.start`, the audio (binary frames of s16le PCM, or `audio.delta` events
with base64 when `format` is `pcm_s16le_base64`, or binary frames of G.711 for `pcm_mulaw` / `pcm_alaw`; at the
session's `sample_rate`: one frame or event a chunk, then, when the audio is resampled, one more with the
filter's tail), `audio.done`, `error`, `session.done`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec

from messages.audio_format import SAMPLE_RATE
from messages.errors import ErrorCode, Stage
from messages.requests import MAX_TEXT_CHARS
from services.gateway.errors import AdmissionError
from services.gateway.requests.body import PosInt, SynthesisFields, parse_body, too_deep, validation_error
from services.gateway.requests.response_formats import FORMATS, AudioFormat as ResponseFormat, served_rate

BINARY_FORMAT = "pcm_s16le"
BASE64_FORMAT = "pcm_s16le_base64"
# The socket's formats as the HTTP answers whose bytes they carry: s16le PCM, or G.711 in binary frames.
RESPONSE_FORMAT_OF = {"pcm_s16le": "pcm", "pcm_s16le_base64": "pcm", "pcm_mulaw": "ulaw", "pcm_alaw": "alaw"}
AudioFormat = Literal["pcm_s16le", "pcm_s16le_base64", "pcm_mulaw", "pcm_alaw"]


def response_format_of(audio_format: str) -> ResponseFormat:
    """The HTTP response format whose bytes a socket of `audio_format` receives."""
    return FORMATS[RESPONSE_FORMAT_OF[audio_format]]

_Tagged = dict(tag_field="type", kw_only=True, forbid_unknown_fields=True)


def _session_update_type() -> type[msgspec.Struct]:
    """`session.update`: every speech field but `input`, each optional (UNSET: keep the session's value), and
    `format`. Built from SynthesisFields so both always accept the same fields with the same limits."""
    fields: list[tuple[str, Any, Any]] = [
        (info.name, Union[info.type, msgspec.UnsetType], msgspec.UNSET)
        for info in msgspec.structs.fields(SynthesisFields) if info.name != "input"]
    fields.append(("format", Union[AudioFormat, msgspec.UnsetType], msgspec.UNSET))
    fields.append(("sample_rate", Union[PosInt, None, msgspec.UnsetType], msgspec.UNSET))
    return msgspec.defstruct("SessionUpdate", fields, tag="session.update", module=__name__, **_Tagged)


SessionUpdate = _session_update_type()


class InputText(msgspec.Struct, tag="input.text", **_Tagged):
    """More text. Attributes: text: appended to the buffer (at most 4096 characters per message)."""

    text: Annotated[str, msgspec.Meta(max_length=MAX_TEXT_CHARS)]


class InputFlush(msgspec.Struct, tag="input.flush", **_Tagged):
    """Synthesize the buffered text now."""


class InputDone(msgspec.Struct, tag="input.done", **_Tagged):
    """No more text: finish the segments, send `session.done`, close."""


class Cancel(msgspec.Struct, tag="cancel", **_Tagged):
    """Stop work. Attributes: request_id: one request of this socket; None: everything."""

    request_id: str | None = None


class Resume(msgspec.Struct, tag="resume", **_Tagged):
    """Continue a request whose socket was lost.

    Attributes:
        request_id: from its `audio.start`.
        last_seq: the last chunk received (binary frames count from the `first_seq` of `audio.start`; `audio.delta`
            events carry `seq`); None when none was.
    """

    request_id: str
    last_seq: Annotated[int, msgspec.Meta(ge=0)] | None = None
    resume_token: str | None = None  # from its `audio.start`: only the client that started a request may resume it


ClientMessage = Union[SessionUpdate, InputText, InputFlush, InputDone, Cancel, Resume]  # type: ignore[valid-type]
MESSAGE_KINDS: dict[str, type[msgspec.Struct]] = {
    kind.__struct_config__.tag: kind for kind in (SessionUpdate, InputText, InputFlush, InputDone, Cancel, Resume)}
MESSAGE_TYPES = tuple(MESSAGE_KINDS)


class SessionConfig(msgspec.Struct, kw_only=True, frozen=True):
    """A socket's settings for the text it segments.

    Attributes:
        speech: the speech fields (everything of SynthesisFields but `input`) that were set.
        format: how audio is sent: binary frames of s16le PCM (pcm_s16le) or of G.711 (pcm_mulaw, pcm_alaw), or
            base64 `audio.delta` events of s16le PCM (pcm_s16le_base64).
        sample_rate: the audio's rate as the client asked for it; None: the format's own (24000; G.711: 8000).
    """

    speech: dict[str, Any] = {}
    format: AudioFormat = BINARY_FORMAT
    sample_rate: int | None = None

    def updated(self, update: Any) -> SessionConfig:
        """These settings with the fields `update` (a SessionUpdate) sets; AdmissionError (`unsupported_value`) when
        the format is not served at the rate they name."""
        given = {info.name: getattr(update, info.name) for info in msgspec.structs.fields(update)
                 if getattr(update, info.name) is not msgspec.UNSET}
        audio_format = given.pop("format", self.format)
        sample_rate = given.pop("sample_rate", self.sample_rate)
        config = SessionConfig(speech={**self.speech, **given}, format=audio_format, sample_rate=sample_rate)
        config.served_rate()
        return config

    def served_rate(self) -> int:
        """The rate the socket's audio is sent at; AdmissionError when its format has no such rate."""
        return served_rate(response_format_of(self.format), self.sample_rate, format_field="format",
                           format_name=self.format)

    def fields_for(self, text: str) -> SynthesisFields:
        """The request body of one segment."""
        return SynthesisFields(input=text, **self.speech)


# Server -> client events.

class SessionUpdated(msgspec.Struct, tag="session.updated", **_Tagged):
    """The settings now in force."""

    session: SessionConfig


class AudioStart(msgspec.Struct, tag="audio.start", **_Tagged):
    """A request's audio begins. `first_seq` numbers the first chunk that follows (0, or last_seq+1 on resume);
    `segment` and `text` say which piece of the session's text it speaks (None for a one-shot request);
    `resume_token` is what a `resume` of this request must present."""

    request_id: str
    format: str = BINARY_FORMAT
    sample_rate: int = SAMPLE_RATE
    channels: int = 1
    first_seq: int = 0
    resumed: bool = False
    segment: int | None = None
    text: str | None = None
    resume_token: str | None = None


class AudioDelta(msgspec.Struct, tag="audio.delta", **_Tagged):
    """One chunk of audio, base64 of s16le PCM (format pcm_s16le_base64)."""

    request_id: str
    seq: int
    audio: str


class AudioDone(msgspec.Struct, tag="audio.done", **_Tagged):
    """The request's audio is complete. `chunk_count` is the request's whole count; `samples` and `duration_s`
    count the audio sent since its `audio.start`."""

    request_id: str
    chunk_count: int
    samples: int
    duration_s: float
    frames: int | None
    stop: str | None


class ErrorEvent(msgspec.Struct, tag="error", **_Tagged):
    """A message or a request failed; the socket stays open."""

    request_id: str | None
    code: ErrorCode
    message: str
    param: str | None
    stage: Stage


class SessionDone(msgspec.Struct, tag="session.done", **_Tagged):
    """After `input.done`: every segment was served; the server closes the socket next (1000). `request_ids`,
    `samples` and `duration_s` count the requests whose audio was delivered in full (`audio.done`)."""

    request_ids: list[str]
    segments: int
    samples: int
    duration_s: float


ServerEvent = Union[SessionUpdated, AudioStart, AudioDelta, AudioDone, ErrorEvent, SessionDone]

class _Envelope(msgspec.Struct):
    type: str | None = None


def parse_client_message(raw: str) -> Any:
    """A ClientMessage, or SynthesisFields for a one-shot request (an object without `type`).

    Raises AdmissionError naming the field at fault."""
    try:
        envelope = msgspec.json.decode(raw, type=_Envelope)
    except msgspec.ValidationError as exc:
        error = validation_error(exc, "message")
        error.message += "; send a JSON object with a `type`"
        raise error from exc
    except msgspec.DecodeError as exc:
        raise AdmissionError(ErrorCode.INVALID_JSON, f"the message is not valid JSON: {exc}") from exc
    except RecursionError as exc:  # msgspec's own depth guard, met while it skips a field the envelope ignores
        raise too_deep("message") from exc
    if envelope.type is None:
        return parse_body(raw, SynthesisFields)
    if envelope.type not in MESSAGE_TYPES:
        raise AdmissionError(ErrorCode.INVALID_VALUE, f"unknown message type {envelope.type!r}; use one of "
                             f"{', '.join(MESSAGE_TYPES)}", param="type")
    try:
        return msgspec.json.decode(raw, type=ClientMessage)
    except msgspec.ValidationError as exc:
        error = validation_error(exc, f"{envelope.type} message")
        if choices := _choices(MESSAGE_KINDS[envelope.type], error.param):
            error.message += f"; use one of {', '.join(choices)}"
        if error.param == "format" and error.code is ErrorCode.INVALID_VALUE:
            error.code = ErrorCode.UNSUPPORTED_FORMAT  # the code HTTP's response_format answers with
        raise error from exc


def _choices(kind: type[msgspec.Struct], param: str | None) -> tuple[str, ...]:
    """The values a Literal field accepts (empty for other fields)."""
    for info in msgspec.structs.fields(kind):
        if info.name == param:
            options = get_args(info.type) if get_origin(info.type) is Union else (info.type,)
            return tuple(v for option in options if get_origin(option) is Literal for v in get_args(option))
    return ()


def encode_event(event: ServerEvent) -> str:
    """The JSON text of a server event."""
    return msgspec.json.encode(event).decode()
