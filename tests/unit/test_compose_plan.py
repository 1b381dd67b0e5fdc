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
    assert gateway.environment["VOXMESH_NATS_URL"] == "nats://nats:4222"  # `voxmesh up` gives its own
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


class _ComposeLoader(yaml.SafeLoader):
    """YAML with compose's own tags (`!reset`, `!override`) read as plain values."""


_ComposeLoader.add_multi_constructor("!", lambda loader, _tag, node: loader.construct_sequence(node)
                                     if isinstance(node, yaml.SequenceNode) else loader.construct_object(node))


def _services(path) -> dict:
    return yaml.load(path.read_text(), Loader=_ComposeLoader)["services"]


def test_every_topology_publishes_on_loopback_and_has_a_host_network_override():
    for path in compose_plan.COMPOSE_DIR.glob("*.yml"):
        services = _services(path)
        for name, spec in services.items():
            assert all(str(port).startswith("127.0.0.1:") for port in spec.get("ports", [])), f"{path.name}: {name}"
        override = _services(compose_plan.COMPOSE_DIR / "host-network" / path.name)
        assert set(override) == set(services), f"host-network/{path.name} must cover every service"
        for name, spec in override.items():
            assert spec.get("network_mode") == "host", f"host-network/{path.name}: {name} must use host networking"
            assert "0.0.0.0" not in str(spec.get("environment", {})), f"host-network/{path.name}: {name}"
        assert override["gateway"]["environment"]["VOXMESH_HOST"] == "127.0.0.1"


def test_variables_are_interpolated_as_compose_does(tmp_path, monkeypatch):
    monkeypatch.setattr(compose_plan, "COMPOSE_DIR", tmp_path)
    (tmp_path / "vars.yml").write_text(
        "services:\n  gateway:\n    command: [voxmesh, serve, gateway, '$${LITERAL}']\n    environment:\n"
        "      VOXMESH_PORT: ${PORT:-8000}\n      VOXMESH_NATS_URL: nats://${HOST-127.0.0.1}:${NATS_PORT:-${BASE:-4}222}\n"
        "      VOXMESH_LOG_LEVEL: ${LEVEL:+DEBUG}\n      VOXMESH_MODEL_NAME: $NAME\n")
    plan = load_plan("vars", env={"PORT": "9000", "HOST": "", "NAME": "tiny"})
    gateway = plan.services[0]
    assert gateway.command[-1] == "${LITERAL}"
    assert gateway.environment == {"VOXMESH_PORT": "9000", "VOXMESH_NATS_URL": "nats://:4222",
                                   "VOXMESH_LOG_LEVEL": "", "VOXMESH_MODEL_NAME": "tiny"}
    plan = load_plan("vars", env={"LEVEL": "x", "BASE": "5"})
    assert plan.services[0].environment["VOXMESH_NATS_URL"] == "nats://127.0.0.1:5222"
    assert plan.services[0].environment["VOXMESH_LOG_LEVEL"] == "DEBUG"
    (tmp_path / "required.yml").write_text("services:\n  a:\n    command: [x, '${MUST:?set MUST to a path}']\n")
    with pytest.raises(ComposeError, match="MUST is missing a value: set MUST to a path"):
        load_plan("required", env={})
    (tmp_path / "open.yml").write_text("services:\n  a:\n    command: [x, '${OPEN:-y']\n")
    with pytest.raises(ComposeError, match="never closed"):
        load_plan("open", env={})


def test_the_nats_service_and_profiled_tools_are_left_out_whatever_the_nats_image():
    for env in ({}, {"VOXMESH_NATS_IMAGE": "voxmesh-nats:ci"}, {"VOXMESH_NATS_IMAGE": "registry.local/nats:2.15"}):
        plan = load_plan("single", env=env)
        names = [s.name for s in plan.one_shot + plan.services]
        assert names == ["provision", "gateway", "decode", "vocoder"], (env, names)


def test_the_official_nats_image_is_known_without_its_label(tmp_path, monkeypatch):
    monkeypatch.setattr(compose_plan, "COMPOSE_DIR", tmp_path)
    (tmp_path / "bare.yml").write_text("services:\n  bus:\n    image: docker.io/library/nats:2.15-alpine\n"
                                       "  a:\n    command: [x]\n  tool:\n    image: t\n    profiles: [tools]\n")
    assert [s.name for s in load_plan("bare", env={}).one_shot + load_plan("bare", env={}).services] == ["a"]


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


def test_a_topology_that_extends_single_runs_single_s_services_with_its_own_changes():
    single = {s.name: s for s in load_plan("single").services}
    plan = {s.name: s for s in load_plan("1p1d", env={}).services}
    assert list(plan) == ["gateway", "prefill", "decode", "vocoder"]
    assert plan["vocoder"] == single["vocoder"]
    assert plan["gateway"].environment == {**single["gateway"].environment, "VOXMESH_PREFILL_MIN_CHARS": "1"}
    prefill = plan["prefill"]
    assert prefill.command == ("voxmesh", "serve", "prefill") and prefill.restart == "unless-stopped"
    assert prefill.environment["VOXMESH_KV_CACHE_BLOCKS"] == "128"  # its own value over decode's
    assert prefill.environment["VOXMESH_MODEL_DIR"] == single["decode"].environment["VOXMESH_MODEL_DIR"]
    assert plan["decode"].environment["UCX_TLS"] == "tcp,self"


def test_extending_a_service_that_does_not_exist_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(compose_plan, "COMPOSE_DIR", tmp_path)
    (tmp_path / "base.yml").write_text("services:\n  decode:\n    command: [voxmesh, serve, decode]\n")
    (tmp_path / "child.yml").write_text("services:\n  prefill:\n    extends: {file: base.yml, service: pre}\n")
    with pytest.raises(ComposeError, match="extends 'pre', which .*base.yml does not define"):
        load_plan("child")
    (tmp_path / "loop.yml").write_text("services:\n  a:\n    extends: b\n  b:\n    extends: a\n")
    with pytest.raises(ComposeError, match="deeper than 8 levels"):
        load_plan("loop")
