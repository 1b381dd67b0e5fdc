"""TLS between the services and NATS, against a real nats-server with certificates made here: a service told the
CA connects and verifies the server; a plain connection is refused; a server signed by another CA is refused by the
client; a server that verifies its clients takes one with a certificate and refuses one without."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.bus.connection import connect
from services.bus.embedded import EmbeddedNats
from services.bus.nats_auth import write_auth
from services.bus.server_config import ServerTls, server_config, write_server_config
from services.bus.tls import TlsConfigError, client_context
from tests.support.certificates import answer_to_plain_client, make_certificates, make_stranger_ca

USER = "operator"


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def _server(tmp_path: Path, certs: Path, *, verify_clients: bool = False) -> EmbeddedNats:
    auth = write_auth(tmp_path / "auth")
    tls = ServerTls(certs / "server.pem", certs / "server-key.pem", certs / "ca.pem" if verify_clients else None)
    config = write_server_config(auth.directory / "server.conf", server_config(store_key=None, tls=tls))
    server = EmbeddedNats(tmp_path / "store", config_file=config)
    server.password = auth.password(USER)
    return server


async def _round_trip(nc) -> bytes:
    sub = await nc.subscribe("tls.check")
    await nc.publish("tls.check", b"over tls")
    return (await sub.next_msg(timeout=5)).data


async def test_a_service_with_the_ca_connects_over_tls_and_a_plain_client_is_refused(tmp_path, certs):
    async with _server(tmp_path, certs) as server:
        nc = await connect(server.url, "tls-check", user=USER, password=server.password,
                           tls=client_context(certs / "ca.pem"), initial_timeout_s=10)
        try:
            assert await _round_trip(nc) == b"over tls"
            assert nc._transport._io_writer.get_extra_info("ssl_object") is not None  # noqa: SLF001 (the socket)
        finally:
            await nc.close()
        assert await answer_to_plain_client(server.url, USER, server.password) != b"PONG"


async def test_a_server_signed_by_another_ca_is_refused(tmp_path, certs):
    stranger = make_stranger_ca(tmp_path / "stranger")
    async with _server(tmp_path, certs) as server:
        with pytest.raises(ConnectionError, match="no NATS server answered"):
            await connect(server.url, "tls-check", user=USER, password=server.password,
                          tls=client_context(stranger), initial_timeout_s=2)


async def test_a_server_that_verifies_clients_takes_only_a_client_with_a_certificate(tmp_path, certs):
    async with _server(tmp_path, certs, verify_clients=True) as server:
        nc = await connect(server.url, "tls-check", user=USER, password=server.password, initial_timeout_s=10,
                           tls=client_context(certs / "ca.pem", certs / "client.pem", certs / "client-key.pem"))
        try:
            assert await _round_trip(nc) == b"over tls"
        finally:
            await nc.close()
        with pytest.raises(ConnectionError):
            await connect(server.url, "tls-check", user=USER, password=server.password,
                          tls=client_context(certs / "ca.pem"), initial_timeout_s=2)


def test_half_a_client_certificate_is_a_settings_error(certs):
    with pytest.raises(TlsConfigError, match="both"):
        client_context(certs / "ca.pem", certs / "client.pem", None)
    with pytest.raises(TlsConfigError, match="CA"):
        client_context(None, certs / "client.pem", certs / "client-key.pem")
    assert client_context(None) is None


async def test_a_first_connection_that_swallows_a_cancellation_is_still_stopped():
    """nats-py swallows a cancellation that lands in its flush and retries on (the cause of this module's test hanging
    under load, a client without a certificate retrying against the verifying server): `stop_connecting` cancels
    until the attempt has ended."""
    import asyncio

    from services.bus.connection import stop_connecting

    attempts = 0
    swallowed = asyncio.Event()

    async def retries_for_ever():  # as nats-py's first-connection loop, the first cancellation swallowed
        nonlocal attempts
        while True:
            attempts += 1
            try:
                await asyncio.Event().wait()  # a flush that never completes
            except asyncio.CancelledError:
                if swallowed.is_set():
                    raise
                swallowed.set()

    connecting = asyncio.ensure_future(retries_for_ever())
    await asyncio.wait_for(stop_connecting(connecting), timeout=5)
    assert connecting.cancelled() and swallowed.is_set() and attempts == 2
