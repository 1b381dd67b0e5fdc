"""What stream USAGE holds: one record per ended request, on `tts.usage.<id>`."""

from __future__ import annotations

from typing import Literal

from messages.base import Message, NonNegInt, RequestId, Seconds, UnixTime
from messages.requests import TenantName


class UsageRecord(Message, tag="usage_record", kw_only=True, frozen=True):
    """What one request consumed, made from its terminal event (exactly one per request).

    Attributes:
        request_id: the request.
        at: unix time of its terminal event (the time the record counts at).
        tenant: the name of the API key it came with ("" for the anonymous tenant, and for a request whose
            `accepted` event could not be read).
        model: the model it asked for ("" when its `accepted` event could not be read).
        characters: characters of its text.
        audio_seconds: seconds of audio its terminal event closes: all of it when finished, the audio sent before
            the failure when failed.
        outcome: "finished" or "failed" (an error).
        code: the failure's machine-readable code; None when finished.
    """

    request_id: RequestId
    at: UnixTime
    tenant: TenantName = ""
    model: str = ""
    characters: NonNegInt = 0
    audio_seconds: Seconds = 0.0
    outcome: Literal["finished", "failed"] = "finished"
    code: str | None = None
