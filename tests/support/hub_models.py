"""Hugging Face hub models for the tests, without the hub: a cache laid out as huggingface_hub lays it out
(`models--ORG--NAME/blobs/<hash>`, `snapshots/<commit>/<file>` linking to its blob, `refs/<branch>` holding the
commit), filled from a checkpoint folder."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

HUB_ID = "voxmesh-tests/tiny-tts"
COMMIT_A = "a" * 40  # commits are 40 hex digits: huggingface_hub tells a commit from a branch by that
COMMIT_B = "b" * 40


def checkpoint_files(folder: Path) -> list[str]:
    """Every file of a checkpoint folder, as repository paths (`speech_tokenizer/config.json`)."""
    return sorted(path.relative_to(folder).as_posix() for path in folder.rglob("*") if path.is_file())


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cache_snapshot(cache_dir: Path, repo_id: str, commit: str, checkpoint: Path, refs: tuple[str, ...] = ()) -> Path:
    """Put `checkpoint` into the hub cache at `cache_dir` as `repo_id`'s commit `commit`, with each of `refs`
    (branches, tags) pointing at it; the snapshot folder."""
    repo = cache_dir / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    for name in checkpoint_files(checkpoint):
        source = checkpoint / name
        blob = repo / "blobs" / sha256_of(source)
        if not blob.exists():
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(source.read_bytes())
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot
