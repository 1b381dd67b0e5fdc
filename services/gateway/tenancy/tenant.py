"""A tenant: the API key a request came with, its limits and the priority it may use.

The gateway authenticates each call to one `Tenant` (services/gateway/tenancy/keyring.py) and stamps the requests it
admits with the tenant's `name` (`SynthesisRequest.tenant`). A mesh without keys has one anonymous tenant; keys of
the bare list (`VOXMESH_API_KEYS`) are unnamed tenants with the default limits, each limited on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from messages.errors import ErrorCode
from messages.key_limits import ANONYMOUS_TOKEN
from messages.requests import Priority
from services.gateway.errors import GatewayError

PRIORITIES: tuple[Priority, ...] = ("batch", "interactive")
"""Lowest first: a key allowed `interactive` may also ask for `batch`."""
DEFAULT_CLASS = "default"


@dataclass(frozen=True, slots=True)
class Limits:
    """A key's limits; None: no limit of that kind.

    Attributes:
        requests_per_s: the token bucket's refill rate (requests per second, sustained).
        burst: the bucket's size (requests admitted at once after a quiet spell); None: max(1, requests_per_s).
        live_requests: requests live at once across every gateway of the mesh.
        audio_s_per_day: seconds of audio the key's requests may make per UTC day.
    """

    requests_per_s: float | None = None
    burst: float | None = None
    live_requests: int | None = None
    audio_s_per_day: float | None = None

    @property
    def bucket_size(self) -> float | None:
        if self.requests_per_s is None:
            return None
        return self.burst if self.burst is not None else max(1.0, self.requests_per_s)


class PriorityNotAllowed(GatewayError):
    """A key asked for a priority above its `max_priority` (HTTP 403; WebSocket `error` event)."""

    def __init__(self, requested: str, allowed: str) -> None:
        super().__init__(ErrorCode.PRIORITY_NOT_ALLOWED, f"this API key may use priority {allowed!r} at most, not "
                         f"{requested!r}: ask for {allowed!r} or leave priority out", param="priority", status=403)


@dataclass(frozen=True, slots=True)
class Tenant:
    """Who a call is for.

    Attributes:
        name: the key's name from the keys file ("" for an unnamed key and the anonymous tenant); what
            `SynthesisRequest.tenant` carries.
        limit_key: the KV token its shared limits live under (its name, or a token for an unnamed key or the
            anonymous tenant; never a secret).
        key_class: the group its metrics are counted under (the keys file's `class`; never the key).
        limits: its limits.
        priority: the priority its requests get when they ask for none.
        max_priority: the highest priority it may ask for.
    """

    name: str
    limit_key: str
    key_class: str = DEFAULT_CLASS
    limits: Limits = Limits()
    priority: Priority = "interactive"
    max_priority: Priority = "interactive"

    def allowed_priority(self, requested: str | None) -> Priority:
        """The priority a request of this tenant runs at: `requested`, or the key's default when None.

        Raises PriorityNotAllowed when `requested` is above the key's `max_priority`."""
        if requested is None:
            return self.priority
        if requested not in PRIORITIES:  # the body's own validation names the choices first; kept as a guard
            raise PriorityNotAllowed(requested, self.max_priority)
        if PRIORITIES.index(requested) > PRIORITIES.index(self.max_priority):  # type: ignore[arg-type]
            raise PriorityNotAllowed(requested, self.max_priority)
        return requested  # type: ignore[return-value]


def anonymous(limits: Limits = Limits()) -> Tenant:
    """The one tenant of a mesh without keys."""
    return Tenant(name="", limit_key=ANONYMOUS_TOKEN, key_class="anonymous", limits=limits)
