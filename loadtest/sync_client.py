"""One streaming request with the blocking `websocket-client` library (for Locust, whose users are greenlets:
gevent makes these sockets cooperative). Same protocol handling and record as the asyncio client."""

from __future__ import annotations

import json
from time import perf_counter

import websocket

from loadtest.metrics import StreamRecord
from loadtest.protocol import StreamRecorder

_NO_PROXY = ["*"]  # a load test never goes through a proxy from the environment


def stream_request_sync(url: str, payload: dict, *, index: int = 0, prompt_id: str = "", timeout_s: float = 120.0,
                        api_key: str | None = None) -> tuple[StreamRecord, int]:
    """Send `payload` on a new socket to `url` and record the stream; returns (record, PCM bytes received).
    Failures end up in the record's `error`, as with `loadtest.client.stream_request`."""
    recorder = StreamRecorder(index, prompt_id, perf_counter())
    deadline = recorder.started_at + timeout_s
    headers = [f"Authorization: Bearer {api_key}"] if api_key else None
    try:
        socket = websocket.create_connection(url, timeout=timeout_s, header=headers, http_no_proxy=_NO_PROXY,
                                             enable_multithread=False)
    except (websocket.WebSocketException, OSError) as exc:
        recorder.fail("connect_failed", f"cannot open {url}: {exc}", perf_counter())
        return recorder.record(), 0
    try:
        socket.send(json.dumps(payload))
        recorder.mark_sent(perf_counter())
        _receive_until_end(socket, recorder, deadline)
    except websocket.WebSocketTimeoutException:
        recorder.fail("client_timeout", f"no end of stream within {timeout_s:.1f} s", perf_counter())
    except (websocket.WebSocketConnectionClosedException, websocket.WebSocketException, OSError) as exc:
        recorder.fail("connection_closed", f"the socket failed mid-stream: {exc}", perf_counter())
    finally:
        socket.close()
    return recorder.record(), recorder.num_bytes


def _receive_until_end(socket: websocket.WebSocket, recorder: StreamRecorder, deadline: float) -> None:
    while True:
        remaining = deadline - perf_counter()
        if remaining <= 0:
            raise websocket.WebSocketTimeoutException("deadline passed")
        socket.settimeout(remaining)
        opcode, data = socket.recv_data()
        now = perf_counter()
        if opcode == websocket.ABNF.OPCODE_CLOSE:
            recorder.fail("connection_closed", "the gateway closed the socket before audio.done", now)
            return
        message = data.decode("utf-8") if opcode == websocket.ABNF.OPCODE_TEXT else data
        if recorder.on_message(message, now):
            return
