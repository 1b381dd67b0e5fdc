"""The Kubernetes manifests are what a cluster would accept, checked without one: every overlay renders with
`kubectl kustomize`, every built-in object matches the Kubernetes 1.32 schemas (kubernetes-validate, strict: an
unknown field is an error, as the API server's strict field validation makes it), and KEDA's ScaledObject matches
the CRD schema of the KEDA release kept in deploy/kubernetes/schemas. Broken inputs prove each check can fail."""

from __future__ import annotations

import copy
import json
import shutil

import jsonschema
import kubernetes_validate
import pytest

from tests.support.kustomize import KUBERNETES_DIR, OVERLAYS, by_kind, kustomize, one, rendered

KUBERNETES_VERSION = "1.32.0"
SCHEMAS = KUBERNETES_DIR / "schemas"
CUSTOM_KINDS = {"ScaledObject"}
STAGES = ("bus", "provision", "services", "autoscale")  # the order README.md applies them in


def strict(schema: dict) -> dict:
    """The schema with every object that declares its properties closed to others (`additionalProperties: false`),
    as the API server's strict field validation treats a CRD's structural schema; maps and free-form objects stay
    open."""
    schema = copy.deepcopy(schema)

    def close(node):
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node \
                    and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    close(schema)
    return schema


SCALED_OBJECT = jsonschema.Draft7Validator(strict(json.loads((SCHEMAS / "keda-scaledobject.json").read_text())))
NATS_TRIGGER = jsonschema.Draft7Validator(json.loads((SCHEMAS / "keda-nats-jetstream-trigger.json").read_text()))


def scaled_object_errors(obj: dict) -> list[str]:
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in SCALED_OBJECT.iter_errors(obj)]
    for index, trigger in enumerate(obj.get("spec", {}).get("triggers", [])):
        if trigger.get("type") == "nats-jetstream":
            errors += [f"triggers.{index}.metadata: {e.message}" for e in NATS_TRIGGER.iter_errors(trigger["metadata"])]
    return errors


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_built_in_object_matches_the_kubernetes_schemas(overlay):
    objects = rendered(overlay)
    kinds = {obj["kind"] for obj in objects}
    assert {"Namespace", "StatefulSet", "Deployment", "Job", "Service", "PodDisruptionBudget", "ConfigMap",
            "PersistentVolumeClaim", "ScaledObject"} <= kinds
    for obj in objects:
        if obj["kind"] in CUSTOM_KINDS:
            continue
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_scaled_object_matches_kedas_crd_schema(overlay):
    [scaled] = by_kind(rendered(overlay), "ScaledObject")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled_object_errors(scaled) == []


def test_a_wrong_field_is_refused_by_each_check():
    objects = rendered(OVERLAYS[0])
    scaled = one(objects, "ScaledObject", "decode")
    misnamed = copy.deepcopy(scaled)
    misnamed["spec"]["minReplicas"] = misnamed["spec"].pop("minReplicaCount")  # the HPA's name, not KEDA's
    assert any("minReplicas" in error for error in scaled_object_errors(misnamed))
    mistyped = copy.deepcopy(scaled)
    mistyped["spec"]["maxReplicaCount"] = "eight"
    assert any("maxReplicaCount" in error for error in scaled_object_errors(mistyped))
    misspelt = copy.deepcopy(scaled)
    metadata = misspelt["spec"]["triggers"][0]["metadata"]
    metadata["lagTreshold"] = metadata.pop("lagThreshold")
    assert any("lagTreshold" in error for error in scaled_object_errors(misspelt))

    deployment = copy.deepcopy(one(objects, "Deployment", "decode"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"exec": {"command": ["true"]}}
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_kustomize_refuses_a_broken_overlay(tmp_path):
    copied = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES_DIR, copied)
    patch = copied / "overlays" / "gpu" / "gpu-decode.yaml"
    patch.write_text(patch.read_text().replace("name: decode\n", "name: decoder\n", 1))  # patches nothing there is
    done = kustomize(copied / "overlays" / "gpu")
    assert done.returncode != 0 and "decoder" in done.stderr, done.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_is_in_the_namespace_and_in_one_stage(overlay):
    """README.md applies the stages in order with `-l voxmesh.io/stage=...`; an object in none would be left out."""
    staged = {stage: set() for stage in STAGES}
    for obj in rendered(overlay):
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/part-of"] == "voxmesh", obj["metadata"]["name"]
        staged[labels["voxmesh.io/stage"]].add(obj["kind"])
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "voxmesh", obj["metadata"]["name"]
    assert {"Namespace", "ConfigMap", "StatefulSet", "Service"} <= staged["bus"]
    assert staged["provision"] == {"Job", "PersistentVolumeClaim"}
    assert {"Deployment", "Service", "PodDisruptionBudget"} == staged["services"]
    assert staged["autoscale"] == {"ScaledObject"}
