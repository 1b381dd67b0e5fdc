"""The bench's decoders: a streamed answer in any `response_format` but raw PCM, turned back into s16 samples piece
by piece as it arrives, so that the first audible sample and the underruns are measured as for PCM (audible.py).

- `wav`: the header skipped (its rate kept), then s16le PCM;
- `ulaw`, `alaw`: G.711, one byte a sample, by table;
- `mp3`, `aac` (ADTS): FFmpeg's parsers and decoders through PyAV (`av`), a frame decoded as soon as it is whole;
- `flac`, `opus` (in Ogg): frames and packets cut by stream_framing.py, decoded by PyAV.

Codecs count their own padding (an encoder's priming samples, Opus's pre-skip) as audio: a few ms a stream. Opus is
always decoded at 48 kHz, whatever rate it was encoded at (its header says that rate: `declared_rate`). PyAV is only
imported when one of its formats is asked for: the PCM path, which drives hundreds of streams a second, never
touches it.
"""

from __future__ import annotations

import struct

import numpy as np

from loadtest.bench.stream_framing import FlacFrames, FramingError, OggPackets

OPUS_DECODE_RATE = 48000
G711_FORMATS = ("ulaw", "alaw")
CODEC_FORMATS = ("mp3", "aac", "flac", "opus")
DECODED_FORMATS = ("wav", *G711_FORMATS, *CODEC_FORMATS)
"""Every `response_format` but `pcm` (read as it is by audible.PcmScanner)."""
_EMPTY = np.zeros(0, dtype=np.int16)


class AudioDecodeError(ValueError):
    """The body is not audio of the format it was asked in."""

    code = "undecodable_audio"


def _ulaw_table() -> np.ndarray:
    codes = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent, mantissa = (codes >> 4) & 0x07, codes & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(codes & 0x80, -magnitude, magnitude).astype(np.int16)


def _alaw_table() -> np.ndarray:
    codes = np.arange(256, dtype=np.int32) ^ 0x55
    exponent, mantissa = (codes >> 4) & 0x07, codes & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(codes & 0x80, magnitude, -magnitude).astype(np.int16)


G711_TABLES = {"ulaw": _ulaw_table(), "alaw": _alaw_table()}
"""Byte -> s16 sample, ITU-T G.711's expansion of mu-law and A-law."""


class G711Decoder:
    """G.711 bytes to samples: each byte is one sample (headerless: the rate is the one the answer's header says)."""

    declared_rate = None
    decode_rate = None

    def __init__(self, law: str) -> None:
        self._table = G711_TABLES[law]

    def decode(self, data: bytes) -> np.ndarray:
        return self._table[np.frombuffer(data, dtype=np.uint8)]

    def finish(self) -> np.ndarray:
        return _EMPTY

    has_partial = False


class WavDecoder:
    """A streamed WAV (16-bit mono PCM): the chunks before `data` read, the rest s16le samples."""

    def __init__(self) -> None:
        self.declared_rate: int | None = None
        self._buffer = b""
        self._in_data = False

    def decode(self, data: bytes) -> np.ndarray:
        self._buffer += data
        if not self._in_data and not self._read_header():
            return _EMPTY
        whole = len(self._buffer) - len(self._buffer) % 2
        samples = np.frombuffer(self._buffer[:whole], dtype="<i2")
        self._buffer = self._buffer[whole:]
        return samples

    def finish(self) -> np.ndarray:
        return _EMPTY

    @property
    def decode_rate(self) -> int | None:
        return self.declared_rate

    @property
    def has_partial(self) -> bool:
        """A byte of a sample, or a header, left over: a stream that ends here ended mid-sample."""
        return bool(self._buffer)

    def _read_header(self) -> bool:
        if len(self._buffer) >= 4 and self._buffer[:4] != b"RIFF":
            raise AudioDecodeError(f"not a WAV file: {self._buffer[:8]!r}")
        position = 12
        while len(self._buffer) >= position + 8:
            kind, size = self._buffer[position:position + 4], struct.unpack_from("<I", self._buffer, position + 4)[0]
            if kind == b"data":  # a streamed WAV's data size is a placeholder: the data runs to the end
                self._buffer, self._in_data = self._buffer[position + 8:], True
                return True
            if len(self._buffer) < position + 8 + size:
                return False
            if kind == b"fmt ":
                tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", self._buffer, position + 8)
                if (tag, channels, bits) != (1, 1, 16):
                    raise AudioDecodeError(f"a WAV of format {tag}, {channels} channels, {bits} bits: expected "
                                           "16-bit mono PCM")
                self.declared_rate = rate
            position += 8 + size + size % 2
        return False


class CodecDecoder:
    """mp3, aac, flac or opus through PyAV: the stream cut into packets, each decoded as it is whole."""

    def __init__(self, response_format: str) -> None:
        import av  # only here: the PCM path never pays for it

        self._av = av
        self._format = response_format
        self.declared_rate: int | None = None
        self._framer = OggPackets() if response_format == "opus" else FlacFrames() if response_format == "flac" else None
        self._context = None if self._framer is not None else av.CodecContext.create(response_format, "r")
        self._num_packets = 0

    def decode(self, data: bytes) -> np.ndarray:
        try:
            return self._decode_packets(self._packets(data))
        except (FramingError, self._av.FFmpegError) as error:
            raise AudioDecodeError(f"{self._format}: {error}") from None

    def finish(self) -> np.ndarray:
        try:
            tail = self._framer.finish() if isinstance(self._framer, FlacFrames) else []
            if self._context is not None and self._framer is None:
                tail = [bytes(packet) for packet in self._context.parse(b"")]
            samples = self._decode_packets(tail)
            if self._context is not None:
                samples = np.concatenate([samples, *self._frames_to_samples(self._context.decode(None))])
            return samples
        except (FramingError, self._av.FFmpegError) as error:
            raise AudioDecodeError(f"{self._format}: {error}") from None

    @property
    def has_partial(self) -> bool:
        return isinstance(self._framer, OggPackets) and self._framer.has_partial_page

    def _packets(self, data: bytes) -> list[bytes]:
        if self._framer is None:
            return [bytes(packet) for packet in self._context.parse(data)]
        packets = self._framer.feed(data)
        if self._context is None and isinstance(self._framer, FlacFrames) and self._framer.streaminfo is not None:
            self._open("flac", self._framer.streaminfo)
            self.declared_rate = int.from_bytes(self._framer.streaminfo[10:13], "big") >> 4
        if isinstance(self._framer, OggPackets):
            packets = self._opus_audio(packets)
        return packets

    def _opus_audio(self, packets: list[bytes]) -> list[bytes]:
        """Opus packets past the two header packets (OpusHead opens the decoder, OpusTags is skipped)."""
        audio = []
        for packet in packets:
            self._num_packets += 1
            if self._num_packets == 1:
                if packet[:8] != b"OpusHead":
                    raise FramingError(f"an Ogg stream that is not Opus: {packet[:8]!r}")
                self._open("opus", packet)
                self.declared_rate = struct.unpack_from("<I", packet, 12)[0]
            elif self._num_packets > 2:
                audio.append(packet)
        return audio

    def _open(self, codec: str, extradata: bytes) -> None:
        self._context = self._av.CodecContext.create(codec, "r")
        self._context.extradata = extradata

    def _decode_packets(self, packets: list[bytes]) -> np.ndarray:
        parts = [part for packet in packets
                 for part in self._frames_to_samples(self._context.decode(self._av.Packet(packet)))]
        return np.concatenate(parts) if parts else _EMPTY

    def _frames_to_samples(self, frames) -> list[np.ndarray]:
        parts = []
        for frame in frames:
            if self._format != "opus" and self.declared_rate is None:
                self.declared_rate = frame.sample_rate
            parts.append(to_s16(frame.to_ndarray()))
        return parts

    @property
    def decode_rate(self) -> int | None:
        """The rate of the samples it returns: 48 kHz for Opus, the stream's own otherwise."""
        return OPUS_DECODE_RATE if self._format == "opus" else self.declared_rate


def to_s16(array: np.ndarray) -> np.ndarray:
    """A decoded frame's first channel as s16 (planar or packed, integer or float in [-1, 1])."""
    channel = array[0] if array.ndim == 2 else array
    if channel.dtype == np.int16:
        return channel
    return np.clip(np.round(channel * 32768.0), -32768, 32767).astype(np.int16)


def decoder_for(response_format: str) -> G711Decoder | WavDecoder | CodecDecoder:
    """The decoder of a format of DECODED_FORMATS."""
    if response_format in G711_FORMATS:
        return G711Decoder(response_format)
    if response_format == "wav":
        return WavDecoder()
    if response_format in CODEC_FORMATS:
        return CodecDecoder(response_format)
    raise ValueError(f"no decoder for {response_format!r}: one of {', '.join(DECODED_FORMATS)}")
