"""NATS users for a voxmesh mesh: one per service, each with its subjects (messages.permissions), plus `operator`.

`write_auth(directory)` makes a random password per user, writes each to `<directory>/<user>.password` (mode 0600)
and the server's `authorization` block to `<directory>/auth.conf` (mode 0600), which a nats-server configuration
includes (`include auth.conf`) or runs as is (`nats-server -c auth.conf`). Services read their password from
`VOXMESH_NATS_PASSWORD_FILE` (or `VOXMESH_NATS_PASSWORD`), never from a flag; nothing here logs a password.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from messages.permissions import OPERATOR_USER, SERVICE_USERS, Permissions

CONFIG_NAME = "auth.conf"


@dataclass(frozen=True, slots=True)
class NatsAuth:
    """Where the written credentials are: the server's authorization file and one password file per user."""

    directory: Path

    @property
    def config_file(self) -> Path:
        return self.directory / CONFIG_NAME

    def password_file(self, user: str) -> Path:
        return self.directory / f"{user}.password"

    def password(self, user: str) -> str:
        return self.password_file(user).read_text(encoding="utf-8").strip()


def users() -> list[str]:
    """Every user the mesh has: the services', the observer, and the operator."""
    return [*SERVICE_USERS, OPERATOR_USER]


def write_auth(directory: Path) -> NatsAuth:
    """Fresh passwords for every user and the server's authorization block, all readable by the owner only."""
    return _write(NatsAuth(directory), {user: secrets.token_urlsafe(24) for user in users()})


def ensure_auth(directory: Path) -> NatsAuth:
    """As write_auth, but a user whose password file is there keeps that password: a step that runs again (the
    compose files' `nats-config` at every `up`) leaves a running server's users as they were."""
    auth = NatsAuth(directory)
    passwords = {user: auth.password(user) if auth.password_file(user).is_file() else secrets.token_urlsafe(24)
                 for user in users()}
    return _write(auth, passwords)


def _write(auth: NatsAuth, passwords: dict[str, str]) -> NatsAuth:
    auth.directory.mkdir(parents=True, exist_ok=True)
    os.chmod(auth.directory, 0o700)
    for user, password in passwords.items():
        _write_private(auth.password_file(user), password + "\n")
    _write_private(auth.config_file, authorization_block(passwords))
    return auth


def authorization_block(passwords: dict[str, str]) -> str:
    """nats-server's `authorization { users = [...] }` for these passwords (JSON values are valid in its syntax)."""
    entries = []
    for user, password in passwords.items():
        entry: dict = {"user": user, "password": password}
        permissions = SERVICE_USERS.get(user)
        if permissions is not None:
            entry["permissions"] = _server_permissions(permissions)
        entries.append("    " + json.dumps(entry))
    return "authorization {\n  users = [\n" + ",\n".join(entries) + "\n  ]\n}\n"


def _server_permissions(permissions: Permissions) -> dict:
    publish: dict = {"allow": list(permissions.publish)}
    if permissions.publish_deny:
        publish["deny"] = list(permissions.publish_deny)
    result: dict = {"publish": publish, "subscribe": {"allow": list(permissions.subscribe)}}
    if permissions.allow_responses:
        result["allow_responses"] = True
    return result


def _write_private(path: Path, text: str) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(path, 0o600)  # an existing file keeps its old mode through O_CREAT
