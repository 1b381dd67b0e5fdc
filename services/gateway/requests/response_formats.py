"""The speech API's response formats: which `response_format` names exist, which this process can encode, and the
refusal (code `unsupported_format`, before anything is queued) of any other.

wav and pcm are written by the gateway itself, and ulaw and alaw (G.711 at 8 kHz, http/g711.py); flac and opus (in
Ogg) by libsndfile through `soundfile` (builds differ in the codecs they carry), mp3 by LAME through `lameenc`; aac
has no encoder. How PCM becomes each format is services/gateway/http/encoders.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import soundfile

try:  # optional at import: without it mp3 is refused with a clear error instead of the gateway not starting
    import lameenc
except ImportError:  # pragma: no cover - lameenc is a pinned dependency
    lameenc = None

from messages.errors import ErrorCode
from services.gateway.errors import AdmissionError


@dataclass(frozen=True, slots=True)
class AudioFormat:
    """One `response_format`.

    Attributes:
        name: the API's name for it.
        media_type: the Content-Type of a response in it.
        libsndfile: (major format, subtype) for libsndfile, or None when it is not libsndfile's to encode.
        raw_bits: bits per sample of a headerless format (its answers say them in `X-Bit-Depth`, with
            `X-Channels`, as SGLang-Omni's do); None for a format with a header.
        sample_rate: the rate the format is always in (G.711: 8000); None: the model's own (24000).
    """

    name: str
    media_type: str
    libsndfile: tuple[str, str] | None = None
    raw_bits: int | None = None
    sample_rate: int | None = None

    @property
    def is_available(self) -> bool:
        """Whether this process can encode it (libsndfile builds differ in the codecs they carry)."""
        if self.name == "mp3":
            return lameenc is not None
        if self.libsndfile is None:
            return True
        major, subtype = self.libsndfile
        return major in soundfile.available_formats() and subtype in soundfile.available_subtypes(major)


FORMATS: dict[str, AudioFormat] = {
    "wav": AudioFormat("wav", "audio/wav"),
    "pcm": AudioFormat("pcm", "audio/pcm", raw_bits=16),
    "flac": AudioFormat("flac", "audio/flac", ("FLAC", "PCM_16")),
    "mp3": AudioFormat("mp3", "audio/mpeg"),
    "opus": AudioFormat("opus", "audio/ogg", ("OGG", "OPUS")),
    "ulaw": AudioFormat("ulaw", "audio/basic", raw_bits=8, sample_rate=8000),
    "alaw": AudioFormat("alaw", "audio/x-alaw-basic", raw_bits=8, sample_rate=8000),
}
_NEVER = {"aac": "libsndfile has no AAC encoder"}


def available_formats() -> tuple[str, ...]:
    """The response formats this process can produce, in the API's order."""
    return tuple(name for name, fmt in FORMATS.items() if fmt.is_available)


def audio_format(name: str) -> AudioFormat:
    """The format called `name`; AdmissionError (`unsupported_format`) naming the ones that work otherwise."""
    fmt = FORMATS.get(name)
    if fmt is not None and fmt.is_available:
        return fmt
    why = _NEVER.get(name) or ("this server's libsndfile lacks its codec" if fmt else "it is not an audio format")
    raise AdmissionError(ErrorCode.UNSUPPORTED_FORMAT, f"response_format {name!r} is not supported ({why}); use one "
                         f"of {', '.join(available_formats())}", param="response_format")
