"""Reading rendered Kubernetes objects: the pod templates of the workloads, their containers, each container's
environment as the kubelet would assemble it, and the Secret files it mounts."""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from dataclasses import dataclass

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "Job")


@dataclass(frozen=True)
class Container:
    """One container of a workload's pod template."""

    workload: dict
    pod: dict
    spec: dict

    @property
    def name(self) -> str:
        return f"{self.workload['kind']}/{self.workload['metadata']['name']}/{self.spec['name']}"

    @property
    def command(self) -> list[str]:
        return [*self.spec.get("command", []), *self.spec.get("args", [])]

    @property
    def is_voxmesh(self) -> bool:
        return self.command[:1] == ["voxmesh"]

    def ports(self) -> dict[str, int]:
        return {port["name"]: port["containerPort"] for port in self.spec.get("ports", [])}


def containers(objects: list[dict]) -> Iterator[Container]:
    for obj in objects:
        if obj["kind"] in WORKLOAD_KINDS:
            pod = obj["spec"]["template"]["spec"]
            for spec in pod.get("initContainers", []) + pod["containers"]:
                yield Container(obj, pod, spec)


def container(objects: list[dict], workload: str) -> Container:
    [found] = [c for c in containers(objects) if c.workload["metadata"]["name"] == workload]
    return found


def environment(objects: list[dict], found: Container) -> dict[str, dict]:
    """Each variable's source ({"value": ...} or {"valueFrom": ...}): the ConfigMaps of envFrom, then `env`, which
    wins where both name a variable (as the kubelet resolves them)."""
    variables: dict[str, dict] = {}
    for source in found.spec.get("envFrom", []):
        name = source["configMapRef"]["name"]  # the manifests take nothing else through envFrom
        [config_map] = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name]
        variables.update({key: {"value": value} for key, value in config_map["data"].items()})
    for entry in found.spec.get("env", []):
        variables[entry["name"]] = {key: value for key, value in entry.items() if key != "name"}
    return variables


def literal_values(variables: dict[str, dict]) -> dict[str, str]:
    return {name: source["value"] for name, source in variables.items() if "value" in source}


def secret_files(found: Container) -> dict[str, tuple[str, str]]:
    """Every file a container sees from a Secret: its path -> (the Secret's name, its key)."""
    volumes = {volume["name"]: volume for volume in found.pod.get("volumes", [])}
    files = {}
    for mount in found.spec.get("volumeMounts", []):
        volume = volumes.get(mount["name"], {})  # absent: a StatefulSet's volume claim, never a Secret
        sources = [volume] if "secret" in volume else volume.get("projected", {}).get("sources", [])
        for source in sources:
            if "secret" not in source:
                continue
            secret = source["secret"]
            for item in secret.get("items", []):
                files[posixpath.join(mount["mountPath"], item["path"])] = (secret.get("secretName", secret.get("name")),
                                                                          item["key"])
    return files
