"""Which NATS user a compose service runs as: its role, read from its command (`voxmesh serve decode` -> decode)."""

from __future__ import annotations

from messages.permissions import SERVICE_USERS
from services.mesh.compose_plan import ComposeError


def nats_user_of(command: tuple[str, ...]) -> str:
    """`voxmesh provision ...` -> provision, `voxmesh serve <kind> ...` -> <kind>; any other command has no user."""
    words = list(command[1:]) if command and command[0] == "voxmesh" else []
    if words[:1] == ["provision"]:
        return "provision"
    if words[:1] == ["serve"] and len(words) > 1 and words[1] in SERVICE_USERS:
        return words[1]
    raise ComposeError(f"command {' '.join(command)!r} has no NATS user of its own: voxmesh runs `voxmesh provision` "
                       f"and `voxmesh serve {{{','.join(sorted(SERVICE_USERS))}}}`")
