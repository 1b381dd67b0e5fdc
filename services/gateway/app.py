"""The gateway's FastAPI app: a factory given the running gateway (the routes' dependencies are in deps.py). The
connection, the lease and the supervisor belong to the service lifecycle (services/gateway/service.py), not to the
app."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from services.gateway.errors import GatewayError, http_error, internal_error
from services.gateway.http.openapi import documented_openapi
from services.gateway.http.request_id import RequestIdMiddleware, request_id_of
from services.gateway.http.routes import health, metrics, models, speech, speech_stream, saved_voices, admin_usage
from services.gateway.gateway import Gateway

log = logging.getLogger(__name__)
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left before its request was read: nobody gets it


def create_app(gateway: Gateway) -> FastAPI:
    """The gateway app serving `gateway` (built by the gateway service once connected, or a test's stand-in)."""
    app = FastAPI(title="voxmesh gateway", version="0.1.0")
    app.state.gateway = gateway
    app.add_middleware(RequestIdMiddleware)
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(ClientDisconnect, _client_gone)
    app.add_exception_handler(Exception, _internal_error)
    app.include_router(health.router)
    app.include_router(metrics.router)
    app.include_router(admin_usage.router)
    app.include_router(models.router)
    app.include_router(speech.router)
    app.include_router(speech_stream.router)
    app.include_router(saved_voices.router)
    app.openapi = lambda: documented_openapi(app)  # type: ignore[method-assign]
    return app


async def _gateway_error(request: Request, error: GatewayError) -> JSONResponse:
    if error.request_id is None:  # refused before admission: the HTTP request's own id
        error.request_id = request_id_of(request)
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


async def _http_error(request: Request, error: HTTPException) -> JSONResponse:
    """Starlette's own errors (unknown path, wrong method) in OpenAI's error shape."""
    return await _gateway_error(request, http_error(error.status_code, str(error.detail)))


async def _client_gone(request: Request, _error: ClientDisconnect) -> Response:
    """The client left while sending its body: nothing was admitted and nobody is there to answer (no traceback
    per dropped connection in a connection storm)."""
    log.debug("client of %s left before its body arrived", request.url.path)
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _internal_error(request: Request, error: Exception) -> JSONResponse:
    """A bug: a 500 in OpenAI's shape, with the request id (logged with its traceback by the server)."""
    return await _gateway_error(request, internal_error(error))
