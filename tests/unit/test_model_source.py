"""The checkpoint a process serves and its name (services/runtime/model_source.py, services/mesh/up_model.py): a
folder or a hub id, the hub id found in a cache laid out as huggingface_hub lays it out, without the network (the
download path is tests/bus/test_hub_download.py's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.decode.service import SETTINGS as DecodeSettings
from services.mesh.up_model import choose_model
from services.runtime.hub_cache import HubAccess, HubModelError
from services.runtime.model_source import hub_id_of, resolve_model, with_model_resolved
from services.runtime.settings_schema import SettingsError
from tests.support.hub_models import COMMIT_A, COMMIT_B, HUB_ID, cache_snapshot

UNREACHABLE = "http://127.0.0.1:9"  # never asked: these tests resolve from the cache, or fail before any download


def checkpoint(folder: Path, marker: str) -> Path:
    """A folder that resolves as a checkpoint (its config.json), told apart from others by `marker`."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"marker": marker}))
    (folder / "speech_tokenizer").mkdir()
    (folder / "speech_tokenizer" / "config.json").write_text("{}")
    return folder


@pytest.fixture
def cache(tmp_path) -> Path:
    """`HUB_ID` in a cache: main at COMMIT_A, the tag v2 at COMMIT_B."""
    directory = tmp_path / "hub"
    cache_snapshot(directory, HUB_ID, COMMIT_A, checkpoint(tmp_path / "a", "A"), refs=("main",))
    cache_snapshot(directory, HUB_ID, COMMIT_B, checkpoint(tmp_path / "b", "B"), refs=("v2",))
    return directory


def offline_access(cache_dir: Path, offline: bool = True) -> HubAccess:
    return HubAccess(cache_dir, UNREACHABLE, offline)


def marker_of(folder: Path | None) -> str:
    assert folder is not None
    return json.loads((folder / "config.json").read_text())["marker"]


def test_an_id_is_org_slash_name_and_a_path_that_exists_is_a_folder(tmp_path, monkeypatch):
    assert hub_id_of("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice") == "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"
    for folder in ("/models/tiny", "./org/name", "../org/name", "~/org/name", "org/name/more", "tiny", "org--x/y"):
        assert hub_id_of(folder) is None, folder
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert hub_id_of("org/name") is None  # a folder of that path is here: it wins, as transformers does


def test_a_folder_is_served_under_its_own_name_unless_one_is_given(tmp_path):
    folder = tmp_path / "Qwen3-TTS-12Hz-1.7B-CustomVoice"
    assert resolve_model(str(folder), None, None, download=False).name == "Qwen3-TTS-12Hz-1.7B-CustomVoice"
    assert resolve_model(str(folder), None, "voice", download=False).name == "voice"
    assert resolve_model(None, None, None, download=False).name == "tiny"  # no checkpoint: up's own first-run one
    with pytest.raises(SettingsError, match="--model-name"):
        resolve_model(str(tmp_path / "ü"), None, None, download=False)  # nothing of it makes a subject token


def test_a_hub_id_resolves_from_the_cache_offline_under_the_id(cache):
    resolved = resolve_model(HUB_ID, None, None, download=False, access=offline_access(cache))
    assert marker_of(resolved.folder) == "A" and resolved.snapshot.commit == COMMIT_A
    assert resolved.name == HUB_ID
    assert resolved.folder == cache / "models--voxmesh-tests--tiny-tts" / "snapshots" / COMMIT_A


@pytest.mark.parametrize("revision", ["v2", COMMIT_B])
def test_a_revision_pins_the_snapshot(cache, revision):
    resolved = resolve_model(HUB_ID, revision, None, download=False, access=offline_access(cache))
    assert marker_of(resolved.folder) == "B" and resolved.snapshot.commit == COMMIT_B


def test_a_snapshot_folder_given_as_a_folder_is_served_under_its_id(cache):
    snapshot = cache / "models--voxmesh-tests--tiny-tts" / "snapshots" / COMMIT_B
    assert resolve_model(str(snapshot), None, None, download=False).name == HUB_ID


@pytest.mark.parametrize("download", [False, True])
def test_a_missing_model_offline_is_an_error_that_names_the_id_and_the_cache(cache, download):
    with pytest.raises(HubModelError) as refused:
        resolve_model("voxmesh-tests/absent", None, None, download=download, access=offline_access(cache))
    assert refused.value.code == "model_not_cached"
    message = str(refused.value)
    assert "voxmesh-tests/absent" in message and str(cache / "models--voxmesh-tests--absent") in message
    assert ("HF_HUB_OFFLINE" in message) == download  # a service never downloads: it says who does
    with pytest.raises(HubModelError, match="revision v9"):
        resolve_model(HUB_ID, "v9", None, download=False, access=offline_access(cache))


def test_an_interrupted_download_is_not_a_checkpoint(cache):
    (cache / "models--voxmesh-tests--tiny-tts" / "snapshots" / COMMIT_A / "config.json").unlink()
    with pytest.raises(HubModelError, match="not in the cache"):
        resolve_model(HUB_ID, None, None, download=False, access=offline_access(cache))


def test_a_revision_needs_a_hub_id(tmp_path):
    with pytest.raises(SettingsError, match="VOXMESH_REVISION"):
        resolve_model(str(tmp_path), "main", None, download=False)


def test_settings_resolve_to_the_snapshot_folder_and_stay_so(cache):
    given = DecodeSettings(model_dir=HUB_ID, revision="v2")
    settings, resolved = with_model_resolved(given, download=False, access=offline_access(cache))
    assert (settings.model_dir, settings.revision, settings.model_name) == (str(resolved.folder), None, HUB_ID)
    assert marker_of(Path(settings.model_dir)) == "B" and COMMIT_B in resolved.describe()
    again, _ = with_model_resolved(settings, download=False, access=offline_access(cache))
    assert again == settings  # a resolved settings object resolves to itself (colocated halves, restarts)


def test_up_tells_every_service_the_id_at_the_commit_it_resolved(cache, tmp_path):
    choice = choose_model(HUB_ID, None, None, tmp_path, environ={}, access=offline_access(cache, offline=False))
    assert choice.environment() == {"VOXMESH_MODEL_DIR": HUB_ID, "VOXMESH_REVISION": COMMIT_A,
                                    "VOXMESH_MODEL_NAME": HUB_ID}
    named = choose_model(HUB_ID, None, None, tmp_path, environ={"VOXMESH_MODEL_NAME": "voice", "VOXMESH_REVISION": "v2"},
                         access=offline_access(cache))
    assert named.environment()["VOXMESH_MODEL_NAME"] == "voice" and named.revision == COMMIT_B


def test_up_refuses_a_folder_without_a_checkpoint_and_a_revision_without_an_id(tmp_path):
    with pytest.raises(SettingsError, match="no config.json"):
        choose_model(str(tmp_path), None, None, tmp_path, environ={})
    with pytest.raises(SettingsError, match="needs --model ORG/NAME"):
        choose_model(None, "v2", None, tmp_path, environ={})
    folder = checkpoint(tmp_path / "Qwen3-TTS-0.6B", "A")
    assert choose_model(str(folder), None, None, tmp_path, environ={}).environment() == {
        "VOXMESH_MODEL_DIR": str(folder), "VOXMESH_MODEL_NAME": "Qwen3-TTS-0.6B"}
