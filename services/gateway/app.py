"""The gateway's FastAPI app: a factory given the running gateway, and dependencies as `Annotated` aliases (so a
test overrides one function, not many patches). The connection, the lease and the supervisor belong to the service
lifecycle (services/gateway/service.py), not to the app."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection

from services.gateway.auth import check_bearer
from services.gateway.errors import GatewayError, http_error, internal_error
from services.gateway.request_id import RequestIdMiddleware, request_id_of
from services.gateway.runtime import Gateway


def get_gateway(connection: HTTPConnection) -> Gateway:
    """The running gateway (given to `create_app`)."""
    return connection.app.state.gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]


def require_api_key(connection: HTTPConnection, gateway: GatewayDep) -> None:
    """Raise Unauthorized unless the call carries a configured API key (no keys configured: open)."""
    check_bearer(connection.headers.get("authorization"), gateway.api_keys)


Authorized = Annotated[None, Depends(require_api_key)]


def create_app(gateway: Gateway) -> FastAPI:
    """The gateway app serving `gateway` (built by the gateway service once connected, or a test's stand-in)."""
    from services.gateway.routes import health, metrics, models, speech, speech_stream

    app = FastAPI(title="voxmesh gateway", version="0.1.0")
    app.state.gateway = gateway
    app.add_middleware(RequestIdMiddleware)
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
    app.include_router(health.router)
    app.include_router(metrics.router)
    app.include_router(models.router)
    app.include_router(speech.router)
    app.include_router(speech_stream.router)
    return app


async def _gateway_error(request: Request, error: GatewayError) -> JSONResponse:
    if error.request_id is None:  # refused before admission: the HTTP request's own id
        error.request_id = request_id_of(request)
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


async def _http_error(request: Request, error: HTTPException) -> JSONResponse:
    """Starlette's own errors (unknown path, wrong method) in OpenAI's error shape."""
    return await _gateway_error(request, http_error(error.status_code, str(error.detail)))


async def _internal_error(request: Request, error: Exception) -> JSONResponse:
    """A bug: a 500 in OpenAI's shape, with the request id (logged with its traceback by the server)."""
    return await _gateway_error(request, internal_error(error))
