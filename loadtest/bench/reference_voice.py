"""A cloned voice for `voxmesh bench` (base checkpoints): every request carries a reference audio file.

The gateway stores reference audio by its content and the replica that prefills a prompt caches the voice prompt by
that key, so the same file in every request measures a warm cache: the audio work is paid once. With `distinct`, each
request's copy starts after a silence of its own length (1 + 7k samples, k = the copy's number, from a random start,
modulo 1,024: at most 0.3 s at 24 kHz), so every request pays the reference audio's whole work: resampling, mel, speaker and codec
encoders, and the vocoder's priming with the reference's codec frames, which the shift changes too (a vocoder keeps
primed states by their frames: a copy that differed only in one sample's last bit encodes to the same frames, and was
primed once). That is the cold cost a service sees when each caller brings their own voice.
"""

from __future__ import annotations

import base64
import io
import itertools
import random
import wave
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile


class PayloadError(ValueError):
    """Request settings that cannot work: a non-positive frame count, a reference voice without its transcript or
    that cannot be read."""

    code = "invalid_request_shape"


DISTINCT_LEAD_STEP = 7
"""Samples of silence between one distinct copy's start and the next's: not a divisor of a codec frame (1,920
samples at 24 kHz), so copies land on different frame boundaries."""
DISTINCT_COPIES = 1024
"""Distinct copies before they repeat."""


@dataclass(frozen=True, slots=True)
class ReferenceVoice:
    """The reference audio every request sends, as 16-bit mono WAV, and how it is cloned."""

    source: str
    sample_rate: int
    pcm: np.ndarray = field(repr=False)
    """int16 mono samples."""
    ref_text: str | None = None
    x_vector_only: bool = False
    distinct: bool = False
    _sent: itertools.count = field(default_factory=lambda: itertools.count(random.SystemRandom().randrange(
        DISTINCT_COPIES)), repr=False, compare=False)
    """Copies made so far, from a random start: a distinct copy per request of the whole run (levels and warm-ups
    restart `index`), and most likely of the next `voxmesh bench` run too (gpu_mesh_run.sh runs one a level, and a
    repeated copy would find the mesh's caches warm)."""
    _encoded: list[str] = field(default_factory=list, repr=False, compare=False)
    """The one data URI every request sends when not distinct, encoded on first use (the load generator's CPU is
    the mesh's too)."""

    def _same_audio(self) -> str:
        if not self._encoded:
            self._encoded.append(_data_uri(self.pcm, self.sample_rate))
        return self._encoded[0]

    @staticmethod
    def from_file(path: Path, ref_text: str | None, x_vector_only: bool, distinct: bool) -> ReferenceVoice:
        """Read `path` (any format libsndfile reads; channels mixed down). Raises PayloadError."""
        if not x_vector_only and not ref_text:
            raise PayloadError("a reference voice needs --ref-text (its transcript) unless --x-vector-only")
        try:
            samples, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
        except (OSError, RuntimeError, soundfile.LibsndfileError) as exc:
            raise PayloadError(f"cannot read the reference audio {path}: {exc}") from exc
        if len(samples) == 0:
            raise PayloadError(f"the reference audio {path} holds no samples")
        mono = np.clip(samples.mean(axis=1), -1.0, 1.0)
        pcm = np.round(mono * 32767.0).astype(np.int16)
        return ReferenceVoice(source=path.name, sample_rate=int(rate), pcm=pcm,
                              ref_text=None if x_vector_only else ref_text, x_vector_only=x_vector_only,
                              distinct=distinct)

    def fields(self) -> dict:
        """The cloning fields of the next request's body."""
        if self.distinct:
            lead = 1 + DISTINCT_LEAD_STEP * (next(self._sent) % DISTINCT_COPIES)
            audio = _data_uri(np.concatenate([np.zeros(lead, dtype=np.int16), self.pcm]), self.sample_rate)
        else:
            audio = self._same_audio()
        fields: dict = {"ref_audio": audio}
        if self.x_vector_only:
            fields["x_vector_only_mode"] = True
        else:
            fields["ref_text"] = self.ref_text
        return fields

    def to_dict(self) -> dict:
        return {"source": self.source, "seconds": round(len(self.pcm) / self.sample_rate, 3),
                "sample_rate": self.sample_rate, "mode": "x-vector" if self.x_vector_only else "in-context",
                "distinct": self.distinct}


def _data_uri(pcm: np.ndarray, sample_rate: int) -> str:
    return f"data:audio/wav;base64,{base64.b64encode(_wav(pcm, sample_rate)).decode()}"


def _wav(pcm: np.ndarray, sample_rate: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm.astype("<i2").tobytes())
    return buffer.getvalue()
