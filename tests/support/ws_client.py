"""A test client of the streaming WebSocket protocol (services/gateway/ws/protocol.py): send typed messages, collect
audio and events exactly as a client sees them."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import websockets

PATH = "/v1/audio/speech/stream"
WAIT_S = 120.0  # bound on any one wait


@dataclass
class Received:
    """What arrived up to (and including) the event a test waited for."""

    event: dict
    pcm: bytes = b""
    frames: list[bytes] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)


class WsClient:
    """One socket. `events` keeps every JSON event received, in order."""

    def __init__(self, socket: websockets.ClientConnection) -> None:
        self.socket = socket
        self.events: list[dict] = []

    async def send(self, kind: str, **fields) -> None:
        await self.socket.send(json.dumps({"type": kind, **fields}))

    async def receive(self) -> str | bytes:
        return await asyncio.wait_for(self.socket.recv(), WAIT_S)

    async def until(self, *kinds: str, frames: int | None = None) -> Received:
        """Collect audio (binary frames, or decoded `audio.delta`) until an event of `kinds` arrives, or until
        `frames` audio frames have (then `event` is empty)."""
        got = Received(event={})
        while frames is None or len(got.frames) < frames:
            message = await self.receive()
            if isinstance(message, bytes):
                got.frames.append(message)
                continue
            event = json.loads(message)
            self.events.append(event)
            got.events.append(event)
            if event["type"] == "audio.delta":
                got.frames.append(base64.b64decode(event["audio"]))
            elif event["type"] in kinds:
                got.event = event
                break
        got.pcm = b"".join(got.frames)
        return got

    async def closed(self) -> websockets.ConnectionClosed:
        """Wait for the server to close the socket; returns how it closed."""
        try:
            while True:
                message = await self.receive()
                if isinstance(message, str):
                    self.events.append(json.loads(message))
        except websockets.ConnectionClosed as closed:
            return closed


@contextlib.asynccontextmanager
async def ws_connect(base_url: str, **options) -> AsyncIterator[WsClient]:
    """A client on `base_url` (http://host:port or ws://host:port)."""
    url = base_url.replace("http://", "ws://").rstrip("/") + PATH
    async with websockets.connect(url, max_size=None, **options) as socket:
        yield WsClient(socket)


async def one_shot(url: str, body: dict) -> list[bytes]:
    """A one-shot request (its body sent as it is) on a socket of its own; its audio frames, once done."""
    async with ws_connect(url) as client:
        await client.socket.send(json.dumps(body))
        got = await client.until("audio.done", "error")
    assert got.event["type"] == "audio.done", got.event
    return got.frames
