"""Every response format at every rate it is served at, without a server: the model's 24 kHz audio encoded whole and
streamed piece by piece (pieces of a chunk's size and odd sizes), decoded by an independent decoder (libsndfile
through `soundfile` for wav, flac, mp3 and opus; FFmpeg's decoder through PyAV for aac; the tests' own G.711
tables), must be the same samples streamed or whole, at the rate asked for; the lossless formats must carry libsoxr's
resampling of the whole signal."""

from __future__ import annotations

import io
import struct

import av
import numpy as np
import pytest
import soundfile
import soxr

from services.gateway.errors import AdmissionError
from services.gateway.http.encoders import encode_whole, stream_encoder
from services.gateway.requests.response_formats import FORMATS, served_rate
from tests.support.g711_tables import decode as g711_decode

MODEL_RATE = 24000
TONE_HZ = 440.0
CASES = [(name, rate) for name, fmt in FORMATS.items() if fmt.is_available for rate in fmt.rates]


def tone(seconds: float = 1.0) -> np.ndarray:
    """24 kHz int16: a 440 Hz tone with a little of 3 kHz, so a wrong rate shows as a wrong pitch."""
    t = np.arange(int(MODEL_RATE * seconds)) / MODEL_RATE
    wave = 0.4 * np.sin(2 * np.pi * TONE_HZ * t) + 0.05 * np.sin(2 * np.pi * 3000 * t)
    return np.round(wave * 32767).astype(np.int16)


def streamed(name: str, pcm: bytes, rate: int, piece_bytes: int) -> bytes:
    encoder = stream_encoder(FORMATS[name], MODEL_RATE, rate)
    pieces = [encoder.feed(pcm[i:i + piece_bytes]) for i in range(0, len(pcm), piece_bytes)]
    return b"".join(pieces) + encoder.finish()


def decoded(name: str, data: bytes, rate: int, num_samples: int) -> tuple[int, np.ndarray]:
    """(rate, int16-scaled samples) as an independent decoder reads `data`; a streamed wav or flac, which cannot
    know its length, is given `num_samples` in its header first (libsndfile wants it)."""
    if name == "pcm":
        return rate, np.frombuffer(data, dtype="<i2").astype(np.float64)
    if name in ("ulaw", "alaw"):
        return rate, g711_decode(data, name).astype(np.float64)
    if name == "aac":
        return aac_decoded(data)
    if name == "wav" and data[4:8] == b"\xff\xff\xff\xff":  # streamed: libsndfile needs the sizes, known now
        data = data[:4] + struct.pack("<I", len(data) - 8) + data[8:40] + struct.pack("<I", len(data) - 44) + data[44:]
    if name == "flac" and int.from_bytes(data[18:26], "big") & (1 << 36) - 1 == 0:
        packed = (int.from_bytes(data[18:26], "big") & ~((1 << 36) - 1)) | num_samples  # STREAMINFO's 36 bits
        data = data[:18] + packed.to_bytes(8, "big") + data[26:]
    with soundfile.SoundFile(io.BytesIO(data)) as file:  # in blocks: a streamed flac does not say its length
        blocks = list(file.blocks(blocksize=4096, dtype="int16"))
        return file.samplerate, np.concatenate(blocks).astype(np.float64)


def aac_decoded(data: bytes) -> tuple[int, np.ndarray]:
    """(rate, int16-scaled samples) of ADTS AAC, as FFmpeg's decoder reads it."""
    with av.open(io.BytesIO(data), format="adts") as container:
        frames = [frame.to_ndarray().ravel() for frame in container.decode(audio=0)]
        rate = container.streams.audio[0].rate
    return rate, np.concatenate(frames).astype(np.float64) * 32768


def pitch(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.argmax(spectrum) * rate / len(samples))


@pytest.mark.parametrize(("name", "rate"), CASES)
def test_streamed_equals_whole_at_the_rate_asked_for(name, rate):
    pcm = tone().tobytes()
    whole = encode_whole(FORMATS[name], pcm, MODEL_RATE, rate)
    num_samples = len(pcm) // 2 * rate // MODEL_RATE
    chunk_bytes = 2 * 1920 * 4  # a chunk of 4 codec frames
    for piece_bytes in (chunk_bytes, 2 * 4801):
        got_rate, samples = decoded(name, streamed(name, pcm, rate, piece_bytes), rate, num_samples)
        whole_rate, whole_samples = decoded(name, whole, rate, num_samples)
        assert got_rate == whole_rate == rate
        assert np.array_equal(samples, whole_samples), "the same audio streamed or whole"
    # One second; codecs pad the ends (mp3, aac: encoder delay and a last frame, ~0.1 s at low rates).
    assert len(whole_samples) == pytest.approx(rate, abs=max(0.07 * rate, 1800))
    assert pitch(whole_samples, rate) == pytest.approx(TONE_HZ, abs=2)


@pytest.mark.parametrize("rate", FORMATS["wav"].rates)
@pytest.mark.parametrize("name", ["pcm", "wav", "flac"])
def test_lossless_formats_carry_the_whole_signal_resampled(name, rate):
    pcm = tone()
    reference = soxr.resample(pcm.astype(np.float32) / 32768, MODEL_RATE, rate, quality="HQ") * 32768
    _, samples = decoded(name, encode_whole(FORMATS[name], pcm.tobytes(), MODEL_RATE, rate), rate, len(reference))
    assert len(samples) == len(reference) == len(pcm) * rate // MODEL_RATE
    assert np.abs(samples - reference).max() <= 0.5 + 1e-3  # rounded to 16 bits, nothing more


def test_the_models_rate_passes_through_untouched():
    pcm = tone().tobytes()
    assert encode_whole(FORMATS["pcm"], pcm, MODEL_RATE, MODEL_RATE) == pcm
    assert streamed("pcm", pcm, MODEL_RATE, 3840) == pcm


@pytest.mark.parametrize(("name", "rate"), [("opus", 44100), ("opus", 22050), ("wav", 11025), ("pcm", 96000),
                                            ("ulaw", 12000)])
def test_a_rate_the_format_lacks_is_refused_naming_its_rates(name, rate):
    with pytest.raises(AdmissionError) as refused:
        served_rate(FORMATS[name], rate)
    assert (refused.value.code, refused.value.param) == ("unsupported_value", "sample_rate")
    assert ", ".join(map(str, FORMATS[name].rates)) in refused.value.message


def test_default_rates():
    assert {name: served_rate(fmt, None) for name, fmt in FORMATS.items()} == {
        "wav": 24000, "pcm": 24000, "flac": 24000, "mp3": 24000, "opus": 24000, "aac": 24000, "ulaw": 8000,
        "alaw": 8000}


@pytest.mark.parametrize("rate", FORMATS["aac"].rates)
def test_aac_is_adts_streamed_frame_by_frame_the_same_bytes_as_whole(rate):
    pcm = tone().tobytes()
    whole = encode_whole(FORMATS["aac"], pcm, MODEL_RATE, rate)
    encoder = stream_encoder(FORMATS["aac"], MODEL_RATE, rate)
    pieces = [encoder.feed(pcm[i:i + 7680]) for i in range(0, len(pcm), 7680)]
    pieces.append(encoder.finish())
    assert b"".join(pieces) == whole
    assert sum(1 for piece in pieces[:-1] if piece) >= len(pieces) // 2  # frames leave as they are made
    assert whole[:2] == b"\xff\xf1"  # an ADTS sync word (MPEG-4, no CRC) opens the stream
