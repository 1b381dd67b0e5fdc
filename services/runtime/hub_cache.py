"""A model on the Hugging Face hub, found in the hub's local cache or downloaded into it (huggingface_hub's public
API: `snapshot_download`, its cache layout `models--ORG--NAME/snapshots/<commit>`, `refs/<branch or tag>`).

Looking in the cache never touches the network; a download takes huggingface_hub's own file locks, so processes that
fetch the same files at once wait for each other instead of writing them twice. huggingface_hub is imported only
here and only when a hub id is used: a folder checkpoint never loads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.runtime.settings_schema import SettingsError

CONFIG_FILE = "config.json"  # a snapshot without it is an interrupted download, not a checkpoint


class HubModelError(SettingsError):
    """A hub model that cannot be had; `code` says why (machine-readable), the message names the id and the cache."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class HubAccess:
    """Where the cache is, which hub serves downloads, and whether downloading is allowed at all."""

    cache_dir: Path
    endpoint: str
    offline: bool

    @staticmethod
    def from_environment() -> HubAccess:
        """huggingface_hub's own reading of HF_HOME / HF_HUB_CACHE, HF_ENDPOINT and HF_HUB_OFFLINE."""
        from huggingface_hub import constants

        return HubAccess(Path(constants.HF_HUB_CACHE), constants.ENDPOINT, bool(constants.HF_HUB_OFFLINE))


@dataclass(frozen=True, slots=True)
class HubSnapshot:
    """One revision of a hub model, on disk."""

    repo_id: str
    commit: str
    folder: Path


def cached_snapshot(repo_id: str, revision: str, access: HubAccess) -> HubSnapshot | None:
    """The cached snapshot of `repo_id` at `revision` (a branch, a tag or a commit), or None when the cache lacks it
    or holds it incomplete. Never touches the network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(repo_id, revision=revision, cache_dir=access.cache_dir,
                                        local_files_only=True))
    except LocalEntryNotFoundError:
        return None
    if not (folder / CONFIG_FILE).is_file():
        return None
    return HubSnapshot(repo_id, folder.name, folder)


def download_snapshot(repo_id: str, revision: str, access: HubAccess) -> HubSnapshot:
    """Download `repo_id` at `revision` into the cache (a progress bar on stderr) and return it; a typed error that
    names the id, the hub and the cache when the hub refuses or cannot be reached."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    where = f"{repo_id} (revision {revision}) from {access.endpoint} into the cache at {access.cache_dir}"
    try:
        folder = Path(snapshot_download(repo_id, revision=revision, cache_dir=access.cache_dir,
                                        endpoint=access.endpoint))
    except RevisionNotFoundError:
        raise HubModelError("revision_not_found", f"cannot download {where}: the hub has no such revision") from None
    except RepositoryNotFoundError:
        raise HubModelError("model_not_found", f"cannot download {where}: the hub has no model {repo_id} (or it "
                            "is private or gated: log in with `huggingface-cli login` or set HF_TOKEN)") from None
    except LocalEntryNotFoundError as error:
        cause = error.__cause__ or error
        raise HubModelError("hub_unreachable", f"cannot download {where}: the hub cannot be reached ({cause}); "
                            "download it where the hub is reachable, or point HF_ENDPOINT at a mirror") from None
    except (HfHubHTTPError, OSError) as error:
        raise HubModelError("model_download_failed", f"cannot download {where}: {error}") from None
    if not (folder / CONFIG_FILE).is_file():
        raise HubModelError("not_a_checkpoint", f"{repo_id} (revision {revision}, in {folder}) has no {CONFIG_FILE}: "
                            "not a Qwen3-TTS checkpoint")
    return HubSnapshot(repo_id, folder.name, folder)


def repo_folder(repo_id: str, access: HubAccess) -> Path:
    """The cache's folder for `repo_id` (`models--ORG--NAME`), named in errors so a user can look there."""
    return access.cache_dir / ("models--" + repo_id.replace("/", "--"))


def snapshot_repo_id(folder: Path) -> str | None:
    """The hub id of a folder that is a cache snapshot (`.../models--ORG--NAME/snapshots/<commit>`), else None."""
    parent, grandparent = folder.parent, folder.parent.parent
    if parent.name != "snapshots" or not grandparent.name.startswith("models--"):
        return None
    parts = grandparent.name.removeprefix("models--").split("--")
    return "/".join(parts) if len(parts) == 2 and all(parts) else None

