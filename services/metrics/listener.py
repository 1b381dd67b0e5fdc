"""A loopback-only HTTP listener serving `GET /metrics` for services without an HTTP server (decode, vocoder).

Plain asyncio (no thread, no framework): the listener is a task of the service's event loop, bound to 127.0.0.1
only (scrape through a sidecar or an SSH tunnel; never exposed), and closed with the service. Port 0 means off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
_MAX_HEAD_BYTES = 8192
_READ_TIMEOUT_S = 5.0


def render(registry: Collector) -> tuple[bytes, str]:
    """The registry in Prometheus's text format 0.0.4 (every scraper reads it; our names need nothing newer), and
    its Content-Type."""
    return generate_latest(registry), CONTENT_TYPE_PLAIN_0_0_4


@contextlib.asynccontextmanager
async def metrics_listener(registry: Collector, port: int, host: str = LOOPBACK) -> AsyncIterator[int | None]:
    """Serve `registry` on http://`host`:`port`/metrics while the block runs (loopback unless another host must
    scrape it); yields the bound port (None when `port` is 0: off)."""
    if port == 0:
        yield None
        return
    server = await asyncio.start_server(lambda r, w: _answer(registry, r, w), host, port)
    bound = server.sockets[0].getsockname()[1]
    log.info("metrics on http://%s:%d/metrics", host, bound)
    try:
        yield bound
    finally:
        server.close()
        await server.wait_closed()


async def _answer(registry: Collector, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One request per connection: 200 with the metrics for GET /metrics, 404 or 405 otherwise."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT_S)
        method, path = _request_line(head)
        if path.split("?", 1)[0] != "/metrics":
            writer.write(_response(404, b"only /metrics is served here\n", "text/plain"))
        elif method not in ("GET", "HEAD"):
            writer.write(_response(405, b"use GET\n", "text/plain"))
        else:
            body, content_type = render(registry)
            writer.write(_response(200, body if method == "GET" else b"", content_type, len(body)))
        await writer.drain()
    except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError,
            ValueError) as exc:
        log.debug("metrics request dropped: %r", exc)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def _request_line(head: bytes) -> tuple[str, str]:
    if len(head) > _MAX_HEAD_BYTES:
        raise ValueError("request head too large")
    parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
    if len(parts) != 3:
        raise ValueError(f"malformed request line {parts!r}")
    return parts[0], parts[1]


def _response(status: int, body: bytes, content_type: str, length: int | None = None) -> bytes:
    reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed"}[status]
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\nConnection: close\r\n\r\n")
    return head.encode("latin-1") + body
