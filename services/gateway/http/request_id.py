"""`X-Request-Id` on every HTTP response, errors included.

Each HTTP request gets its id the moment it arrives (a pure ASGI middleware, so streamed responses and disconnect
notices pass through untouched): the speech endpoint admits its request under that id, so the header, the error body,
the logs and the mesh's events all name the same one; a response that set no id of its own (a 400 before admission,
a 404, /health) gets it added. A client's own X-Request-Id is not trusted: ids are subject tokens and must be unique.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.gateway.requests.validation import new_request_id

HEADER = "X-Request-Id"


def request_id_of(connection: HTTPConnection) -> str | None:
    """The id the middleware gave this HTTP request (None outside it, e.g. for a WebSocket)."""
    return connection.scope.get("state", {}).get("request_id")


class RequestIdMiddleware:
    """Gives every HTTP request an id (in `scope["state"]`, read with `request_id_of`) and puts it on the response
    when the response has none."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = raw = list(message.get("headers", []))
                headers = MutableHeaders(raw=raw)
                if HEADER not in headers:
                    headers[HEADER] = request_id
            await send(message)

        await self.app(scope, receive, send_with_id)
