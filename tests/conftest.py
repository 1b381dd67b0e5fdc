"""Suite-wide set-up: fixture modules, the tier markers, and one torch thread per process (CI has two cores).

Every test lives in a tier folder, and the folder is its marker: `pytest tests/unit` and `pytest -m unit` run the
same tests. The suite runs on parallel workers (pytest-xdist, `-n` in pyproject's addopts; `-n 0` for one process),
each taking whole groups: a file, or the whole cluster tier. The tiers are declared in pyproject.toml's `markers` (so a misspelt `-m` is refused with
--strict-markers) and in `TIERS` below; a test file outside a tier folder is an error at collection.
"""

import os
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "bus", "mesh", "kernels", "cluster", "deploy")

# Fixture modules, each owned by the part of the system it serves.
pytest_plugins = [
    "tests.support.nats_server",
    "tests.support.tiny_checkpoint",
    "tests.support.gateway_fixtures",
    "tests.support.mesh",
    "tests.support.timeline",
]


def tier_of(path: Path) -> str | None:
    """The tier folder a test file lives in, or None for a file outside every tier."""
    try:
        first = path.resolve().relative_to(TESTS).parts[0]
    except ValueError:
        return None
    return first if first in TIERS else None


def pytest_xdist_make_scheduler(config, log):
    """The parallel workers' unit of work: a file, so that a module's shared mesh or broker starts once; the cluster
    tier as one, since its hosts are network namespaces of fixed names shared by its files, and its elections are
    timed for a machine that runs nothing else of it at once."""
    from xdist.scheduler import LoadScopeScheduling

    class TierScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "tests/cluster" if path.startswith("tests/cluster/") else path

    return TierScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    outside = sorted({str(item.path) for item in items if tier_of(item.path) is None})
    if outside:
        raise pytest.UsageError(f"test files outside a tier folder ({', '.join(TIERS)}): {outside}")
    for item in items:
        item.add_marker(tier_of(item.path))
