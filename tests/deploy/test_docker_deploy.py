"""`docker compose up` for real: the CPU image built from compose/Dockerfile, the `single` stack started from the
files users deploy (with the host-network override, the only networking these machines allow), healthy, speaking
over HTTP and the WebSocket, then `docker compose down -v` and nothing left behind.

A private engine (tests/support/docker_engine.py) and registry-free images (tests/support/docker_images.py). The
whole run is bounded (each step has its timeout, the module its own); it skips where docker cannot run, except under
`.ci/run`, where it fails.
"""

from __future__ import annotations

import io
import json
import time
import wave
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import nats
import nats.errors
import pytest

from tests.support.docker_engine import DockerEngine, private_engine
from tests.support.docker_images import (REPO, base_image, build_wheelhouse, nats_image, normalize, pinned_names,
                                          remove_wheelhouse)
from tests.support.mesh import free_port
from tests.support.mesh_client import stream_speech

pytestmark = pytest.mark.timeout(1500)

BASE, NATS, IMAGE = "voxmesh-base:ci", "voxmesh-nats:ci", "voxmesh:latest"
PROJECT = "voxmesh-ci"
FILES = ("-f", "compose/single.yml", "-f", "compose/host-network/single.yml")
UP_TIMEOUT_S = 300
STEP_TIMEOUT_S = 900


@dataclass
class Deployment:
    engine: DockerEngine
    env: dict[str, str]
    gateway_url: str
    seconds: dict[str, float] = field(default_factory=dict)
    image_bytes: int = 0
    wheels: list[str] = field(default_factory=list)

    def compose(self, *args: str, timeout_s: float = STEP_TIMEOUT_S):
        return self.engine.run(*FILES, "--project-name", PROJECT, *args, timeout_s=timeout_s, cwd=REPO,
                               tool=self.engine.compose)


@pytest.fixture(scope="module")
def deployment() -> Iterator[Deployment]:
    """Images built, the stack up and healthy; `compose down -v` and the engine removed afterwards."""
    with private_engine() as engine:
        ports = {"VOXMESH_PORT": free_port(), "VOXMESH_NATS_PORT": free_port(),
                 "VOXMESH_NATS_MONITOR_PORT": free_port()}
        env = {**engine.env, **{key: str(port) for key, port in ports.items()}, "VOXMESH_BASE_IMAGE": BASE,
               "VOXMESH_NATS_IMAGE": NATS, "VOXMESH_IMAGE": IMAGE, "VOXMESH_WHEELS": "wheelhouse"}
        deployed = Deployment(DockerEngine(engine.root, env, engine.docker, engine.compose), env,
                              f"http://127.0.0.1:{ports['VOXMESH_PORT']}")
        try:
            with _timed(deployed, "base image (debootstrap + import)"):
                base_image(deployed.engine, BASE)
            with _timed(deployed, "wheelhouse"):
                deployed.wheels = build_wheelhouse()
            with _timed(deployed, "NATS image"):
                nats_image(deployed.engine, BASE, NATS)
            with _timed(deployed, "voxmesh image (compose build)"):
                deployed.compose("build", "provision")  # one image serves every service: build it once
            deployed.image_bytes = int(deployed.engine.run("image", "inspect", "--format", "{{.Size}}", IMAGE,
                                                           timeout_s=60).stdout)
            with _timed(deployed, "compose up until healthy"):
                try:
                    deployed.compose("up", "--detach", "--no-build", "--wait", "--wait-timeout", str(UP_TIMEOUT_S),
                                     timeout_s=UP_TIMEOUT_S + 60)
                except RuntimeError as error:  # say why: the services' own last words
                    logs = deployed.compose("logs", "--no-color", "--tail", "40", timeout_s=120).stdout
                    raise RuntimeError(f"{error}\n{logs.decode(errors='replace')[-6000:]}") from None
            yield deployed
        finally:
            try:
                with _timed(deployed, "compose down -v"):
                    deployed.compose("down", "--volumes", "--timeout", "30", timeout_s=300)
                left = [deployed.engine.run(*what, timeout_s=60).stdout.split() for what in
                        (("ps", "--all", "--quiet"), ("volume", "ls", "--quiet"))]
                assert left == [[], []], f"compose down -v left containers or volumes behind: {left}"
            finally:
                remove_wheelhouse()
                print(f"\ndocker deployment: image {deployed.image_bytes / 1e6:.0f} MB; " +
                      "; ".join(f"{step} {seconds:.0f} s" for step, seconds in deployed.seconds.items()))


class _timed:
    def __init__(self, deployment: Deployment, step: str) -> None:
        self.deployment, self.step = deployment, step

    def __enter__(self) -> None:
        self.start = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        self.deployment.seconds[self.step] = time.monotonic() - self.start


def test_every_wheel_in_the_image_is_pinned(deployment):
    pins = pinned_names()
    for wheel in deployment.wheels:
        name, version = wheel.split("-")[:2]
        if normalize(name) == "voxmesh":
            continue
        assert pins.get(normalize(name)) == version.split("+")[0], f"{wheel} is not pinned in compose/constraints.txt"


def test_every_service_is_healthy_by_its_own_check(deployment):
    rows = [json.loads(line) for line in deployment.compose("ps", "--all", "--format", "json").stdout.splitlines()
            if line.strip()]
    states = {row["Service"]: (row["State"], row.get("Health", ""), row.get("ExitCode")) for row in rows}
    assert states["provision"][0] == "exited" and states["provision"][2] == 0, states
    for service in ("nats", "gateway", "decode", "vocoder"):
        assert states[service][:2] == ("running", "healthy"), states
    image = json.loads(deployment.engine.run("image", "inspect", IMAGE, timeout_s=60).stdout)[0]["Config"]
    assert image["User"] == "voxmesh" and image["Healthcheck"]["Test"] == ["CMD", "voxmesh", "health"], image


async def test_http_speech_from_the_containers(deployment):
    async with httpx.AsyncClient(timeout=120) as client:
        response = await client.post(f"{deployment.gateway_url}/v1/audio/speech",
                                     json={"model": "tiny", "input": "Hello from the containers.", "voice": "vivian",
                                           "max_new_tokens": 16})
    assert response.status_code == 200, response.text
    with wave.open(io.BytesIO(response.content)) as audio:
        assert audio.getframerate() == 24000 and audio.getnframes() > 0


async def test_websocket_speech_from_the_containers(deployment):
    result = await stream_speech(deployment.gateway_url, {"input": "Streaming from the containers.", "voice": "ryan",
                                                          "max_new_tokens": 16})
    assert result.end["type"] == "audio.done", result.end
    assert result.pcm and len(result.pcm) == 2 * result.end["samples"]


async def test_the_containers_nats_refuses_a_client_without_a_user(deployment):
    """The services got in as their own users (they are healthy); a stranger does not."""
    with pytest.raises(nats.errors.Error):
        await nats.connect(f"nats://127.0.0.1:{deployment.env['VOXMESH_NATS_PORT']}", allow_reconnect=False,
                           connect_timeout=5)
