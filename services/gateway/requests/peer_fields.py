"""The speech body's fields from vLLM-Omni and SGLang-Omni (the servers clients migrate from), resolved into
voxmesh's own before the request runs, or refused with a specific code (nothing is queued either way).

- `stream`: true is the audio as it is made, the bytes of `stream_format: "audio"` (SGLang-Omni's meaning;
  `stream_format: "sse"` beside it asks for events instead); false is the whole file. `stream: false` beside a
  `stream_format` is `conflicting_fields`: vLLM-Omni would stream such a body, SGLang-Omni would not, so no answer
  would be the one the client expects.
- `non_streaming_mode`: the text mode under vLLM-Omni's name (true: "non-streaming", false: "streaming"); beside a
  `text_mode` that says otherwise, `conflicting_fields`. Neither given: "non-streaming" (DEFAULT_TEXT_MODE).
- `task_type`: must name what the served checkpoint does (`task_type_mismatch` otherwise).
- `speaker`, `initial_codec_chunk_frames`: other names of `voice` and `initial_chunk_frames`; `voice: "default"`
  (SGLang-Omni's default) is the model's default speaker on a checkpoint with named speakers and none so named.
- `sample_rate` is voxmesh's own field too (the answer's rate, checked with the response format in validation.py).
- `word_timestamps`, `stream_codec_output`, `suppress_bootstrap_silence`: only the value that changes nothing is
  served; any other is `unsupported_value`.
- `speed`, `language`, `x_vector_only_mode` as null (the peers' default): 1.0, "auto", false.
The fields other models use (REFUSED_FIELDS) are refused when the body is decoded (body.py).
"""

from __future__ import annotations

import msgspec

from messages.errors import ErrorCode
from services.gateway.errors import AdmissionError
from services.gateway.requests.body import SpeechBody, TaskType, TextMode, VoiceRef
from services.gateway.requests.catalog import VoiceCatalog
from services.gateway.requests.validation import DEFAULT_TEXT_MODE

DEFAULT_VOICE = "default"  # SGLang-Omni's `voice` when the client names none

# vLLM-Omni's task_type of each checkpoint kind (config.json's tts_model_type).
TASK_TYPE_OF_MODEL: dict[str, TaskType] = {"custom_voice": "CustomVoice", "voice_design": "VoiceDesign",
                                           "base": "Base"}


def resolved(body: SpeechBody, catalog: VoiceCatalog) -> SpeechBody:
    """`body` with the peer servers' fields turned into voxmesh's (and cleared); AdmissionError when they conflict
    with voxmesh's fields or ask for what this server cannot do. `catalog` is the served checkpoint."""
    _check_task_type(body.task_type, catalog.model_type)
    _check_no_op_values(body)
    return msgspec.structs.replace(
        body, stream_format=_stream_format(body), text_mode=_text_mode(body), voice=_voice(body, catalog),
        initial_chunk_frames=_initial_chunk_frames(body),
        speed=1.0 if body.speed is None else body.speed,
        language="auto" if body.language is None else body.language,
        x_vector_only_mode=bool(body.x_vector_only_mode),
        stream=None, non_streaming_mode=None, task_type=None, speaker=None, initial_codec_chunk_frames=None)


def _stream_format(body: SpeechBody) -> str | None:
    if body.stream is None:
        return body.stream_format
    if not body.stream:
        if body.stream_format is not None:
            raise AdmissionError(ErrorCode.CONFLICTING_FIELDS, f"stream is false (the whole file) but stream_format "
                                 f"is {body.stream_format!r} (a stream): send one of them", param="stream_format")
        return None
    return body.stream_format or "audio"


def _text_mode(body: SpeechBody) -> TextMode:
    if body.non_streaming_mode is None:
        return body.text_mode or DEFAULT_TEXT_MODE
    implied: TextMode = "non-streaming" if body.non_streaming_mode else "streaming"
    if body.text_mode is not None and body.text_mode != implied:
        raise AdmissionError(ErrorCode.CONFLICTING_FIELDS, f"non_streaming_mode {str(body.non_streaming_mode).lower()}"
                             f" is text_mode {implied!r}, but text_mode is {body.text_mode!r}: send one of them",
                             param="non_streaming_mode")
    return implied


def _voice(body: SpeechBody, catalog: VoiceCatalog) -> str | VoiceRef | None:
    voice = body.voice
    if body.speaker is not None:
        if body.voice_name is not None and body.voice_name.lower() != body.speaker.lower():
            raise AdmissionError(ErrorCode.CONFLICTING_FIELDS, f"speaker {body.speaker!r} and voice "
                                 f"{body.voice_name!r} name different voices: send one of them", param="speaker")
        voice = body.speaker
    name = voice.id if isinstance(voice, VoiceRef) else voice
    named_voices = catalog.speakers
    if name is not None and name.lower() == DEFAULT_VOICE and named_voices and DEFAULT_VOICE not in named_voices:
        return None  # SGLang-Omni's default `voice`: the model's default speaker, as an omitted voice is here
    return voice


def _initial_chunk_frames(body: SpeechBody) -> int | None:
    frames, alias = body.initial_chunk_frames, body.initial_codec_chunk_frames
    if alias is None:
        return frames
    if alias == 0:
        raise AdmissionError(ErrorCode.OUT_OF_RANGE, "initial_codec_chunk_frames 0 is not served: the first chunk "
                             "holds at least 1 frame; omit it for the server's default",
                             param="initial_codec_chunk_frames")
    if frames is not None and frames != alias:
        raise AdmissionError(ErrorCode.CONFLICTING_FIELDS, f"initial_codec_chunk_frames ({alias}) and "
                             f"initial_chunk_frames ({frames}) differ: send one of them",
                             param="initial_codec_chunk_frames")
    return alias


def _check_task_type(task_type: TaskType | None, model_type: str) -> None:
    served = TASK_TYPE_OF_MODEL.get(model_type)
    if task_type is not None and task_type != served:
        raise AdmissionError(ErrorCode.TASK_TYPE_MISMATCH, f"task_type {task_type!r} is not what this server does: "
                             f"it serves a {model_type} checkpoint (task_type {served!r}); send that or omit it",
                             param="task_type")


def _check_no_op_values(body: SpeechBody) -> None:
    """The peers' output switches, served at the value that leaves the audio as this server makes it."""
    if body.word_timestamps:
        raise AdmissionError(ErrorCode.UNSUPPORTED_VALUE, "word_timestamps is not served (this server runs no forced "
                             "aligner); send false or omit it", param="word_timestamps")
    for name, why in (("stream_codec_output", "codec codes are not sent to clients"),
                      ("suppress_bootstrap_silence", "the audio is sent as the model makes it, leading silence "
                                                     "included")):
        if getattr(body, name):
            raise AdmissionError(ErrorCode.UNSUPPORTED_VALUE, f"{name} true is not served ({why}); send false or "
                                 "omit it", param=name)
