"""`GET /metrics`: the gateway's Prometheus metrics (request outcomes by code, first-packet latency and RTF
histograms, REQUESTS queue depth, active streams, live requests). With keys configured it needs an operator key
(the admin keys, else a client key); open without any, like /health: bind the gateway to loopback or put a proxy in
front, as for the rest of the API."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from fastapi.responses import Response

from messages.streams import REQUESTS_STREAM
from services.gateway.deps import GatewayDep, OperatorAuthorized
from services.gateway.http.openapi import METRICS_RESPONSES
from services.metrics.listener import render

log = logging.getLogger(__name__)

router = APIRouter()


@router.get("/metrics", response_class=Response, responses=METRICS_RESPONSES)
async def metrics(gateway: GatewayDep, _: OperatorAuthorized) -> Response:
    """Prometheus text format; the queue depth is read from the REQUESTS stream at scrape time."""
    synthesizer = gateway.synthesizer
    synthesizer.metrics.live_requests(len(synthesizer.supervisor.live))
    try:
        info = await synthesizer.js.stream_info(REQUESTS_STREAM)
        synthesizer.metrics.queue_depth(info.state.messages)
    except Exception as exc:  # noqa: BLE001 - a scrape still answers; the depth keeps its last value
        log.warning("could not read the REQUESTS queue depth: %r", exc)
    body, content_type = render(synthesizer.metrics.registry)
    return Response(body, media_type=content_type)
