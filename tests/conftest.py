"""Suite-wide set-up: fixture modules, and one torch thread per process (CI has two cores)."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

# Fixture modules, each owned by the part of the system it serves.
pytest_plugins = [
    "tests.fixtures.nats_server",
    "tests.fixtures.tiny_checkpoint",
    "tests.fixtures.gateway_fixtures",
    "tests.fixtures.mesh",
]
