"""`voxmesh up` runs what the compose files say: the plan comes from the files users deploy."""

import pytest
import yaml

from services.mesh import compose_plan
from services.mesh.compose_plan import ComposeError, load_plan
from services.mesh.processes import local_command


def test_single_topology_plan_matches_the_compose_file():
    plan = load_plan("single")
    assert [s.name for s in plan.one_shot] == ["provision"]
    assert [s.name for s in plan.services] == ["gateway", "decode", "vocoder"]
    gateway = next(s for s in plan.services if s.name == "gateway")
    assert gateway.command == ("voxmesh", "serve", "gateway")
    assert gateway.environment["VOXMESH_HOST"] == "127.0.0.1"
    decode = next(s for s in plan.services if s.name == "decode")
    assert decode.environment["VOXMESH_RECOMPUTE_PREEMPTION"] == "allow"
    assert decode.environment["VOXMESH_MODEL_NAME"] == "tiny"


def test_replicas_topology_runs_two_decode_and_two_vocoder_replicas_of_the_single_services():
    single, replicas = load_plan("single"), load_plan("replicas")
    assert {s.name: s.replicas for s in replicas.services} == {"gateway": 1, "decode": 2, "vocoder": 2}
    for ours, theirs in zip(replicas.services, single.services, strict=True):  # the same services, only more
        assert (ours.name, ours.command, ours.environment) == (theirs.name, theirs.command, theirs.environment)


def test_root_compose_file_is_the_single_topology():
    document = yaml.safe_load(open(compose_plan.COMPOSE_DIR.parent / "docker-compose.yml"))
    assert document["include"] == ["compose/single.yml"]


def test_every_service_uses_host_networking():
    for path in compose_plan.COMPOSE_DIR.glob("*.yml"):
        services = yaml.safe_load(path.read_text())["services"]
        for name, spec in services.items():
            assert spec.get("network_mode") == "host", f"{path.name}: {name} must use host networking"


def test_unknown_topology_names_the_known_ones():
    with pytest.raises(ComposeError, match=r"no topology 'nope'.*known: .*single"):
        load_plan("nope")


def test_malformed_compose_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(compose_plan, "COMPOSE_DIR", tmp_path)
    (tmp_path / "bad.yml").write_text("services:\n  decode:\n    command: voxmesh serve decode\n")
    with pytest.raises(ComposeError, match="service 'decode' needs `command` as a list"):
        load_plan("bad")
    (tmp_path / "empty.yml").write_text("name: x\n")
    with pytest.raises(ComposeError, match="has no services"):
        load_plan("empty")


def test_voxmesh_commands_run_through_this_interpreter():
    import sys

    assert local_command(("voxmesh", "serve", "decode")) == [sys.executable, "-m", "services.cli", "serve", "decode"]
    assert local_command(("echo", "hi")) == ["echo", "hi"]
