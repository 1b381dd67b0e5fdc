"""A client's reference audio (`ref_audio`: a base64 data URI of an audio file) read into mono samples, or a specific
400: too large a file, not base64, not audio soundfile can read, too short or too long a recording.

Blocking work (base64, decoding the file) belongs off the event loop: call `read_reference` in a thread.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
from dataclasses import dataclass

import numpy as np
import soundfile

from messages.errors import ErrorCode
from services.gateway.errors import AdmissionError
from services.model.voice.errors import ReferenceAudioError
from services.model.voice.limits import MAX_REFERENCE_S, check_reference

MAX_REF_AUDIO_BYTES = 10 * 2**20
"""The largest audio file accepted (30 s of 48 kHz stereo 16-bit WAV is 5.5 MiB); its base64 is a third larger."""
_DATA_URI = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(?:;[\w.+-]+=[\w.+-]+)*)(?P<b64>;base64)?,",
                       re.ASCII)
_CODES = {"ref_audio_too_short": ErrorCode.REF_AUDIO_TOO_SHORT, "ref_audio_too_long": ErrorCode.REF_AUDIO_TOO_LONG}


@dataclass(frozen=True, slots=True)
class ReferenceClip:
    """Decoded reference audio.

    Attributes:
        samples: float32 mono samples.
        sample_rate: their rate.
        key: the content's name in the REF_AUDIO store (a hash of rate and samples: the same audio, the same key).
    """

    samples: np.ndarray
    sample_rate: int
    key: str

    @property
    def duration_s(self) -> float:
        return self.samples.shape[0] / self.sample_rate


def _invalid(message: str, param: str) -> AdmissionError:
    return AdmissionError(ErrorCode.INVALID_REF_AUDIO, message, param=param)


def file_bytes(data_uri: str, param: str = "ref_audio") -> bytes:
    """The audio file inside a `data:audio/...;base64,...` URI (a bare base64 string is accepted too)."""
    if len(data_uri) > MAX_REF_AUDIO_BYTES * 4 // 3 + 4096:
        raise _invalid(f"{param} is {len(data_uri) / 2**20:.1f} MiB of base64; the limit is "
                       f"{MAX_REF_AUDIO_BYTES // 2**20} MiB of audio file: trim it to at most {MAX_REFERENCE_S:g} s "
                       "or lower its sample rate", param)
    payload = data_uri
    if data_uri.startswith("data:"):
        header = _DATA_URI.match(data_uri)
        if header is None or header.group("b64") is None:
            raise _invalid(f"{param} must be a base64 data URI (data:audio/wav;base64,...)", param)
        payload = data_uri[header.end():]
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _invalid(f"{param} is not valid base64: {exc}", param) from exc


def read_reference(data_uri: str, param: str = "ref_audio") -> ReferenceClip:
    """Decode and check a reference (length limits of `services.model.voice.limits`); AdmissionError if unusable."""
    data = file_bytes(data_uri, param)
    try:
        info = soundfile.info(io.BytesIO(data))
        try:
            check_reference(info.frames, info.samplerate)  # before decoding what may be an hour of audio
        except ReferenceAudioError as exc:
            raise AdmissionError(_CODES.get(exc.code, ErrorCode.INVALID_REF_AUDIO), exc.message, param=param) from exc
        samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (soundfile.SoundFileError, RuntimeError, TypeError, ValueError) as exc:
        raise _invalid(f"{param} is not audio this server can read (WAV, FLAC, OGG or MP3): {exc}", param) from exc
    mono = np.ascontiguousarray(samples.mean(axis=1, dtype=np.float32))
    if not np.isfinite(mono).all():
        raise _invalid(f"{param} holds samples that are not finite numbers", param)
    digest = hashlib.sha256(int(rate).to_bytes(4, "little") + mono.astype("<f4").tobytes()).hexdigest()
    return ReferenceClip(mono, int(rate), f"ref-{digest[:48]}")
