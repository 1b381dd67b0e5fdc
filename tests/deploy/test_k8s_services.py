"""The Kubernetes manifests run voxmesh as the compose files do: every variable a container is given is one its
command reads (and its value one the settings accept), each service is its own NATS user with only its own
password, no credential is written in a manifest, images and ports agree with the compose files and with each other,
probes mean what `voxmesh health` and the gateway's /health and /ready mean, every workload has a disruption budget,
the GPU services ask for a GPU, and decode scales on the REQUESTS consumer that decode really pulls from."""

from __future__ import annotations

import re

import pytest
import yaml

from messages.streams import REQUESTS_STREAM, request_lanes
from services.gateway.http.routes.health import router as health_router
from services.mesh.compose_interpolation import interpolate_text
from services.mesh.compose_plan import COMPOSE_DIR, load_plan
from services.runtime import settings_schema
from tests.support.kustomize import OVERLAYS, by_kind, one, rendered
from tests.support.pod_specs import container, containers, environment, literal_values, secret_files
from tests.support.service_settings import role_of, secret_variables, settings_for, variables_read

SERVICES = ("gateway", "decode", "vocoder")
GPU_SERVICES = ("decode", "vocoder")
PASSWORD_DIR = "/etc/voxmesh/nats"
CREDENTIAL_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|API_KEYS|CREDS|_KEY$")


def voxmesh_containers(objects):
    found = [c for c in containers(objects) if c.is_voxmesh]
    assert {c.workload["metadata"]["name"] for c in found} == {*SERVICES, "voxmesh-provision"}
    return found


def compose_images(path) -> dict[str, str]:
    """Each service's image in a compose file, its variables at their defaults (`${VOXMESH_IMAGE:-voxmesh:latest}`)."""
    services = yaml.safe_load(path.read_text())["services"]
    return {name: interpolate_text(str(spec["image"]), {}) for name, spec in services.items() if "image" in spec}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_variable_a_container_is_given_is_one_its_command_reads(overlay):
    objects = rendered(overlay)
    for found in voxmesh_containers(objects):
        settings = settings_for(found.command)
        given = environment(objects, found)
        assert set(given) - variables_read(settings) == set(), found.name
        values = {name: value for name, value in literal_values(given).items() if not name.endswith("_FILE")}
        resolved = settings_schema.resolve(settings, None, values)  # each value converts and is one of its choices
        assert resolved.nats_user == role_of(found.command), found.name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_service_is_its_own_nats_user_and_sees_only_its_own_password(overlay):
    objects = rendered(overlay)
    for found in voxmesh_containers(objects):
        user = role_of(found.command)
        given = literal_values(environment(objects, found))
        assert given["VOXMESH_NATS_USER"] == user, found.name
        assert given["VOXMESH_NATS_PASSWORD_FILE"] == f"{PASSWORD_DIR}/{user}.password", found.name
        nats_files = {path: source for path, source in secret_files(found).items() if path.startswith(PASSWORD_DIR)}
        assert nats_files == {f"{PASSWORD_DIR}/{user}.password": ("voxmesh-nats", f"{user}.password")}, found.name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_credential_is_written_in_a_manifest(overlay):
    objects = rendered(overlay)
    assert by_kind(objects, "Secret") == []  # made beforehand (README.md), never rendered from the repository
    every_secret = set().union(*(secret_variables(settings_for(c.command)) for c in voxmesh_containers(objects)))
    for config_map in by_kind(objects, "ConfigMap"):
        assert not every_secret & set(config_map["data"]), config_map["metadata"]["name"]
        text = "\n".join(config_map["data"].values()).lower()
        assert not re.search(r"password|authorization|\bkey\s*:|token", text), config_map["metadata"]["name"]
    for found in containers(objects):
        assert not [word for word in found.command if re.search("password|secret|token", word.lower())], found.name
        given = environment(objects, found)
        files = secret_files(found)
        for name, source in given.items():
            if name.endswith("_FILE") and CREDENTIAL_NAME.search(name.removesuffix("_FILE")):
                assert source["value"] in files, f"{found.name}: {name} names no file from a Secret"
            elif CREDENTIAL_NAME.search(name):
                assert "secretKeyRef" in source.get("valueFrom", {}), f"{found.name}: {name} written in plain text"


def test_images_and_shared_settings_are_the_compose_files():
    """The CPU overlay runs the compose default's images and settings; the GPU overlay the CUDA override's image."""
    images, cuda_images = compose_images(COMPOSE_DIR / "single.yml"), compose_images(COMPOSE_DIR / "cuda" / "single.yml")
    for overlay, expected in (("cpu-tiny", images), ("gpu", cuda_images)):
        objects = rendered(overlay)
        for found in voxmesh_containers(objects):
            assert found.spec["image"] == expected[role_of(found.command)], (overlay, found.name)
        assert container(objects, "nats").spec["image"] == images["nats"], overlay
    objects = rendered("cpu-tiny")
    plan = load_plan("single")
    for service in (*plan.one_shot, *plan.services):
        name = "voxmesh-provision" if service.name == "provision" else service.name
        found = container(objects, name)
        assert tuple(found.command) == service.command, name
        ours = literal_values(environment(objects, found))
        differing = {key: (ours[key], value) for key, value in service.environment.items() if ours.get(key) != value}
        assert differing == {}, f"{name}: the manifest against compose/single.yml"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ports_agree_between_settings_containers_services_and_probes(overlay):
    objects = rendered(overlay)
    gateway = container(objects, "gateway")
    settings = literal_values(environment(objects, gateway))
    assert gateway.ports() == {"http": int(settings["VOXMESH_PORT"])} and settings["VOXMESH_HOST"] == "0.0.0.0"
    for name in GPU_SERVICES:
        found = container(objects, name)
        port = literal_values(environment(objects, found))[f"VOXMESH_{name.upper()}_METRICS_PORT"]
        assert found.ports() == {"metrics": int(port)}, name
    workloads = [c for c in containers(objects)]
    for service in by_kind(objects, "Service"):
        selector = service["spec"]["selector"]
        selected = [c for c in workloads if selector.items() <= c.workload["spec"]["template"]["metadata"]["labels"]
                    .items()]
        assert len({c.workload["metadata"]["name"] for c in selected}) == 1, service["metadata"]["name"]
        ports = {name: number for c in selected for name, number in c.ports().items()}
        for port in service["spec"]["ports"]:
            assert ports[port["targetPort"]] == port["port"], (service["metadata"]["name"], port)
    for found in workloads:
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            http = found.spec.get(probe, {}).get("httpGet")
            if http is not None:
                assert http["port"] in found.ports(), (found.name, probe)
    url = re.fullmatch(r"nats://([a-z-]+):(\d+)", literal_values(environment(objects, gateway))["VOXMESH_NATS_URL"])
    nats_service = one(objects, "Service", url.group(1))
    assert {p["name"]: p["port"] for p in nats_service["spec"]["ports"]}["nats"] == int(url.group(2))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_mean_what_voxmesh_health_and_the_gateways_routes_mean(overlay):
    objects = rendered(overlay)
    for name in GPU_SERVICES:
        found = container(objects, name)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert found.spec[probe]["exec"]["command"] == ["voxmesh", "health"], (name, probe)
            assert found.spec[probe]["timeoutSeconds"] >= 5, (name, probe)  # health waits up to 3 s per answer
    gateway = container(objects, "gateway").spec
    routes = {route.path for route in health_router.routes}
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/ready" and "/ready" in routes
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/health" and "/health" in routes
    assert gateway["startupProbe"]["httpGet"]["path"] == "/health"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_workload_has_its_own_disruption_budget(overlay):
    objects = rendered(overlay)
    budgets = by_kind(objects, "PodDisruptionBudget")
    for workload in by_kind(objects, "Deployment") + by_kind(objects, "StatefulSet"):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        covering = [b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert [b["spec"]["maxUnavailable"] for b in covering] == [1], workload["metadata"]["name"]


def test_the_gpu_overlay_gives_decode_and_the_vocoder_a_gpu_each_and_the_cpu_overlay_none():
    objects = rendered("gpu")
    for found in containers(objects):
        limits = found.spec.get("resources", {}).get("limits", {})
        requests = found.spec.get("resources", {}).get("requests", {})
        device = literal_values(environment(objects, found)).get("VOXMESH_DEVICE")
        if found.workload["metadata"]["name"] in GPU_SERVICES:
            assert limits["nvidia.com/gpu"] == 1 and requests.get("nvidia.com/gpu", 1) == 1, found.name
            assert device == "cuda", found.name
        else:
            assert "nvidia.com/gpu" not in limits and device in (None, "cpu"), found.name
    objects = rendered("cpu-tiny")
    for found in containers(objects):
        assert "nvidia.com/gpu" not in str(found.spec.get("resources")), found.name
        assert literal_values(environment(objects, found)).get("VOXMESH_DEVICE") in (None, "cpu"), found.name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_decode_scales_on_the_pending_count_of_the_consumer_it_pulls_from(overlay):
    objects = rendered(overlay)
    [scaled] = by_kind(objects, "ScaledObject")
    target = scaled["spec"]["scaleTargetRef"]
    assert target.get("kind", "Deployment") == "Deployment" and target["name"] == "decode"
    assert "replicas" not in one(objects, "Deployment", "decode")["spec"]  # the autoscaler's alone
    assert 1 <= scaled["spec"]["minReplicaCount"] < scaled["spec"]["maxReplicaCount"]
    triggers = scaled["spec"]["triggers"]
    model = literal_values(environment(objects, container(objects, "decode")))["VOXMESH_MODEL_NAME"]
    # one trigger per queue decode pulls the model's requests from, and the backlog is their sum
    assert sorted(t["metadata"]["consumer"] for t in triggers) == sorted(lane.durable for lane in request_lanes(model))
    modifiers = scaled["spec"]["advanced"]["scalingModifiers"]
    assert sorted(modifiers["formula"].split(" + ")) == sorted(t["name"] for t in triggers)
    assert modifiers["metricType"] == "AverageValue"
    for trigger in triggers:
        metadata = trigger["metadata"]
        assert trigger["type"] == "nats-jetstream"
        assert (metadata["stream"], metadata["account"]) == (REQUESTS_STREAM, "$G")  # an `authorization` block's users
    metadata = triggers[0]["metadata"]
    nats = one(objects, "StatefulSet", "nats")
    headless = one(objects, "Service", nats["spec"]["serviceName"])
    monitor = {p["name"]: p["port"] for p in headless["spec"]["ports"]}["monitor"]
    # KEDA reaches the consumer's leader as <server name>.<this host>: the headless service's name, fully qualified
    # (KEDA runs in its own namespace).
    namespace = nats["metadata"]["namespace"]
    assert metadata["natsServerMonitoringEndpoint"] == \
        f"{headless['metadata']['name']}.{namespace}.svc.cluster.local:{monitor}"
