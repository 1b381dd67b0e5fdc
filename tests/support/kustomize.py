"""The Kubernetes manifests as `kubectl kustomize` renders them (kubectl ships kustomize; no cluster is needed).

Without kubectl the tests that need it skip, except in CI (CI set), where the image has it and its absence is a
failure."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
KUBERNETES_DIR = REPO / "deploy" / "kubernetes"
OVERLAYS = tuple(sorted(path.name for path in (KUBERNETES_DIR / "overlays").iterdir() if path.is_dir()))


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        reason = "kubectl (with its kustomize) is not installed: the manifests cannot be rendered"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return found


def kustomize(directory: Path) -> subprocess.CompletedProcess:
    """`kubectl kustomize DIRECTORY`: the rendered YAML on stdout, or why not on stderr."""
    return subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120,
                          check=False)


@functools.cache
def _rendered(overlay: str) -> str:
    done = kustomize(KUBERNETES_DIR / "overlays" / overlay)
    assert done.returncode == 0, f"kubectl kustomize refused overlay {overlay}:\n{done.stderr}"
    return done.stdout


def rendered(overlay: str) -> list[dict]:
    """Every object of an overlay, rendered (a fresh copy each call: tests may change them)."""
    return [obj for obj in yaml.safe_load_all(_rendered(overlay)) if obj]


def one(objects: list[dict], kind: str, name: str) -> dict:
    [found] = [obj for obj in objects if obj["kind"] == kind and obj["metadata"]["name"] == name]
    return found


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [obj for obj in objects if obj["kind"] == kind]
