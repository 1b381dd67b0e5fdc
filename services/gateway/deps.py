"""The FastAPI dependencies of the gateway's routes, as `Annotated` aliases (a test overrides one function, not many
patches). Apart from app.py, so a route imports what it depends on and never the app: no import runs in a circle.

Each is `async def`, though none awaits: FastAPI runs a plain `def` dependency in a worker thread, a thread hop per
request for an attribute read, and those threads come and go with the traffic."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from starlette.requests import HTTPConnection

from services.gateway.http.auth import check_bearer
from services.gateway.gateway import Gateway
from services.gateway.tenancy.tenant import Tenant
from services.gateway.ws.resume import ResumeRegistry


async def get_gateway(connection: HTTPConnection) -> Gateway:
    """The running gateway (set by the lifespan)."""
    return connection.app.state.gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]


async def require_api_key(connection: HTTPConnection, gateway: GatewayDep) -> Tenant:
    """The call's tenant; Unauthorized unless the call carries a configured API key (no keys configured: the
    anonymous tenant)."""
    return gateway.keyring.authenticate(connection.headers.get("authorization"))


Authorized = Annotated[Tenant, Depends(require_api_key)]


async def require_operator_key(connection: HTTPConnection, gateway: GatewayDep) -> None:
    """Raise Unauthorized unless the call carries an operator key (the admin keys, else the client keys)."""
    if gateway.admin_keys:
        check_bearer(connection.headers.get("authorization"), gateway.admin_keys)
    else:
        gateway.keyring.authenticate(connection.headers.get("authorization"))


OperatorAuthorized = Annotated[None, Depends(require_operator_key)]


async def get_resume_registry(connection: HTTPConnection, gateway: GatewayDep) -> ResumeRegistry:
    """The gateway's parked WebSocket requests: one registry per app, made at the first socket (with the
    supervisor's resume window, so both agree on when a request is gone)."""
    state = connection.app.state
    if getattr(state, "resume_registry", None) is None:
        state.resume_registry = ResumeRegistry(gateway.synthesizer.supervisor.resume_window)
    return state.resume_registry


ResumeRegistryDep = Annotated[ResumeRegistry, Depends(get_resume_registry)]
