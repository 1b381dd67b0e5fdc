"""The audio formats and sample rates of `voxmesh say`: which `response_format` a file's name implies, what the
streaming WebSocket calls a format, the rate a format is served at when none is asked, and how to play raw bytes.

The gateway decides which formats and rates it serves (an unknown one is its 400 `unsupported_format` or
`unsupported_value`); these tables only name what a client may ask for.
"""

from __future__ import annotations

from pathlib import Path

RESPONSE_FORMATS = ("wav", "pcm", "flac", "mp3", "opus", "aac", "ulaw", "alaw")
"""Every `response_format` of `POST /v1/audio/speech` a client may ask for."""
STREAM_FORMATS = {"wav": "pcm_s16le", "pcm": "pcm_s16le", "ulaw": "pcm_mulaw", "alaw": "pcm_alaw"}
"""What `voxmesh say --stdin` writes, and the WebSocket `format` that brings it (wav: s16le PCM in a WAV header)."""
MODEL_RATE = 24000
G711_RATE = 8000
G711_FORMATS = ("ulaw", "alaw")
RAW_FORMATS = ("pcm", "ulaw", "alaw")
"""Formats without a header: whoever plays them must be told the rate."""
_SUFFIXES = {".wav": "wav", ".pcm": "pcm", ".raw": "pcm", ".flac": "flac", ".mp3": "mp3", ".opus": "opus",
             ".ogg": "opus", ".aac": "aac", ".ulaw": "ulaw", ".mulaw": "ulaw", ".alaw": "alaw"}


def format_for_output(output: Path | None) -> str:
    """The format a file's name implies (`out.mp3`: mp3), wav for any other name; pcm for standard output."""
    if output is None:
        return "pcm"
    return _SUFFIXES.get(output.suffix.lower(), "wav")


def default_rate(response_format: str) -> int:
    """The rate a format is served at when the request names none: G.711's 8 kHz, else the model's 24 kHz."""
    return G711_RATE if response_format in G711_FORMATS else MODEL_RATE


def bytes_per_sample(response_format: str) -> int:
    """Bytes of one sample of a raw stream (G.711: 1, s16: 2)."""
    return 1 if response_format in G711_FORMATS else 2


def playback_hint(response_format: str, sample_rate: int) -> str:
    """An `aplay` command that plays raw bytes of `response_format` at `sample_rate`."""
    sample = {"pcm": "S16_LE", "ulaw": "MU_LAW", "alaw": "A_LAW"}[response_format]
    return f"aplay -f {sample} -r {sample_rate} -c 1"


REQUEST_OPTIONS = ("model", "voice", "language", "seed", "sample_rate")
"""The command line's options that become request fields of the same name, when given."""


def given_options(args) -> dict:
    """The request fields the command line gave (`REQUEST_OPTIONS` not left at None): the gateway's defaults serve
    the rest (the model it serves, the model's first voice, the format's rate)."""
    return {name: getattr(args, name) for name in REQUEST_OPTIONS if getattr(args, name) is not None}
