"""G.711 answers without a server: the companding checked against the tests' own decoders (tests/support/
g711_tables.py, written from the standard's expansion rules) (every 16-bit sample, every code), and the 24 -> 8 kHz resampling, piece by piece, against libsoxr's
resampling of the whole signal."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from services.gateway.http.encoders import stream_encoder
from services.gateway.requests.g711 import G711_RATE, compand
from services.gateway.requests.response_formats import FORMATS
from tests.support.g711_tables import decode

ALL_SAMPLES = np.arange(-32768, 32768, dtype=np.int32)


@pytest.mark.parametrize("law", ["ulaw", "alaw"])
def test_every_code_decoded_encodes_back_to_itself(law):
    codes = [code for code in range(256) if not (law == "ulaw" and code == 0x7F)]  # mu-law's -0 encodes as +0
    levels = decode(bytes(codes), law)
    assert list(compand(levels.astype(np.int16), law)) == codes


@pytest.mark.parametrize("law", ["ulaw", "alaw"])
def test_every_sample_is_encoded_as_a_level_next_to_it(law):
    decoded = decode(compand(ALL_SAMPLES, law), law)
    levels = np.unique(decode(bytes(range(256)), law))
    above = np.clip(np.searchsorted(levels, ALL_SAMPLES), 0, len(levels) - 1)
    below = np.clip(above - 1, 0, len(levels) - 1)
    next_to = (decoded == levels[above]) | (decoded == levels[below])
    assert next_to.all(), ALL_SAMPLES[~next_to][:10]
    assert (np.diff(decoded) >= 0).all()  # companding keeps the order of the samples
    relative = np.abs(decoded - ALL_SAMPLES) / np.maximum(np.abs(ALL_SAMPLES), 256)
    assert relative.max() < 0.06  # G.711's 8 bits: a few percent of the amplitude at worst


def speech_like(seconds: float, seed: int = 3) -> np.ndarray:
    """24 kHz int16 audio: tones across the band, under 4 kHz and above it (the resampler must remove those)."""
    t = np.arange(int(24000 * seconds)) / 24000
    rng = np.random.default_rng(seed)
    wave = sum(rng.uniform(0.05, 0.2) * np.sin(2 * np.pi * f * t) for f in (180, 440, 1300, 3100, 5200, 9000))
    return np.round(wave * 32767 / 1.2).astype(np.int16)


def streamed(law: str, pcm: np.ndarray, piece_samples: int) -> bytes:
    encoder = stream_encoder(FORMATS[law], 24000, G711_RATE)
    pieces = [encoder.feed(pcm[i:i + piece_samples].tobytes()) for i in range(0, len(pcm), piece_samples)]
    return b"".join(pieces) + encoder.finish()


@pytest.mark.parametrize("law", ["ulaw", "alaw"])
def test_piece_by_piece_equals_the_whole_signal_resampled(law):
    pcm = speech_like(1.5)
    whole = soxr.resample(pcm.astype(np.float32) / 32768, 24000, G711_RATE, quality="HQ") * 32768
    answers = {size: streamed(law, pcm, size) for size in (1920, 7, 4801, len(pcm))}
    assert len(set(answers.values())) == 1  # the same bytes however the audio arrives
    assert answers[1920] == streamed(law, pcm, 1920)  # and every time
    decoded = decode(answers[1920], law)
    assert len(decoded) == len(whole) == len(pcm) // 3
    error = np.abs(decoded - whole)
    assert (error <= np.maximum(np.abs(whole) * 0.07, 16)).all()  # within companding of the whole-signal result


def test_tones_above_4_khz_are_filtered_out_not_folded_down():
    t = np.arange(24000) / 24000
    pcm = np.round(np.sin(2 * np.pi * 6000 * t) * 16000).astype(np.int16)  # would alias to 2 kHz
    decoded = decode(streamed("ulaw", pcm, 1920), "ulaw")[400:-400].astype(np.float64)
    assert np.sqrt(np.mean(decoded ** 2)) < 200  # 16000 * 0.707 before: at least 35 dB down
