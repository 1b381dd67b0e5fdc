"""The packets inside two streamed containers, cut as the bytes arrive, for the bench's decoders (audio_decode.py).

- Ogg (`opus`): pages (`OggS`, a segment table, the body); a packet ends on a segment shorter than 255 bytes and may
  go on over the next page. A page is handed on as soon as it is whole.
- FLAC (`flac`): `fLaC`, metadata blocks (the first is STREAMINFO, which the decoder needs), then frames. A frame has
  no length field: it ends where the next frame header begins, or where the bytes so far end on a frame whose
  CRC-16 checks (the usual case when the server writes a frame at a time), so a frame is decoded when it arrives,
  not a frame later. A frame header is its sync code (0xFFF8 / 0xFFF9) and fields whose CRC-8 checks.

FFmpeg's own FLAC parser holds back about ten frames to score its guesses, which would make every first-audio time
of a FLAC stream late by seconds: hence this one.
"""

from __future__ import annotations

OGG_CAPTURE = b"OggS"
OGG_HEADER_BYTES = 27
FLAC_MARKER = b"fLaC"
_FLAC_SYNCS = (b"\xff\xf8", b"\xff\xf9")
_MIN_FLAC_FRAME = 10  # sync, two field bytes, one number byte, CRC-8, the smallest subframe, CRC-16


class FramingError(ValueError):
    """The bytes are not the container they were said to be."""


class OggPackets:
    """Turns Ogg pages, arriving in pieces of any size, into the packets they carry."""

    def __init__(self) -> None:
        self._buffer = b""
        self._partial = b""  # a packet continued on the next page

    def feed(self, data: bytes) -> list[bytes]:
        """The packets completed by `data`."""
        self._buffer += data
        packets = []
        while len(self._buffer) >= OGG_HEADER_BYTES:
            if self._buffer[:4] != OGG_CAPTURE:
                raise FramingError(f"not an Ogg page: {self._buffer[:8]!r}")
            num_segments = self._buffer[26]
            lacing = self._buffer[OGG_HEADER_BYTES:OGG_HEADER_BYTES + num_segments]
            body = OGG_HEADER_BYTES + num_segments
            if len(lacing) < num_segments or len(self._buffer) < body + sum(lacing):
                break  # the rest of the page has not come yet
            for size in lacing:
                self._partial += self._buffer[body:body + size]
                body += size
                if size < 255:
                    packets.append(self._partial)
                    self._partial = b""
            self._buffer = self._buffer[body:]
        return packets

    @property
    def has_partial_page(self) -> bool:
        return bool(self._buffer or self._partial)


class FlacFrames:
    """Turns a FLAC stream, arriving in pieces of any size, into its STREAMINFO block and its frames."""

    def __init__(self) -> None:
        self.streaminfo: bytes | None = None
        self._buffer = b""
        self._in_frames = False
        self._scan_from = 0  # where the search for the next frame header goes on

    def feed(self, data: bytes) -> list[bytes]:
        """The frames completed by `data` (a frame's end is known when the next begins, or by its CRC-16)."""
        self._buffer += data
        if not self._in_frames and not self._read_metadata():
            return []
        frames = []
        while (end := self._next_frame_start()) is not None:
            frames.append(self._buffer[:end])
            self._buffer, self._scan_from = self._buffer[end:], 0
        if len(self._buffer) >= _MIN_FLAC_FRAME and crc16(self._buffer) == 0:
            frames.append(self._buffer)
            self._buffer, self._scan_from = b"", 0
        return frames

    def finish(self) -> list[bytes]:
        """The last frame, which only the end of the stream ends."""
        rest, self._buffer = self._buffer, b""
        return [rest] if rest and self._in_frames else []

    def _read_metadata(self) -> bool:
        """Consume `fLaC` and the metadata blocks once they are all here; True once frames follow."""
        if len(self._buffer) < 4:
            return False
        if self._buffer[:4] != FLAC_MARKER:
            raise FramingError(f"not a FLAC stream: {self._buffer[:8]!r}")
        position = 4
        while True:
            if len(self._buffer) < position + 4:
                return False
            kind, size = self._buffer[position], int.from_bytes(self._buffer[position + 1:position + 4], "big")
            if len(self._buffer) < position + 4 + size:
                return False
            if kind & 0x7F == 0:
                self.streaminfo = self._buffer[position + 4:position + 4 + size]
            position += 4 + size
            if kind & 0x80:  # the last metadata block
                break
        if self.streaminfo is None:
            raise FramingError("a FLAC stream without STREAMINFO")
        self._buffer, self._in_frames = self._buffer[position:], True
        return True

    def _next_frame_start(self) -> int | None:
        """Where a second frame header begins in the buffer (the first frame ends there), or None."""
        start = max(self._scan_from, 2)
        while True:
            found = [at for at in (self._buffer.find(sync, start) for sync in _FLAC_SYNCS) if at >= 0]
            if not found:
                self._scan_from = max(2, len(self._buffer) - 1)
                return None
            at = min(found)
            length = flac_header_length(self._buffer, at)
            if length is None and len(self._buffer) - at < 16:  # maybe a header not yet whole: look again later
                self._scan_from = at
                return None
            if length is not None and crc16(self._buffer[:at]) == 0:
                return at
            start = at + 1


def flac_header_length(data: bytes, at: int) -> int | None:
    """The length of the FLAC frame header at `at` without its CRC-8, when one is there whole and its CRC-8 checks."""
    if len(data) < at + 5 or data[at + 2] & 0x0F == 0x0F or data[at + 3] >> 4 >= 11 or data[at + 3] & 0x01:
        return None
    position = at + 4
    first = data[position]
    extra = 0 if first < 0x80 else next((n for n in range(1, 7) if not first & (0x80 >> (n + 1))), None)
    if extra is None or (first & 0xC0) == 0x80:
        return None
    position += 1 + extra
    position += {6: 1, 7: 2}.get(data[at + 2] >> 4, 0) + {12: 1, 13: 2, 14: 2}.get(data[at + 2] & 0x0F, 0)
    if len(data) <= position or crc8(data[at:position]) != data[position]:
        return None
    return position - at


def _table(poly: int, width: int) -> list[int]:
    top, mask = 1 << (width - 1), (1 << width) - 1
    table = []
    for byte in range(256):
        value = byte << (width - 8)
        for _ in range(8):
            value = ((value << 1) ^ poly) & mask if value & top else (value << 1) & mask
        table.append(value)
    return table


_CRC8 = _table(0x07, 8)
_CRC16 = _table(0x8005, 16)


def crc8(data: bytes) -> int:
    """FLAC's header CRC (x^8 + x^2 + x + 1, initial 0)."""
    value = 0
    for byte in data:
        value = _CRC8[value ^ byte]
    return value


def crc16(data: bytes) -> int:
    """FLAC's frame CRC (x^16 + x^15 + x^2 + 1, initial 0); 0 over a whole frame, its CRC included."""
    value = 0
    for byte in data:
        value = ((value << 8) & 0xFFFF) ^ _CRC16[(value >> 8) ^ byte]
    return value
