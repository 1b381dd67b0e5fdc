"""`voxmesh up --tls-dir` (certificates made here, a client certificate among them): the gateway serves HTTPS and
WSS verified against the CA and nothing in clear; the embedded nats-server takes TLS connections only (every service
connects with the CA and the client certificate) and refuses a plain client; a request is served end to end."""

from __future__ import annotations

import ssl

import httpx
import pytest

from services.mesh.tls_dir import TlsDir, TlsDirError
from tests.support.certificates import answer_to_plain_client, make_certificates
from tests.support.mesh import run_mesh
from tests.support.mesh_client import stream_speech


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("mesh-certs"))


@pytest.fixture(scope="module")
def mesh(tiny_checkpoint, tmp_path_factory, certs):
    state_dir = tmp_path_factory.mktemp("tls-mesh")
    with run_mesh(tiny_checkpoint, state_dir, "--tls-dir", str(certs)) as running:
        running.state_dir = state_dir
        yield running


async def test_a_request_is_served_over_https_and_wss(mesh, certs):
    assert mesh.gateway_url.startswith("https://127.0.0.1:")
    trusted = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    async with httpx.AsyncClient(verify=trusted, timeout=60) as client:
        spoken = await client.post(f"{mesh.gateway_url}/v1/audio/speech",
                                   json={"input": "Over TLS, end to end.", "voice": "ryan", "max_new_tokens": 8})
    assert spoken.status_code == 200 and spoken.content[:4] == b"RIFF", spoken.text
    streamed = await stream_speech(mesh.gateway_url, {"input": "Streamed over TLS.", "voice": "eric",
                                                      "max_new_tokens": 8}, tls=trusted)
    assert streamed.end["type"] == "audio.done", streamed.end


async def test_plain_http_and_plain_nats_are_refused(mesh, certs):
    async with httpx.AsyncClient(timeout=10) as client:
        with pytest.raises(httpx.TransportError):
            await client.get(mesh.gateway_url.replace("https://", "http://") + "/health")
    password = (mesh.state_dir / "nats-auth" / "operator.password").read_text().strip()
    assert await answer_to_plain_client(mesh.nats_url, "operator", password) != b"PONG"


def test_a_tls_dir_without_its_files_is_refused_naming_them(tmp_path):
    (tmp_path / "client.pem").write_text("")
    with pytest.raises(TlsDirError, match="ca.pem, server.pem, server-key.pem, client-key.pem missing"):
        TlsDir.open(tmp_path)
