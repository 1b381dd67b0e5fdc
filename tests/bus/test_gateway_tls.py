"""The gateway over TLS (uvicorn's, from VOXMESH_TLS_CERT_FILE and _KEY_FILE), with certificates made here: a client
that trusts the CA gets its answers over HTTPS; one that does not trust it refuses the server; plain HTTP to the
TLS port gets no answer; half the settings are refused."""

from __future__ import annotations

import ssl

import httpx
import pytest

from services.gateway.settings import GatewaySettings
from services.runtime.settings_schema import SettingsError
from tests.support.certificates import make_certificates
from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus, watched_gateway...)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("certs"))


async def test_https_verifies_against_the_ca_and_plain_http_gets_no_answer(watched_gateway, certs):
    tls = dict(tls_cert_file=str(certs / "server.pem"), tls_key_file=str(certs / "server-key.pem"))
    async with watched_gateway(**tls) as served:
        https = f"https://127.0.0.1:{served.port}"
        trusted = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        async with httpx.AsyncClient(verify=trusted, timeout=10) as client:
            models = await client.get(f"{https}/v1/models")
        assert models.status_code == 200 and models.json()["data"], models.text
        async with httpx.AsyncClient(verify=ssl.create_default_context(), timeout=10) as client:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await client.get(f"{https}/v1/models")
        async with httpx.AsyncClient(timeout=10) as client:
            with pytest.raises(httpx.TransportError):
                await client.get(f"http://127.0.0.1:{served.port}/v1/models")


def test_a_certificate_without_its_key_is_refused():
    with pytest.raises(SettingsError, match="both"):
        GatewaySettings(tls_cert_file="/etc/cert.pem")
