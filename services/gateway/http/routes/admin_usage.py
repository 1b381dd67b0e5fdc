"""`GET /admin/usage`: requests, characters, audio seconds and errors per UTC day, tenant and model, summed from the
USAGE stream (one record per ended request, whatever gateway served it: services/usage/recorder.py). An operator
route like /metrics: with keys configured it needs an operator key, and a client key opens it only when no operator
keys are set; the `/v1` routes stay the clients'."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

from fastapi import APIRouter, Query

from messages.errors import ErrorCode
from services.gateway.deps import GatewayDep, OperatorAuthorized
from services.gateway.errors import GatewayError
from services.gateway.http.openapi import error_responses
from services.usage.reader import read_usage
from services.usage.totals import UsageQuery, UsageQueryError, grand_total, month_start, parse_time, usage_rows

router = APIRouter()

READ_TIMEOUT_S = 60.0
FROM_HELP = "ISO 8601 date or time (UTC when it has no offset); default: the start of this UTC month"
TO_HELP = "the range's exclusive end, ISO 8601; default: now"


@router.get("/admin/usage", responses=error_responses(400, 401, 503))
async def usage(gateway: GatewayDep, _: OperatorAuthorized,
                start: Annotated[str | None, Query(alias="from", description=FROM_HELP)] = None,
                end: Annotated[str | None, Query(alias="to", description=TO_HELP)] = None,
                tenant: Annotated[str | None, Query(description="one tenant (\"\" is the anonymous one)")] = None,
                model: Annotated[str | None, Query(description="one model")] = None) -> dict:
    """`{"from", "to", "rows": [{day, tenant, model, requests, characters, audio_seconds, errors}], "total"}`."""
    now = time.time()
    try:
        query = UsageQuery(parse_time(start) if start else month_start(now), parse_time(end) if end else now,
                           tenant, model)
    except UsageQueryError as error:
        raise GatewayError(ErrorCode.INVALID_VALUE, str(error), param="from/to") from None
    try:
        records = await asyncio.wait_for(read_usage(gateway.synthesizer.js, query.start), READ_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - the bus did not answer: say so, the caller retries
        raise GatewayError(ErrorCode.BUS_UNAVAILABLE, f"could not read the usage records: {exc!r}",
                           status=503) from exc
    rows = usage_rows(records, query)
    return {"from": query.start, "to": query.end, "rows": [row.as_dict() for row in rows],
            "total": grand_total(rows).as_dict()}
