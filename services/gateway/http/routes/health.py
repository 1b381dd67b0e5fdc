"""`GET /health` (the process is alive) and `GET /ready` (a request admitted now can be served)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from services.gateway.deps import GatewayDep
from services.gateway.http.openapi import READY_RESPONSES
from services.gateway.http.readiness import check_readiness

router = APIRouter()


@router.get("/health")
async def health(gateway: GatewayDep) -> dict:
    """Liveness: answers as long as the process and its event loop run."""
    return {"status": "ok", "replica": gateway.replica, "nats_connected": gateway.synthesizer.nc.is_connected}


@router.get("/ready", responses=READY_RESPONSES)
async def ready(gateway: GatewayDep) -> JSONResponse:
    """200 when NATS is connected, the streams exist, a decode replica and a vocoder partition owner are live;
    503 with the reasons otherwise."""
    verdict = await check_readiness(gateway.synthesizer)
    return JSONResponse(verdict.as_json(), status_code=200 if verdict.ready else 503)
