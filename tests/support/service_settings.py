"""What a deployed voxmesh command reads: its settings class, and from it every environment variable it takes. The
compose files and the Kubernetes manifests are held to it: a variable a file passes that no setting reads would be
silently ignored."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Sequence

from services.cli.provision import ProvisionSettings
from services.runtime.common_settings import CommonSettings
from services.runtime.process import COMPOSITES, SERVICES
from services.runtime.settings_schema import env_name


def settings_for(command: Sequence[str]) -> type:
    """The settings class of `voxmesh serve NAME`, `voxmesh provision` or `voxmesh health`."""
    words = tuple(command)
    if words[:2] == ("voxmesh", "serve") and len(words) > 2 and words[2] in SERVICES + COMPOSITES:
        return importlib.import_module(f"services.{words[2]}.service").SETTINGS
    if words[:2] == ("voxmesh", "provision"):
        return ProvisionSettings
    if words[:2] == ("voxmesh", "health"):
        return CommonSettings
    raise ValueError(f"not a voxmesh command with settings: {list(command)}")


def role_of(command: Sequence[str]) -> str:
    """The NATS user a command runs as: its service's name, or `provision`."""
    words = tuple(command)
    return words[2] if words[:2] == ("voxmesh", "serve") else words[1]


def variables_read(settings: type) -> frozenset[str]:
    """Every environment variable `settings` reads: one per field, and `<NAME>_FILE` beside each secret's."""
    names = set()
    for field in dataclasses.fields(settings):
        names.add(env_name(field))
        if field.metadata.get("secret"):
            names.add(env_name(field) + "_FILE")
    return frozenset(names)


def secret_variables(settings: type) -> frozenset[str]:
    """The variables that carry a credential's value itself (never to be written in a file that is deployed)."""
    return frozenset(env_name(f) for f in dataclasses.fields(settings) if f.metadata.get("secret"))
