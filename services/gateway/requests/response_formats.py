"""The speech API's response formats: which `response_format` names exist, which this process can encode, the sample
rates each is served at, and the refusal (before anything is queued) of any other format (`unsupported_format`) or
rate (`unsupported_value`), naming the ones that work.

wav and pcm are written by the gateway itself, and ulaw and alaw (G.711, requests/g711.py); mp3, opus (in Ogg), flac
and aac (in ADTS) by FFmpeg through PyAV (requests/ffmpeg_encoder.py). How PCM becomes each format is
services/gateway/http/encoders.py; the model's 24 kHz audio reaches another rate through requests/resampler.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from messages.audio_format import SAMPLE_RATE
from messages.errors import ErrorCode
from services.gateway.errors import AdmissionError
from services.gateway.requests import ffmpeg_encoder
from services.gateway.requests.g711 import G711_RATE


@dataclass(frozen=True, slots=True)
class AudioFormat:
    """One `response_format`.

    Attributes:
        name: the API's name for it.
        media_type: the Content-Type of a response in it.
        by_ffmpeg: FFmpeg encodes it (requests/ffmpeg_encoder.py); else the gateway itself.
        raw_bits: bits per sample of a headerless format (its answers say them in `X-Bit-Depth`, with
            `X-Channels`, as SGLang-Omni's do); None for a format with a header.
        rates: the sample rates it is served at (`sample_rate`).
        default_rate: its rate when the client names none (the model's own, 24000; G.711's 8000).
    """

    name: str
    media_type: str
    by_ffmpeg: bool = False
    raw_bits: int | None = None
    rates: tuple[int, ...] = ()
    default_rate: int = SAMPLE_RATE

    @property
    def is_available(self) -> bool:
        """Whether this process can encode it (PyAV may be missing, or its FFmpeg built without the codec)."""
        return not self.by_ffmpeg or ffmpeg_encoder.is_available(self.name)


RATES = (8000, 16000, 22050, 24000, 44100, 48000)  # telephony, wideband, and the common audio rates
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)  # the only rates Opus codes

FORMATS: dict[str, AudioFormat] = {
    "wav": AudioFormat("wav", "audio/wav", rates=RATES),
    "pcm": AudioFormat("pcm", "audio/pcm", raw_bits=16, rates=RATES),
    "flac": AudioFormat("flac", "audio/flac", by_ffmpeg=True, rates=RATES),
    "mp3": AudioFormat("mp3", "audio/mpeg", by_ffmpeg=True, rates=RATES),
    "opus": AudioFormat("opus", "audio/ogg", by_ffmpeg=True, rates=OPUS_RATES),
    "aac": AudioFormat("aac", "audio/aac", by_ffmpeg=True, rates=RATES),
    "ulaw": AudioFormat("ulaw", "audio/basic", raw_bits=8, rates=RATES, default_rate=G711_RATE),
    "alaw": AudioFormat("alaw", "audio/x-alaw-basic", raw_bits=8, rates=RATES, default_rate=G711_RATE),
}


def available_formats() -> tuple[str, ...]:
    """The response formats this process can produce, in the API's order."""
    return tuple(name for name, fmt in FORMATS.items() if fmt.is_available)


def audio_format(name: str) -> AudioFormat:
    """The format called `name`; AdmissionError (`unsupported_format`) naming the ones that work otherwise."""
    fmt = FORMATS.get(name)
    if fmt is not None and fmt.is_available:
        return fmt
    why = "this server's PyAV (FFmpeg) lacks its codec" if fmt else "it is not an audio format"
    raise AdmissionError(ErrorCode.UNSUPPORTED_FORMAT, f"response_format {name!r} is not supported ({why}); use one "
                         f"of {', '.join(available_formats())}", param="response_format")


def served_rate(fmt: AudioFormat, requested: int | None, *, format_field: str = "response_format",
                format_name: str | None = None) -> int:
    """The rate an answer in `fmt` is served at: `requested`, or the format's default when None; AdmissionError
    (`unsupported_value`, param `sample_rate`) naming the format's rates when it has no such rate. `format_field` and
    `format_name` say how the client named the format (the WebSocket's `format`)."""
    if requested is None:
        return fmt.default_rate
    if requested not in fmt.rates:
        raise AdmissionError(ErrorCode.UNSUPPORTED_VALUE, f"sample_rate {requested} is not served for {format_field} "
                             f"{format_name or fmt.name!r}; use one of {', '.join(map(str, fmt.rates))} (or omit it "
                             f"for {fmt.default_rate})", param="sample_rate")
    return requested
