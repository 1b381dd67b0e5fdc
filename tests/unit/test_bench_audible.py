"""The first audible sample (-50 dBFS) and the PCM byte stream cut into whole samples, piece by piece."""

from __future__ import annotations

import numpy as np

from loadtest.bench.audible import AUDIBLE_DBFS, AUDIBLE_THRESHOLD, AudibleSample, PcmScanner, first_audible_index


def pcm(*values: int) -> bytes:
    return np.asarray(values, dtype="<i2").tobytes()


def test_the_threshold_is_minus_50_dbfs_of_s16_full_scale():
    assert AUDIBLE_DBFS == -50.0
    assert AUDIBLE_THRESHOLD == 104  # 32768 x 10^(-50/20) = 103.6
    assert 20 * np.log10(AUDIBLE_THRESHOLD / 32768) > AUDIBLE_DBFS > 20 * np.log10((AUDIBLE_THRESHOLD - 1) / 32768)


def test_first_audible_index_takes_either_sign_and_only_from_the_threshold_on():
    assert first_audible_index(np.array([0, 103, -103, 50], dtype=np.int16)) is None
    assert first_audible_index(np.array([0, 103, -104, 200], dtype=np.int16)) == 2
    assert first_audible_index(np.array([-32768], dtype=np.int16)) == 0  # no overflow on the most negative sample


def test_scanner_joins_a_sample_split_between_pieces_and_marks_where_audio_became_audible():
    scanner = PcmScanner()
    data = pcm(0, 10, 100, 300, 5)  # the first audible sample is index 3
    assert scanner.feed(b"", 0.5) == 0 and scanner.first_byte_at is None
    assert scanner.feed(data[:3], 1.0) == 1  # one whole sample and half of the next
    assert scanner.first_byte_at == 1.0 and scanner.has_partial_sample
    assert scanner.feed(data[3:7], 2.0) == 2  # samples 1 and 2 (still quiet) and half of sample 3
    assert scanner.first_audible is None
    assert scanner.feed(data[7:], 3.0) == 2  # sample 3 completes here: audible at this piece's arrival
    assert scanner.first_audible == AudibleSample(at=3.0, index=3)
    assert scanner.num_samples == 5 and not scanner.has_partial_sample
    scanner.feed(pcm(30000), 4.0)
    assert scanner.first_audible == AudibleSample(at=3.0, index=3), "the first one stays"


def test_a_silent_stream_never_becomes_audible():
    scanner = PcmScanner()
    scanner.feed(pcm(*([50] * 100)), 1.0)
    assert scanner.first_audible is None and scanner.first_byte_at == 1.0
