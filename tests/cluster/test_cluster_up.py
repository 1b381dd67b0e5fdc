"""`voxmesh up --nats-cluster 3`: three embedded nats-servers as one JetStream cluster on loopback, with the same
users, TLS and encryption at rest as the single server, and the default topology against them; it serves a real
request, every provisioned stream, the bucket and the object stores have three replicas and a leader, every route
listener demands mutual TLS, no member stores a request's text in clear, and Ctrl-C leaves no server running."""

from __future__ import annotations

import asyncio
import json
import os
import re
import ssl
from pathlib import Path

import nats
import pytest

from tests.support.certificates import make_certificates
from tests.support.mesh import run_mesh
from tests.support.mesh_client import stream_speech

CLUSTER = 3
TEXT = "Three servers, one bus."


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"


def _nats_servers_storing_under(state: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "nats-server" in command and str(state) in command:
                found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    return make_certificates(tmp_path_factory.mktemp("cluster-certs"))


def _route_listeners(state: Path) -> list[tuple[str, int]]:
    """Each member's route address, from the member files `voxmesh up` wrote beside the users."""
    found = []
    for config in sorted((state / "nats-auth").glob("voxmesh-*.conf")):
        host, port = re.search(r'listen: "([^"]+):(\d+)"', config.read_text()).groups()
        found.append((host, int(port)))
    return found


async def _route_answers(host: str, port: int, certs: Path) -> tuple[bytes, str, dict]:
    """What a route listener gives a dialler in clear, one with TLS but no certificate, and one presenting the
    mesh's server certificate (the members' own route identity): nothing, a refusal, and the route INFO."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        in_clear = await asyncio.wait_for(reader.read(), 10)  # the server waits for a TLS hello, then hangs up
    finally:
        writer.close()
    anonymous = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    try:
        reader, writer = await asyncio.open_connection(host, port, ssl=anonymous)
        refusal = f"answered: {await asyncio.wait_for(reader.readline(), 10)!r}"
        writer.close()
    except ssl.SSLError as error:
        refusal = str(error)
    member = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    member.load_cert_chain(str(certs / "server.pem"), str(certs / "server-key.pem"))
    reader, writer = await asyncio.open_connection(host, port, ssl=member)
    try:
        info = json.loads((await asyncio.wait_for(reader.readline(), 10)).split(b" ", 1)[1])
    finally:
        writer.close()
    return in_clear, refusal, info


def _operator_tls(certs: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    context.load_cert_chain(str(certs / "client.pem"), str(certs / "client-key.pem"))
    return context


async def test_up_with_a_three_server_cluster_serves_with_every_stream_replicated(tiny_checkpoint, tmp_path,
                                                                                  certs) -> None:
    state = tmp_path / "state"
    with run_mesh(tiny_checkpoint, state, "--nats-cluster", str(CLUSTER), "--tls-dir", str(certs)) as mesh:
        servers = _nats_servers_storing_under(state)
        assert len(servers) == CLUSTER, mesh.log_tail()
        urls = re.sub(r"^nats://[^@/]*@", "nats://", mesh.nats_url).split(",")  # without the fixture's user
        assert len(urls) == CLUSTER, mesh.nats_url
        trusted = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        said = await stream_speech(mesh.gateway_url, {"input": TEXT, "voice": "ryan", "max_new_tokens": 8},
                                   tls=trusted)
        assert said.end["type"] == "audio.done" and said.pcm, said.end
        password = (state / "nats-auth" / "operator.password").read_text().strip()
        nc = await nats.connect(servers=urls, user="operator", password=password, tls=_operator_tls(certs),
                                tls_handshake_first=True)
        try:
            infos = await nc.jetstream().streams_info()
        finally:
            await nc.close()
        assert {info.config.name for info in infos} >= {"REQUESTS", "EVENTS", "CODES", "KV_voxmesh"}
        for info in infos:
            followers = info.cluster.replicas or []
            assert info.config.num_replicas == CLUSTER and info.cluster.leader, (info.config.name, info.cluster)
            assert len({info.cluster.leader, *(peer.name for peer in followers)}) == CLUSTER
        listeners = _route_listeners(state)
        assert len(listeners) == CLUSTER, listeners
        for host, port in listeners:  # the cluster formed above, so the members passed each other's verification
            in_clear, refusal, info = await _route_answers(host, port, certs)
            assert in_clear == b"", (port, in_clear)
            assert "CERTIFICATE_REQUIRED" in refusal.upper().replace(" ", "_"), (port, refusal)
            assert info.get("tls_required") is True and info.get("tls_verify") is True, (port, info)
        assert mesh.stop() == 0, mesh.log_tail()
    assert [pid for pid in servers if _running(pid)] == []
    stores = list((state / "nats-cluster").iterdir())
    assert len(stores) == CLUSTER
    assert not [path for store in stores for path in store.rglob("*")
                if path.is_file() and TEXT.encode() in path.read_bytes()], "a member stored the request in clear"
