"""The secret the mesh's gateways sign resume tokens with: made once per state directory, kept across restarts (a
restarted gateway still verifies the tokens its predecessor gave out), readable by its owner only."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

FILE_NAME = "resume.secret"


def ensure_resume_secret(state_dir: Path) -> Path:
    """The secret's file in `state_dir`, written (mode 0600) on first use."""
    path = state_dir / FILE_NAME
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(secrets.token_urlsafe(32) + "\n")
    return path
