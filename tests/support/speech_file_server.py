"""A small HTTP/1.1 server on 127.0.0.1 that answers `POST /v1/audio/speech` with known audio (encoded_audio.py) in
the asked `response_format` at the asked `sample_rate`, as the gateway does: `X-Sample-Rate`, `X-Request-Id`, a
streamed body in chunks when the request streams, a 400 `unsupported_value` for a rate it does not serve. The
clients' tests run against it before the gateway serves those fields. No tests here."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from tests.support.encoded_audio import MEDIA_TYPES, encode, signal

RATES = (8000, 16000, 22050, 24000, 44100, 48000)
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)
PIECE_BYTES = 1500  # a streamed body goes out in pieces of this size


@dataclass
class SpeechFileServer:
    """What the server saw and how it answers: `bodies` (the JSON of every request, in order), `served_rate`
    (answer every request at this rate whatever was asked: a gateway that ignores the field)."""

    port: int = 0
    bodies: list[dict] = field(default_factory=list)
    served_rate: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def answer(self, body: dict) -> tuple[int, dict, bytes]:
        """(status, headers, body) for one request."""
        response_format = body.get("response_format", "wav")
        default = 8000 if response_format in ("ulaw", "alaw") else 24000
        rate = body.get("sample_rate", default)
        if rate not in (OPUS_RATES if response_format == "opus" else RATES) or response_format not in MEDIA_TYPES:
            error = {"error": {"code": "unsupported_value", "message": f"no {response_format} at {rate} Hz",
                               "param": "sample_rate"}}
            return 400, {"Content-Type": "application/json"}, json.dumps(error).encode()
        served = self.served_rate or rate
        audio = encode(response_format, signal(served), served)
        headers = {"Content-Type": MEDIA_TYPES[response_format], "X-Sample-Rate": str(served),
                   "X-Request-Id": f"req_{len(self.bodies)}"}
        return 200, headers, audio

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while request := await _read_request(reader):
                self.bodies.append(request)
                status, headers, audio = self.answer(request)
                streamed = status == 200 and (request.get("stream") or request.get("stream_format") == "audio")
                await _write_response(writer, status, headers, audio, streamed)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def _read_request(reader: asyncio.StreamReader) -> dict | None:
    """The JSON body of the next request on the connection (None once the client closed it)."""
    head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
    if not head:
        return None
    lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    return json.loads(await reader.readexactly(int(headers.get("content-length", "0"))) or b"{}")


async def _write_response(writer: asyncio.StreamWriter, status: int, headers: dict, body: bytes,
                          streamed: bool) -> None:
    reason = {200: "OK", 400: "Bad Request"}[status]
    framing = {"Transfer-Encoding": "chunked"} if streamed else {"Content-Length": str(len(body))}
    head = "".join(f"{name}: {value}\r\n" for name, value in {**headers, **framing}.items())
    writer.write(f"HTTP/1.1 {status} {reason}\r\n{head}\r\n".encode("latin-1"))
    if not streamed:
        writer.write(body)
        await writer.drain()
        return
    for at in range(0, len(body), PIECE_BYTES):
        piece = body[at:at + PIECE_BYTES]
        writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        await writer.drain()  # each piece its own write: the client reads the body as it streams
    writer.write(b"0\r\n\r\n")
    await writer.drain()


@contextlib.asynccontextmanager
async def speech_file_server() -> AsyncIterator[SpeechFileServer]:
    """`async with speech_file_server() as server:` serving on `server.url` until the block ends."""
    state = SpeechFileServer()
    server = await asyncio.start_server(state.handle, "127.0.0.1", 0)
    state.port = server.sockets[0].getsockname()[1]
    async with server:
        yield state
