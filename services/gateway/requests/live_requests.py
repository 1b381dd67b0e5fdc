"""The requests this gateway holds anything for: an admission under way, an audio stream open for a client, or
supervision until the terminal event. Counted per request id, so `len()` is the number of live requests, the
admission limit (`--max-live-requests`) compares against it, and `until_none()` awaits the moment none is left
(a connection storm's requests all released)."""

from __future__ import annotations

import asyncio


class LiveRequests:
    """Holds on request ids; a request is live while any hold on it remains."""

    def __init__(self) -> None:
        self._holds: dict[str, int] = {}
        self._none = asyncio.Event()
        self._none.set()

    def __len__(self) -> int:
        return len(self._holds)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._holds

    def hold(self, request_id: str) -> None:
        """One more part of the gateway holds `request_id`."""
        self._holds[request_id] = self._holds.get(request_id, 0) + 1
        self._none.clear()

    def release(self, request_id: str) -> None:
        """One hold on `request_id` ends (each `hold` is released exactly once)."""
        remaining = self._holds.get(request_id, 0) - 1
        if remaining > 0:
            self._holds[request_id] = remaining
            return
        self._holds.pop(request_id, None)
        if not self._holds:
            self._none.set()

    async def until_none(self) -> None:
        """Until no request is live."""
        await self._none.wait()
