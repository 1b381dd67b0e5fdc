"""The checkpoint `voxmesh up` serves, settled before anything starts: a folder, a hub id (downloaded into the hub's
cache here when missing, so the services find it there), or the state dir's own tiny checkpoint (written on the first
run), and the name clients ask for."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from services.runtime.hub_cache import HubAccess
from services.runtime.model_source import ResolvedModel, resolve_model
from services.runtime.settings_schema import SettingsError

FIRST_RUN_CHECKPOINT = Path("models") / "tiny"  # under the state dir; its folder's name is the name it is served as


@dataclass(frozen=True, slots=True)
class ModelChoice:
    """What every service of the mesh is told (the same for each), and the resolution behind it."""

    model_dir: str  # a folder, or the hub id: each service finds the snapshot in the cache itself
    revision: str | None  # a hub id's commit, resolved here: every service loads the very same snapshot
    resolved: ResolvedModel

    def environment(self) -> dict[str, str]:
        values = {"VOXMESH_MODEL_DIR": self.model_dir, "VOXMESH_MODEL_NAME": self.resolved.name}
        if self.revision is not None:
            values["VOXMESH_REVISION"] = self.revision
        return values

    def describe(self) -> str:
        return self.resolved.describe()


def choose_model(model: str | None, revision: str | None, model_name: str | None, state_dir: Path,
                 environ: Mapping[str, str], access: HubAccess | None = None) -> ModelChoice:
    """The flags `--model`, `--revision`, `--model-name` (a flag, else its variable in `environ`, `voxmesh up`'s
    environment, as the services read them); a hub id missing from the cache is downloaded now. Raises SettingsError (or HubModelError) with what to do."""
    revision = revision or environ.get("VOXMESH_REVISION") or None
    model_name = model_name or environ.get("VOXMESH_MODEL_NAME") or None
    if model is None:
        if revision is not None:
            raise SettingsError(f"--revision / VOXMESH_REVISION ({revision!r}) needs --model ORG/NAME (a hub id)")
        model = str(_first_run_checkpoint(state_dir))
    resolved = resolve_model(model, revision, model_name, download=True, access=access)
    if resolved.snapshot is not None:
        return ModelChoice(resolved.snapshot.repo_id, resolved.snapshot.commit, resolved)
    folder = resolved.folder
    if folder is None or not (folder / "config.json").is_file():
        raise SettingsError(f"--model {model} has no config.json (voxmesh model init writes one; a hub id is "
                            "ORG/NAME)")
    return ModelChoice(str(folder), None, resolved)


def _first_run_checkpoint(state_dir: Path) -> Path:
    folder = state_dir / FIRST_RUN_CHECKPOINT
    if not (folder / "config.json").is_file():
        from services.random_checkpoint.checkpoint_writer import write_checkpoint

        print(f"first run: writing the tiny checkpoint to {folder}", file=sys.stderr)
        write_checkpoint(folder, "tiny", seed=0)
    return folder
