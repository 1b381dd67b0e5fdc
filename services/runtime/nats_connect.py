"""Connect a service to NATS with its common settings (URL, credentials, a name the server shows)."""

from __future__ import annotations

import ssl
from pathlib import Path

from nats.aio.client import Client

from services.bus.connection import connect
from services.bus.tls import client_context
from services.runtime.common_settings import CommonSettings


async def connect_service(settings: CommonSettings, name: str) -> Client:
    """A connection named `name` (shown by the server), credentials from the creds file, the token, or the user and
    password settings; over TLS when a CA is set (TlsConfigError when its files cannot be used)."""
    urls = [url.strip() for url in settings.nats_url.split(",") if url.strip()]
    creds = Path(settings.nats_creds_file) if settings.nats_creds_file else None
    return await connect(urls, name, credentials_file=creds, token=settings.nats_token,
                         user=settings.nats_user, password=settings.nats_password, tls=nats_tls(settings))


def nats_tls(settings: CommonSettings) -> ssl.SSLContext | None:
    """The TLS context these settings ask for, or None (plain)."""
    return client_context(settings.nats_tls_ca_file, settings.nats_tls_cert_file, settings.nats_tls_key_file)
