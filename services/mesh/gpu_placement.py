"""Which GPU each replica of a service sees on a host with several (`voxmesh up --gpus prefill=1 --gpus decode=0`).

The compose files place services on GPUs with their CUDA overrides (compose/cuda/); `voxmesh up` runs only the base
file, so it places them itself: each replica of a named service gets `CUDA_VISIBLE_DEVICES` set to one index of its
list, replica k the k-th (cycling), and so sees that GPU as its `cuda` device. Services not named see every GPU.
"""

from __future__ import annotations

from collections.abc import Iterable

PLACEMENT_VARIABLE = "CUDA_VISIBLE_DEVICES"


class PlacementError(ValueError):
    """A `--gpus` value that names no service of the topology or no GPU index."""


def parse_placements(values: Iterable[str], services: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """`SERVICE=I[,J...]` values -> {service: GPU indices}; PlacementError names what is wrong."""
    known = set(services)
    placements: dict[str, tuple[int, ...]] = {}
    for value in values:
        name, sep, indices = value.partition("=")
        if not sep or not name or not indices:
            raise PlacementError(f"--gpus {value!r}: write SERVICE=INDEX[,INDEX...], e.g. prefill=1 or decode=0,1")
        if name not in known:
            raise PlacementError(f"--gpus {value!r}: the topology has no service {name!r} (it has "
                                 f"{', '.join(sorted(known))})")
        try:
            parsed = tuple(int(index) for index in indices.split(","))
        except ValueError:
            raise PlacementError(f"--gpus {value!r}: GPU indices are integers >= 0") from None
        if any(index < 0 for index in parsed):
            raise PlacementError(f"--gpus {value!r}: GPU indices are integers >= 0")
        if name in placements:
            raise PlacementError(f"--gpus names {name!r} twice")
        placements[name] = parsed
    return placements


def replica_environment(indices: tuple[int, ...] | None, replica: int) -> dict[str, str]:
    """What replica `replica` of a service placed on `indices` adds to its environment (nothing when unplaced)."""
    if not indices:
        return {}
    return {PLACEMENT_VARIABLE: str(indices[replica % len(indices)])}
