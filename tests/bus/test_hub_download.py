"""A hub model missing from the cache is downloaded (services/runtime/hub_cache.py through huggingface_hub's
`snapshot_download`) from a stand-in hub on loopback: the files arrive whole with a progress bar, a revision pins the
commit, and a hub that refuses or cannot be reached gives an error naming the id and the cache. No test here reaches
the network."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from services.runtime.hub_cache import HubAccess, HubModelError
from services.runtime.model_source import resolve_model
from tests.support.hub_models import COMMIT_A, COMMIT_B, HUB_ID, checkpoint_files
from tests.support.stand_in_hub import HubRepo, StandInHub


def tiny_files(folder: Path, marker: str) -> Path:
    """A small checkpoint-shaped folder (nested files included), told apart from others by `marker`."""
    (folder / "speech_tokenizer").mkdir(parents=True)
    (folder / "config.json").write_text(f'{{"marker": "{marker}"}}')
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (folder / "speech_tokenizer" / "config.json").write_text("{}")
    return folder


@pytest.fixture
def hub(tmp_path):
    """The stand-in hub holding HUB_ID: main at COMMIT_A, the tag v2 at COMMIT_B."""
    repo = HubRepo(commits={COMMIT_A: tiny_files(tmp_path / "a", "A"), COMMIT_B: tiny_files(tmp_path / "b", "B")},
                   refs={"main": COMMIT_A, "v2": COMMIT_B})
    with StandInHub({HUB_ID: repo}) as running:
        yield running


def online(cache_dir: Path, endpoint: str) -> HubAccess:
    return HubAccess(cache_dir, endpoint, offline=False)


def test_a_missing_model_is_downloaded_whole_then_found_offline(hub, tmp_path, capfd):
    access = online(tmp_path / "cache", hub.url)
    resolved = resolve_model(HUB_ID, None, None, download=True, access=access)
    source = hub.repos[HUB_ID].commits[COMMIT_A]
    assert resolved.snapshot.commit == COMMIT_A and resolved.name == HUB_ID
    assert checkpoint_files(resolved.folder) == checkpoint_files(source)
    for name in checkpoint_files(source):
        assert (resolved.folder / name).read_bytes() == (source / name).read_bytes(), name
    assert sorted(hub.files_sent()) == sorted(f"/{HUB_ID}/resolve/{COMMIT_A}/{name}"
                                              for name in checkpoint_files(source))
    err = capfd.readouterr().err
    assert f"downloading {HUB_ID} (revision main) from {hub.url}" in err
    assert "Fetching 3 files" in err  # huggingface_hub's progress bar
    asked = len(hub.requests)
    again = resolve_model(HUB_ID, None, None, download=True, access=access)
    assert again.folder == resolved.folder and len(hub.requests) == asked  # the cache answers: the hub is not asked


def test_a_revision_downloads_that_commit(hub, tmp_path):
    resolved = resolve_model(HUB_ID, "v2", None, download=True, access=online(tmp_path / "cache", hub.url))
    assert resolved.snapshot.commit == COMMIT_B and '"B"' in (resolved.folder / "config.json").read_text()
    assert (tmp_path / "cache" / "models--voxmesh-tests--tiny-tts" / "refs" / "v2").read_text() == COMMIT_B
    assert not any(COMMIT_A in path for path in hub.files_sent())


@pytest.mark.parametrize(("model", "revision", "code"), [("voxmesh-tests/absent", None, "model_not_found"),
                                                         (HUB_ID, "v9", "revision_not_found")])
def test_what_the_hub_refuses_is_named(hub, tmp_path, model, revision, code):
    with pytest.raises(HubModelError) as refused:
        resolve_model(model, revision, None, download=True, access=online(tmp_path / "cache", hub.url))
    assert refused.value.code == code and model in str(refused.value) and str(tmp_path / "cache") in str(refused.value)


def test_an_unreachable_hub_is_an_error_that_names_the_id_and_the_cache(tmp_path):
    with socket.socket() as closed:  # a loopback port with no listener: connections are refused at once
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
    with pytest.raises(HubModelError) as refused:
        resolve_model(HUB_ID, None, None, download=True, access=online(tmp_path / "cache", endpoint))
    assert refused.value.code == "hub_unreachable"
    assert HUB_ID in str(refused.value) and str(tmp_path / "cache") in str(refused.value)
