"""Read a topology's compose file into a launch plan of local processes.

`voxmesh up` must run exactly what users deploy, so the plan comes from the compose file
itself: each service's `command` and `environment` (with what it `extends` from another file's
service merged in, as compose merges it), its replica count, and whether it is a
one-shot step (`restart: "no"`, like provisioning) that must finish before the others
start. The file is read as `docker compose` reads it: `${VAR:-default}` interpolated from the
environment (compose_interpolation.py), and services under a profile (the `tools` profile's
nats-box) left out, as `docker compose up` leaves them out unless asked. The NATS service is
left out too: locally an embedded nats-server takes its place. It is known by its label
`io.voxmesh.role: nats`, or by an image named `nats`, so a locally built NATS image
(`VOXMESH_NATS_IMAGE`) is still recognised. So is the step that writes that server's configuration
(`io.voxmesh.role: nats-config`): `voxmesh up` writes its embedded server's own. The NATS credentials a file gives
its services name files inside the containers (`CONTAINER_ONLY`): `voxmesh up` gives its own instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from services.mesh.compose_interpolation import InterpolationError, interpolate

COMPOSE_DIR = Path(__file__).resolve().parents[2] / "compose"
NATS_ROLE_LABEL = "io.voxmesh.role"
NATS_ROLE = "nats"
NATS_CONFIG_ROLE = "nats-config"
CONTAINER_ONLY = ("VOXMESH_NATS_USER", "VOXMESH_NATS_PASSWORD_FILE")
"""Variables of the compose files that only make sense inside their containers (a user whose password is in a
container's volume)."""
NATS_REPOSITORY = "nats"  # the official image's name (`nats:2.11-alpine`, `docker.io/library/nats:2.11`)


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


def load_plan(topology: str, env: Mapping[str, str] | None = None) -> LaunchPlan:
    """The plan of compose/<topology>.yml, its variables taken from `env` (default: this process's environment)."""
    path = compose_path(topology)
    variables = os.environ if env is None else env
    files: dict[Path, dict] = {}  # each file read once, however many services extend it
    services = _services(path, variables, files)
    services = {name: _extended(path, name, spec, variables, files) for name, spec in services.items()}
    plans = [_service_plan(path, name, spec) for name, spec in services.items()
             if not _is_nats(spec) and not spec.get("profiles")]
    return LaunchPlan(
        topology=topology,
        source=path,
        one_shot=tuple(p for p in plans if p.one_shot),
        services=tuple(p for p in plans if not p.one_shot),
    )


def _services(path: Path, variables: Mapping[str, str], files: dict[Path, dict]) -> dict:
    """The interpolated `services` of one compose file (from `files` when already read)."""
    if path in files:
        return files[path]
    try:
        document = interpolate(yaml.safe_load(path.read_text(encoding="utf-8")), variables)
    except OSError as error:
        raise ComposeError(f"{path}: cannot be read: {error}") from None
    except yaml.YAMLError as error:
        raise ComposeError(f"{path}: not valid YAML: {error}") from None
    except InterpolationError as error:
        raise ComposeError(f"{path}: {error}") from None
    services = (document or {}).get("services")
    if not isinstance(services, dict) or not services:
        raise ComposeError(f"{path}: has no services")
    files[path] = services
    return services


def _extended(path: Path, name: str, spec: dict, variables: Mapping[str, str], files: dict[Path, dict],
              depth: int = 0) -> dict:
    """`spec` with its `extends` (another file's service, or one of this file's) merged under it as compose merges
    them: mappings key by key (environment, deploy...), anything else replaced by the local value; `depends_on`
    never inherited."""
    extends = spec.get("extends")
    if extends is None:
        return spec
    if depth > 8:
        raise ComposeError(f"{path}: service {name!r}: `extends` goes deeper than 8 levels (a cycle?)")
    if isinstance(extends, str):
        extends = {"service": extends}
    if not isinstance(extends, dict) or not isinstance(extends.get("service"), str):
        raise ComposeError(f"{path}: service {name!r}: `extends` needs a `service` (and optionally a `file`)")
    source = (path.parent / extends["file"]).resolve() if extends.get("file") else path
    base_services = _services(source, variables, files)
    base = base_services.get(extends["service"])
    if not isinstance(base, dict):
        raise ComposeError(f"{path}: service {name!r} extends {extends['service']!r}, which {source} does not define")
    base = _extended(source, extends["service"], base, variables, files, depth + 1)
    base = {key: value for key, value in base.items() if key != "depends_on"}
    local = {key: value for key, value in spec.items() if key != "extends"}
    return _merged(base, local)


def _merged(base: dict, local: dict) -> dict:
    merged = dict(base)
    for key, value in local.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


def _is_nats(spec: dict) -> bool:
    """The NATS server, or the step that writes its configuration (locally, `voxmesh up` does both)."""
    labels = spec.get("labels") or {}
    if isinstance(labels, list):  # compose's list form: ["key=value", ...]
        labels = dict(item.partition("=")[::2] for item in labels)
    if labels.get(NATS_ROLE_LABEL) in (NATS_ROLE, NATS_CONFIG_ROLE):
        return True
    image = str(spec.get("image", ""))
    repository = image.rsplit("/", 1)[-1].split("@", 1)[0].split(":", 1)[0]
    return repository == NATS_REPOSITORY


def container_only_removed(environment: dict[str, str]) -> dict[str, str]:
    """A service's environment without the variables that name files inside its container (CONTAINER_ONLY)."""
    return {key: value for key, value in environment.items() if key not in CONTAINER_ONLY}


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
