"""The answers of a call over its key's limits: HTTP 429 with Retry-After and OpenAI's rate-limit headers, a
specific code, and nothing queued (a WebSocket gets an `error` event with the same code)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from messages.errors import ErrorCode
from services.gateway.errors import GatewayError


@dataclass(frozen=True, slots=True)
class RateHeaders:
    """OpenAI's `x-ratelimit-*-requests` of the key's request rate: the bucket's size, whole tokens left, and the
    time until it is full again (`1.5s`)."""

    limit: int
    remaining: int
    reset_s: float

    def headers(self) -> dict[str, str]:
        return {"x-ratelimit-limit-requests": str(self.limit),
                "x-ratelimit-remaining-requests": str(max(0, self.remaining)),
                "x-ratelimit-reset-requests": f"{max(0.0, self.reset_s):.3g}s"}


class LimitRefused(GatewayError):
    """A call over one of its key's limits (HTTP 429): `rate_limited`, `too_many_live_requests` or
    `quota_exceeded`."""

    def __init__(self, code: ErrorCode, message: str, retry_after_s: float, rate: RateHeaders | None) -> None:
        super().__init__(code, message, retry_after_s=max(1, math.ceil(retry_after_s)), status=429)
        self.rate = rate

    def headers(self) -> dict[str, str]:
        return {**super().headers(), **(self.rate.headers() if self.rate is not None else {})}
