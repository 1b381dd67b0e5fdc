"""A NATS connection for tools that only read the bus (`voxmesh events`, `voxmesh bench --events-url`): credentials
from the same VOXMESH_NATS_* settings every service reads (the read-only observer's will do)."""

from __future__ import annotations

from pathlib import Path

from nats.aio.client import Client

from services.bus.connection import connect
from services.runtime.common_settings import CommonSettings
from services.runtime.nats_connect import nats_tls
from services.runtime.settings_schema import resolve


async def connect_observer(nats_url: str, name: str, *, initial_timeout_s: float = 60.0) -> Client:
    """Connected, or ConnectionError after `initial_timeout_s` of a server that does not answer."""
    credentials = resolve(CommonSettings)
    return await connect(nats_url, name, user=credentials.nats_user, password=credentials.nats_password,
                         token=credentials.nats_token, tls=nats_tls(credentials),
                         credentials_file=Path(credentials.nats_creds_file) if credentials.nats_creds_file else None,
                         initial_timeout_s=initial_timeout_s)
