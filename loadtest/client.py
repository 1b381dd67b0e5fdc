"""One streaming request through the gateway's WebSocket, timed with `time.perf_counter` (asyncio client)."""

from __future__ import annotations

import asyncio
import json
from time import perf_counter

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from loadtest.metrics import StreamRecord
from loadtest.protocol import StreamRecorder

# Audio frames are a chunk's PCM (a few hundred KB at most); the default 1 MiB cap is lifted so a large
# initial chunk is measured instead of failing the connection.
_MAX_MESSAGE_BYTES = None


async def stream_request(url: str, payload: dict, *, index: int = 0, prompt_id: str = "", timeout_s: float = 120.0,
                         api_key: str | None = None) -> StreamRecord:
    """Open a socket to `url` (the `.../v1/audio/speech/stream` endpoint), send `payload`, and record every
    message until `audio.done` or `error`. Never raises for the server's or the network's failures: they end up
    in the record's `error` (client-side codes: connect_failed, client_timeout, connection_closed)."""
    recorder = StreamRecorder(index, prompt_id, perf_counter())
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        async with asyncio.timeout(timeout_s):
            await _exchange(url, payload, recorder, headers)
    except TimeoutError:
        recorder.fail("client_timeout", f"no end of stream within {timeout_s:.1f} s", perf_counter())
    except ConnectionClosed as exc:
        recorder.fail("connection_closed", f"the gateway closed the socket mid-stream: {exc}", perf_counter())
    except (InvalidHandshake, InvalidURI, OSError) as exc:
        recorder.fail("connect_failed", f"cannot open {url}: {exc}", perf_counter())
    return recorder.record()


async def _exchange(url: str, payload: dict, recorder: StreamRecorder, headers: dict | None) -> None:
    # proxy=None: a load test never goes through a proxy from the environment (loopback traffic only).
    async with connect(url, additional_headers=headers, compression=None, max_size=_MAX_MESSAGE_BYTES, proxy=None,
                       open_timeout=None, ping_interval=None) as socket:
        await socket.send(json.dumps(payload))
        recorder.mark_sent(perf_counter())
        async for message in socket:
            if recorder.on_message(message, perf_counter()):
                return
    recorder.fail("connection_closed", "the gateway closed the socket before audio.done", perf_counter())
