"""The requests this replica owns right now, each with its codes stream and its lifecycle flags."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from opentelemetry.trace import Span

from messages.base import Usage
from messages.requests import SynthesisRequest
from services.decode.codes_stream import CodesStream


@dataclass(slots=True)
class ActiveRequest:
    """One owned request. Every publish on its codes subject happens under `lock`, so the frame loop, a cancel
    and a drain never interleave their messages, and once `is_closed` (its CodesEnd is out, or another owner
    fenced it out) nothing more is published for it."""

    request: SynthesisRequest
    stream: CodesStream
    input_tokens: int = 0
    num_prompt_tokens: int = 0
    is_preempted: bool = False
    """Preempted and not yet resumed: its next frame publishes a Resumed event."""
    is_closed: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    span: Span | None = None
    """The request's `decode.request` span (W3C trace context from the gateway); ended when the request leaves."""

    @property
    def request_id(self) -> str:
        return self.request.id

    def usage(self) -> Usage:
        return Usage(input_chars=len(self.request.text), input_tokens=self.input_tokens,
                     prompt_tokens=self.num_prompt_tokens, output_frames=self.stream.num_published_frames)


class ActiveRequests:
    """Owned requests by id, and an event that is set whenever none is left (shutdown waits on it)."""

    def __init__(self) -> None:
        self._by_id: dict[str, ActiveRequest] = {}
        self.is_empty = asyncio.Event()
        self.is_empty.set()

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._by_id

    def get(self, request_id: str) -> ActiveRequest | None:
        return self._by_id.get(request_id)

    def all(self) -> list[ActiveRequest]:
        return list(self._by_id.values())

    def add(self, active: ActiveRequest) -> None:
        if active.request_id in self._by_id:
            raise ValueError(f"request {active.request_id} is already active on this replica")
        self._by_id[active.request_id] = active
        self.is_empty.clear()

    def remove(self, request_id: str) -> ActiveRequest | None:
        active = self._by_id.pop(request_id, None)
        if not self._by_id:
            self.is_empty.set()
        return active
