"""The first audible sample of a stream, and the byte stream of raw PCM turned into whole samples as they arrive.

The public open-loop method times a request to its first *audible* sample: the first s16 sample whose magnitude
exceeds AUDIBLE_DBFS (-50 dBFS of full scale, |x| >= 104 of 32768). A real model's leading near-silence does not
count as audio there; a random-weight checkpoint speaks noise-like audio from its first frames, so on it the first
audible sample and the first playable one nearly coincide (every report says so beside the figure).

`PcmScanner` reads a stream piece by piece (a WebSocket frame, an HTTP body chunk that may split a sample) and keeps
the arrival time of its first byte, the whole samples each piece completed, and where and when the first audible
sample arrived.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from messages.audio_format import BYTES_PER_SAMPLE

AUDIBLE_DBFS = -50.0
FULL_SCALE = 32768
AUDIBLE_THRESHOLD = int(np.ceil(FULL_SCALE * 10 ** (AUDIBLE_DBFS / 20)))
"""The smallest |s16 sample| counted as audible: -50 dBFS of 32768 is 103.6, so 104."""
RANDOM_WEIGHTS_NOTE = ("on random weights, which speak noise-like audio, the first audible sample nearly coincides "
                       "with the first playable one")


def audible_threshold_label() -> str:
    return f"{AUDIBLE_DBFS:g} dBFS (|s16| >= {AUDIBLE_THRESHOLD})"


def first_audible_index(samples: np.ndarray) -> int | None:
    """The index of the first sample with |x| >= AUDIBLE_THRESHOLD, None when every sample is quieter."""
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) >= AUDIBLE_THRESHOLD)
    return int(loud[0]) if loud.size else None


@dataclass(frozen=True, slots=True)
class AudibleSample:
    """Where a stream became audible.

    Attributes:
        at: arrival time (`perf_counter`) of the piece that carried the sample.
        index: the sample's position in the stream (0 = its first sample).
    """

    at: float
    index: int


class PcmScanner:
    """Follows one stream of s16le mono PCM: its first byte, whole samples per piece and its first audible sample.

    Raw PCM says nothing of its rate (`declared_rate`, `decode_rate`: None) and holds nothing back (`finish`: 0), as
    the decoding scanner of other formats (decoded_scanner.py) may."""

    declared_rate: int | None = None
    decode_rate: int | None = None

    def __init__(self) -> None:
        self.first_byte_at: float | None = None
        self.first_audible: AudibleSample | None = None
        self.num_samples = 0
        self._carry = b""  # the first byte of a sample split between two pieces

    def feed(self, data: bytes, at: float) -> int:
        """Take one piece that arrived at `at`; returns how many whole samples it completed."""
        if not data:
            return 0
        if self.first_byte_at is None:
            self.first_byte_at = at
        data = self._carry + data
        whole = len(data) - len(data) % BYTES_PER_SAMPLE
        self._carry = data[whole:]
        if not whole:
            return 0
        return self.feed_samples(np.frombuffer(data[:whole], dtype="<i2"), at)

    def feed_samples(self, samples: np.ndarray, at: float) -> int:
        """Take s16 samples that became playable at `at` (decoded from another format); returns their count."""
        if self.first_audible is None and samples.size:
            index = first_audible_index(samples)
            if index is not None:
                self.first_audible = AudibleSample(at=at, index=self.num_samples + index)
        self.num_samples += samples.size
        return int(samples.size)

    def finish(self, at: float) -> int:
        """The stream ended at `at`: raw PCM has no samples held back."""
        return 0

    @property
    def has_partial_sample(self) -> bool:
        """A byte left over: a stream that ends here ended mid-sample."""
        return bool(self._carry)
