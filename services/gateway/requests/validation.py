"""Admission: a client's body becomes a SynthesisRequest (id, seed, deadline), or a specific 400.

Everything that can be checked without the model is checked here, so a bad request never reaches the queue:
text length, model, voice and language against the checkpoint, format and speed.
"""

from __future__ import annotations

import secrets
import time
import unicodedata
from dataclasses import dataclass

from messages.errors import ErrorCode
from messages.requests import MAX_TEXT_CHARS, Priority, SamplingSpec, SynthesisRequest
from services.gateway.errors import AdmissionError
from services.gateway.requests.body import SpeechBody, SynthesisFields, TextMode
from services.gateway.requests.catalog import VoiceCatalog
from services.gateway.requests.response_formats import audio_format, served_rate
from services.gateway.tenancy.tenant import Tenant

DEFAULT_PRIORITY: Priority = "interactive"
"""A request's priority when it names none (and its key sets no other default)."""

SPEED_RANGE = (0.25, 4.0)  # OpenAI's
DEFAULT_TEXT_MODE: TextMode = "non-streaming"  # the reference package's default; the gateway always has the whole text


@dataclass(frozen=True, slots=True)
class AdmissionPolicy:
    """The limits admission applies.

    Attributes:
        catalog: the served model, its voices and languages.
        max_text_chars: input limit (at most MAX_TEXT_CHARS, the bus's limit).
        queue_deadline_s: a request still queued this long after admission fails with `timeout`.
    """

    catalog: VoiceCatalog
    max_text_chars: int = MAX_TEXT_CHARS
    queue_deadline_s: float = 30.0

    def __post_init__(self) -> None:
        if not 1 <= self.max_text_chars <= MAX_TEXT_CHARS:
            raise ValueError(f"max_text_chars must be in 1..{MAX_TEXT_CHARS}, got {self.max_text_chars}")
        if self.queue_deadline_s <= 0:
            raise ValueError(f"queue_deadline_s must be > 0, got {self.queue_deadline_s}")

    def admit(self, fields: SynthesisFields, *, now: float | None = None, request_id: str | None = None,
              tenant: Tenant | None = None) -> SynthesisRequest:
        """Validate `fields` for `tenant` (None: the anonymous tenant) and fix the request's id (`request_id`, or a
        fresh one), seed, deadline and priority. Raises AdmissionError, or PriorityNotAllowed for a priority above
        what the tenant's key allows."""
        now = time.time() if now is None else now
        if isinstance(fields, SpeechBody):
            _check_output(fields)
        text = self._checked_text(fields.input)
        self._check_model(fields.model)
        _check_frame_counts(fields)
        return SynthesisRequest(
            id=request_id or new_request_id(),
            model=self.catalog.model,
            text=text,
            # A base model's voice is cloned, not named here (voices/cloning.py).
            speaker=None if self.catalog.model_type == "base" else self._checked_voice(fields.voice_name),
            language=self._checked_language(fields.language),
            instruct=fields.instructions or None,
            text_mode=fields.text_mode or DEFAULT_TEXT_MODE,  # None: a SpeechBody not given one
            seed=fields.seed if fields.seed is not None else secrets.randbits(63),
            sampling=SamplingSpec(temperature=fields.temperature, top_k=fields.top_k, top_p=fields.top_p,
                                  repetition_penalty=fields.repetition_penalty),
            max_new_tokens=fields.max_new_tokens,
            ignore_eos=fields.ignore_eos,
            initial_chunk_frames=fields.initial_chunk_frames,
            deadline=now + self.queue_deadline_s,
            created_at=now,
            min_new_tokens=fields.min_new_tokens,
            tenant=tenant.name if tenant is not None else "",
            priority=_checked_priority(fields.priority, tenant),
        )

    def _checked_text(self, text: str) -> str:
        if not text.strip():
            raise AdmissionError(ErrorCode.EMPTY_INPUT, "input is empty: give 1 to "
                                 f"{self.max_text_chars} characters of text", param="input")
        if len(text) > self.max_text_chars:
            raise AdmissionError(ErrorCode.TEXT_TOO_LONG, f"input has {len(text)} characters; the limit is "
                                 f"{self.max_text_chars}: split the text into several requests", param="input")
        if (control := next((ch for ch in text if _is_control(ch)), None)) is not None:
            raise AdmissionError(ErrorCode.CONTROL_CHARACTERS, f"input holds the control character "
                                 f"U+{ord(control):04X}; remove control characters (tab and line breaks are fine)",
                                 param="input")
        if not any(ch.isalnum() for ch in text):  # the rule the WebSocket's segmenter drops such pieces by
            raise AdmissionError(ErrorCode.NOTHING_TO_SAY, "input has no letter or digit (only punctuation, "
                                 "symbols or emoji): there is nothing to speak", param="input")
        return text

    def _check_model(self, model: str | None) -> None:
        if model is not None and not self.catalog.serves(model):
            raise AdmissionError(ErrorCode.UNKNOWN_MODEL, f"unknown model {model!r}; this gateway serves "
                                 f"{self.catalog.model!r}", param="model")

    def _checked_voice(self, voice: str | None) -> str | None:
        speakers = self.catalog.speakers
        if voice is None:
            return self.catalog.default_voice  # one rule for HTTP and WebSocket alike: the model's first speaker
        if not speakers:
            raise AdmissionError(ErrorCode.UNKNOWN_VOICE, f"this {self.catalog.model_type} model has no named "
                                 "voices: omit voice (describe the voice in instructions)", param="voice")
        if voice.lower() not in speakers:
            raise AdmissionError(ErrorCode.UNKNOWN_VOICE, f"unknown voice {voice!r}; this model has: "
                                 f"{', '.join(speakers)}", param="voice")
        return voice.lower()

    def _checked_language(self, language: str) -> str:
        if language.lower() not in self.catalog.languages:
            raise AdmissionError(ErrorCode.UNKNOWN_LANGUAGE, f"unknown language {language!r}; this model knows: "
                                 f"{', '.join(self.catalog.languages)}", param="language")
        return language.lower()


def _checked_priority(requested: Priority | None, tenant: Tenant | None) -> Priority:
    """The request's priority: what its key allows of the one asked for (the key's default when none is asked);
    without a tenant, the one asked for or the default (interactive)."""
    if tenant is not None:
        return tenant.allowed_priority(requested)
    return requested or DEFAULT_PRIORITY


def _is_control(ch: str) -> bool:
    return unicodedata.category(ch) == "Cc" and ch not in "\t\n\r"


def _check_output(body: SpeechBody) -> None:
    # unsupported_format / unsupported_value, naming the formats (the format's rates) that work
    served_rate(audio_format(body.response_format), body.sample_rate)
    low, high = SPEED_RANGE
    if not low <= body.speed <= high:
        raise AdmissionError(ErrorCode.OUT_OF_RANGE, f"speed {body.speed} is outside {low}..{high}; this server "
                             "serves 1.0 only", param="speed")
    if body.speed != 1.0:
        raise AdmissionError(ErrorCode.UNSUPPORTED_VALUE, f"speed {body.speed} is not supported: the model has no "
                             "speed control (and resampling would change the pitch); send 1.0 or omit it",
                             param="speed")


def _check_frame_counts(fields: SynthesisFields) -> None:
    low, high = fields.min_new_tokens, fields.max_new_tokens
    if low is not None and high is not None and low > high:
        raise AdmissionError(ErrorCode.OUT_OF_RANGE, f"min_new_tokens ({low}) is above max_new_tokens ({high})",
                             param="min_new_tokens")


def new_request_id() -> str:
    """A fresh request id: 128 random bits, URL-safe, usable as a subject token."""
    return "req_" + secrets.token_urlsafe(16)
