"""WAV container for 16-bit mono PCM (what the vocoder publishes)."""

from __future__ import annotations

import struct

from messages.audio_format import BYTES_PER_SAMPLE, CHANNELS

BITS_PER_SAMPLE = 8 * BYTES_PER_SAMPLE


def wav_header(num_samples: int, sample_rate: int) -> bytes:
    """The 44-byte RIFF/WAVE header of `num_samples` s16 mono samples."""
    block_align = CHANNELS * BITS_PER_SAMPLE // 8
    data_bytes = num_samples * block_align
    return (b"RIFF" + struct.pack("<I", 36 + data_bytes) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, CHANNELS, sample_rate, sample_rate * block_align,
                                    block_align, BITS_PER_SAMPLE)
            + b"data" + struct.pack("<I", data_bytes))


def wav_bytes(pcm: bytes, sample_rate: int) -> bytes:
    """A complete WAV file of s16le mono `pcm`."""
    return wav_header(len(pcm) // 2, sample_rate) + pcm
