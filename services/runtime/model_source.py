"""Which checkpoint a process serves and under which name: the `model_dir`, `revision` and `model_name` settings,
resolved once at start-up.

`model_dir` names a folder, or a Hugging Face hub id `ORG/NAME` (a path that exists, or that starts with `/`, `.` or
`~`, is always a folder). A hub id is looked up in the hub's cache at `revision` (default `main`) without touching
the network; only the steps that run before the services (`voxmesh up`, `voxmesh provision`) download a missing one.
Resolved, `model_dir` is the snapshot's folder, so every service of a mesh loads the same files, and `model_name`, when
not given, is the checkpoint's own name: the hub id, or the folder's name (a cache snapshot's folder: its id).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from messages import subjects
from messages.errors import InvalidToken
from services.runtime.hub_cache import (HubAccess, HubModelError, HubSnapshot, cached_snapshot, download_snapshot,
                                        repo_folder, snapshot_repo_id)
from services.runtime.settings_schema import SettingsError

DEFAULT_REVISION = "main"
NO_CHECKPOINT_NAME = "tiny"  # the name with no checkpoint named: `voxmesh up`'s own tiny checkpoint is `models/tiny`
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")

S = TypeVar("S")


def hub_id_of(model_dir: str) -> str | None:
    """`model_dir` as a hub id `ORG/NAME`, or None when it names a folder."""
    if model_dir.startswith(("/", ".", "~")) or Path(model_dir).exists():
        return None
    if not _HUB_ID.match(model_dir) or "--" in model_dir or ".." in model_dir:
        return None
    return model_dir


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """The checkpoint a process serves: its folder on disk (None: none named), the name clients ask for, and the hub
    snapshot it came from."""

    folder: Path | None
    name: str
    snapshot: HubSnapshot | None = None

    def describe(self) -> str:
        """One line for logs: what is served, from where."""
        if self.snapshot is not None:
            return (f"model {self.name!r}: hub {self.snapshot.repo_id} at commit {self.snapshot.commit}, "
                    f"{self.folder}")
        return f"model {self.name!r}: {self.folder if self.folder is not None else 'no checkpoint'}"


def resolve_model(model_dir: str | None, revision: str | None, model_name: str | None, *, download: bool,
                  access: HubAccess | None = None) -> ResolvedModel:
    """Resolve the three settings; `download` lets a hub id missing from the cache be fetched (unless HF_HUB_OFFLINE
    says not to). Raises SettingsError (HubModelError for hub ids) with a message that names what to do."""
    hub_id = hub_id_of(model_dir) if model_dir else None
    if hub_id is None:
        if revision:
            raise SettingsError(f"--revision / VOXMESH_REVISION ({revision!r}) picks a hub model's revision, but "
                                f"--model-dir / VOXMESH_MODEL_DIR ({model_dir!r}) is not a hub id ORG/NAME")
        folder = Path(model_dir).expanduser() if model_dir else None
        return ResolvedModel(folder, model_name or _folder_name(folder))
    snapshot = _hub_snapshot(hub_id, revision or DEFAULT_REVISION, download, access or HubAccess.from_environment())
    return ResolvedModel(snapshot.folder, model_name or hub_id, snapshot)


def with_model_resolved(settings: S, *, download: bool, access: HubAccess | None = None) -> tuple[S, ResolvedModel]:
    """`settings` (any service's: they all extend CommonSettings) with `model_dir` the checkpoint's folder, no
    `revision` left to apply and `model_name` filled in; and the resolution, for the start-up log."""
    resolved = resolve_model(settings.model_dir, settings.revision, settings.model_name, download=download,
                             access=access)
    folder = str(resolved.folder) if resolved.folder is not None else None
    return dataclasses.replace(settings, model_dir=folder, revision=None, model_name=resolved.name), resolved


def _folder_name(folder: Path | None) -> str:
    """A folder checkpoint's own name: a cache snapshot's hub id, else the folder's name; it must make a subject
    token (subjects.slug)."""
    if folder is None:
        return NO_CHECKPOINT_NAME
    absolute = folder.resolve()
    name = snapshot_repo_id(absolute) or absolute.name
    try:
        subjects.slug(name)
    except InvalidToken:
        raise SettingsError(f"the checkpoint folder {str(folder)!r} has no name usable as a model name: give one with "
                            "--model-name / VOXMESH_MODEL_NAME") from None
    return name


def _hub_snapshot(hub_id: str, revision: str, download: bool, access: HubAccess) -> HubSnapshot:
    cached = cached_snapshot(hub_id, revision, access)
    if cached is not None:
        return cached
    where = f"hub model {hub_id} (revision {revision}) is not in the cache at {repo_folder(hub_id, access)}"
    if not download:
        raise HubModelError("model_not_cached", f"{where}; services never download: `voxmesh up --model {hub_id}` "
                            f"or `voxmesh provision` downloads it first (or `hf download {hub_id}`), with the same "
                            "HF_HOME")
    if access.offline:
        raise HubModelError("model_not_cached", f"{where}, and HF_HUB_OFFLINE forbids downloading it: unset "
                            "HF_HUB_OFFLINE where the hub is reachable, or fill this cache from one that has it")
    print(f"downloading {hub_id} (revision {revision}) from {access.endpoint} into {access.cache_dir}",
          file=sys.stderr, flush=True)
    return download_snapshot(hub_id, revision, access)
