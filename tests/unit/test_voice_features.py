"""The audio front end of voice cloning: the resampler, the speaker encoder's log-mel, the reference's limits.

The mel is compared with the reference's own `mel_spectrogram` and librosa's filterbank; the resampler with the
exact band-limited signal it must reproduce, since a tone below both Nyquist frequencies has one right answer.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from services.model.voice.cloner import mono_samples
from services.model.voice.errors import ReferenceAudioError
from services.model.voice.limits import MAX_REFERENCE_S, MIN_REFERENCE_S, check_reference
from services.model.voice.mel import LogMel, MelSettings, mel_filterbank
from services.model.voice.resample import resample
from tests.support.oracle.reference import load as load_reference


def tones(rate: int, seconds: float, freqs: list[float]) -> tuple[np.ndarray, callable]:
    def at(times: np.ndarray) -> np.ndarray:
        return sum(np.sin(2 * np.pi * f * times + i) for i, f in enumerate(freqs)) / len(freqs)

    return at(np.arange(int(rate * seconds)) / rate), at


@pytest.mark.parametrize("from_rate,to_rate", [(44100, 24000), (48000, 24000), (16000, 24000), (22050, 24000),
                                               (8000, 24000), (96000, 24000), (24000, 16000), (11025, 24000)])
def test_resampling_reproduces_band_limited_audio(from_rate: int, to_rate: int):
    low = min(from_rate, to_rate)
    audio, at = tones(from_rate, 2.0, [97.0, 1234.5, 0.2 * low, 0.4 * low])
    out = resample(torch.tensor(audio, dtype=torch.float32), from_rate, to_rate).numpy()
    assert out.shape[0] == math.ceil(audio.shape[0] * to_rate / from_rate)
    inner = slice(to_rate // 10, out.shape[0] - to_rate // 10)  # away from the edges' zero padding
    assert np.abs(out[inner] - at(np.arange(out.shape[0]) / to_rate)[inner]).max() < 1e-4


@pytest.mark.parametrize("from_rate", [44100, 48000, 96000])
def test_downsampling_removes_what_the_new_rate_cannot_hold(from_rate: int):
    """A tone above the new Nyquist frequency would alias into the audible band; it must vanish instead."""
    audio, _ = tones(from_rate, 1.0, [0.62 * 24000])
    out = resample(torch.tensor(audio, dtype=torch.float32), from_rate, 24000).numpy()
    assert np.abs(out[2400:-2400]).max() < 1e-4


def test_resampling_is_identity_at_the_same_rate_and_refuses_unreasonable_ratios():
    audio = torch.randn(1000)
    assert resample(audio, 24000, 24000) is audio
    with pytest.raises(ReferenceAudioError) as refused:
        resample(audio, 24001, 24000)
    assert refused.value.code == "unsupported_sample_rate"


def test_mel_filterbank_equals_librosa():
    librosa = pytest.importorskip("librosa")
    expected = librosa.filters.mel(sr=24000, n_fft=1024, n_mels=128, fmin=0, fmax=12000)
    torch.testing.assert_close(mel_filterbank(MelSettings()), torch.from_numpy(expected), atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("num_samples", [24000, 24000 * 2 + 131])
def test_log_mel_equals_the_reference(num_samples: int):
    load_reference()
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram

    audio = (0.3 * torch.randn(num_samples, generator=torch.Generator().manual_seed(1))).clamp(-1, 1)
    audio[:2000] = 0.0  # silence: the floor of the log
    expected = mel_spectrogram(audio[None], n_fft=1024, num_mels=128, sampling_rate=24000, hop_size=256,
                               win_size=1024, fmin=0, fmax=12000).transpose(1, 2)[0]
    ours = LogMel(MelSettings())(audio)
    assert ours.shape == (num_samples // 256, 128)
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)


def test_reference_limits():
    check_reference(24000 * 3, 24000)
    check_reference(int(16000 * MIN_REFERENCE_S), 16000)
    for samples, rate, code in [(23999, 24000, "ref_audio_too_short"), (int(44100 * MAX_REFERENCE_S) + 1, 44100,
                                "ref_audio_too_long"), (48000, 4000, "unsupported_sample_rate"),
                                (48000 * 4, 384000, "unsupported_sample_rate")]:
        with pytest.raises(ReferenceAudioError) as refused:
            check_reference(samples, rate)
        assert refused.value.code == code


def test_mono_samples_mixes_channels_down_and_refuses_what_is_not_audio():
    stereo = np.stack([np.ones(100, np.float32), np.zeros(100, np.float32)], axis=1)
    assert torch.equal(mono_samples(stereo), torch.full((100,), 0.5))
    assert mono_samples(np.arange(4, dtype=np.int16)).dtype == torch.float32
    for bad in (np.zeros(0, np.float32), np.zeros((2, 2, 2), np.float32), np.array([0.0, np.nan], np.float32)):
        with pytest.raises(ReferenceAudioError) as refused:
            mono_samples(bad)
        assert refused.value.code == "invalid_ref_audio"
