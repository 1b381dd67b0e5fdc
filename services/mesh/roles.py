"""What a compose service is, read from its command (`voxmesh serve decode` -> decode): the NATS user it runs as,
and whether it is a gateway (which alone gets the resume tokens' secret)."""

from __future__ import annotations

from messages.permissions import SERVICE_USERS
from services.mesh.compose_plan import ComposeError


def role_of(command: tuple[str, ...]) -> str | None:
    """`voxmesh provision ...` -> provision, `voxmesh serve <kind> ...` -> <kind>; None for any other command."""
    words = list(command[1:]) if command and command[0] == "voxmesh" else []
    if words[:1] == ["provision"]:
        return "provision"
    if words[:1] == ["serve"] and len(words) > 1:
        return words[1]
    return None


def nats_user_of(command: tuple[str, ...]) -> str:
    """The NATS user of the service that runs `command`; ComposeError when it has none."""
    role = role_of(command)
    if role not in SERVICE_USERS:
        raise ComposeError(f"command {' '.join(command)!r} has no NATS user of its own: voxmesh runs `voxmesh "
                           f"provision` and `voxmesh serve {{{','.join(sorted(SERVICE_USERS))}}}`")
    return role
