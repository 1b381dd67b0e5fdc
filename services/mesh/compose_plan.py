"""Read a topology's compose file into a launch plan of local processes.

`voxmesh up` must run exactly what users deploy, so the plan comes from the compose file
itself: each service's `command` and `environment`, its replica count, and whether it is a
one-shot step (`restart: "no"`, like provisioning) that must finish before the others
start. The `nats` service is left out: locally an embedded nats-server takes its place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

COMPOSE_DIR = Path(__file__).resolve().parents[2] / "compose"
NATS_IMAGE_PREFIX = "nats"


class ComposeError(ValueError):
    """A compose file voxmesh cannot run; the message names the file and the service."""


@dataclass(frozen=True, slots=True)
class ServicePlan:
    """One compose service as local processes."""

    name: str
    command: tuple[str, ...]
    environment: dict[str, str] = field(default_factory=dict)
    replicas: int = 1
    one_shot: bool = False
    restart: str = "no"  # compose's policy: no | always | on-failure | unless-stopped


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """What `voxmesh up` starts: one-shot steps first, in file order, then the long-running services."""

    topology: str
    source: Path
    one_shot: tuple[ServicePlan, ...]
    services: tuple[ServicePlan, ...]


def compose_path(topology: str) -> Path:
    path = COMPOSE_DIR / f"{topology}.yml"
    if not path.is_file():
        known = sorted(p.stem for p in COMPOSE_DIR.glob("*.yml"))
        raise ComposeError(f"no topology {topology!r}: {path} does not exist (known: {', '.join(known)})")
    return path


def load_plan(topology: str) -> LaunchPlan:
    path = compose_path(topology)
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise ComposeError(f"{path}: not valid YAML: {error}") from None
    services = (document or {}).get("services")
    if not isinstance(services, dict) or not services:
        raise ComposeError(f"{path}: has no services")
    plans = [_service_plan(path, name, spec) for name, spec in services.items() if not _is_nats(spec)]
    return LaunchPlan(
        topology=topology,
        source=path,
        one_shot=tuple(p for p in plans if p.one_shot),
        services=tuple(p for p in plans if not p.one_shot),
    )


def _is_nats(spec: dict) -> bool:
    return str(spec.get("image", "")).startswith(NATS_IMAGE_PREFIX + ":")


def _service_plan(path: Path, name: str, spec: dict) -> ServicePlan:
    command = spec.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(part, str) for part in command):
        raise ComposeError(f"{path}: service {name!r} needs `command` as a list of strings")
    environment = spec.get("environment") or {}
    if not isinstance(environment, dict):
        raise ComposeError(f"{path}: service {name!r}: write `environment` as a mapping, not a list")
    replicas = int(((spec.get("deploy") or {}).get("replicas")) or 1)
    return ServicePlan(
        name=name,
        command=tuple(command),
        environment={str(k): "" if v is None else str(v) for k, v in environment.items()},
        replicas=replicas,
        one_shot=str(spec.get("restart", "")) == "no",
        restart=str(spec.get("restart", "no")),
    )
