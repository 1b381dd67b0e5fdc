"""Suite-wide set-up: fixture modules, and one torch thread per process (CI has two cores)."""

import importlib.util
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

# Fixture modules, each owned by the part of the system it serves. Listed only once they exist,
# so the suite still collects while a part is being written.
_FIXTURE_MODULES = [
    "tests.fixtures.nats_server",
    "tests.fixtures.tiny_checkpoint",
    "tests.fixtures.reference_checkpoints",
    "tests.fixtures.mesh",
]
pytest_plugins = [name for name in _FIXTURE_MODULES if importlib.util.find_spec(name) is not None]
