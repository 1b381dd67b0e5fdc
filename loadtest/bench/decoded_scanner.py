"""`PcmScanner`'s counterpart for a body in another format: the body's first byte is timed as it arrives, its audio
decoded piece by piece (audio_decode.py) and the samples each piece made playable are counted and searched for the
first audible one, as PcmScanner does for raw PCM. Samples only the end of the stream releases (a decoder's last
frame) count as arriving at the end (`finish`)."""

from __future__ import annotations

from loadtest.bench.audible import AudibleSample, PcmScanner
from loadtest.bench.audio_decode import decoder_for


class DecodedScanner:
    """Follows one streamed body of `response_format` (one of audio_decode.DECODED_FORMATS).

    Raises audio_decode.AudioDecodeError from `feed` or `finish` for bytes that are not that format.
    """

    def __init__(self, response_format: str) -> None:
        self.first_byte_at: float | None = None
        self._decoder = decoder_for(response_format)
        self._samples = PcmScanner()

    def feed(self, data: bytes, at: float) -> int:
        """Take one piece that arrived at `at`; returns how many samples it made playable."""
        if not data:
            return 0
        if self.first_byte_at is None:
            self.first_byte_at = at
        return self._samples.feed_samples(self._decoder.decode(data), at)

    def finish(self, at: float) -> int:
        """The body ended at `at`: the samples the decoder held back until then."""
        return self._samples.feed_samples(self._decoder.finish(), at)

    @property
    def first_audible(self) -> AudibleSample | None:
        return self._samples.first_audible

    @property
    def num_samples(self) -> int:
        return self._samples.num_samples

    @property
    def has_partial_sample(self) -> bool:
        """Bytes of an unfinished sample, page or header left: a body that ends here was cut."""
        return self._decoder.has_partial

    @property
    def declared_rate(self) -> int | None:
        """The rate the stream's own header says (WAV, FLAC, Opus, an mp3 or AAC frame), None for G.711."""
        return self._decoder.declared_rate

    @property
    def decode_rate(self) -> int | None:
        """The rate of the samples counted: None where it is the answer's `X-Sample-Rate` (G.711), 48000 for
        Opus, else the stream's own."""
        return self._decoder.decode_rate
