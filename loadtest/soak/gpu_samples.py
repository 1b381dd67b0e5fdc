"""The GPU at one moment, through `nvidia-smi`: each card's memory in use, and each mesh process's memory on the
cards (by pid, named as `process_samples.mesh_processes` names them). Without `nvidia-smi` on PATH there is no GPU
sample, and the soak says so."""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import asdict, dataclass, field

NVIDIA_SMI = "nvidia-smi"
CARDS_QUERY = ("--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits")
APPS_QUERY = ("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
SMI_TIMEOUT_S = 30.0  # nvidia-smi answers in well under a second; a driver that hangs must not hang the soak


@dataclass(frozen=True, slots=True)
class CardSample:
    """One card: its index, and its memory in use and in all, in MiB (None where nvidia-smi says N/A)."""

    index: int
    used_mib: int | None
    total_mib: int | None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """The cards and the mesh's processes on them at one moment.

    Attributes:
        available: whether nvidia-smi answered; False: `reason` says why, and nothing else is filled.
        reason: why there is no sample (no nvidia-smi on PATH, or its error).
        cards: every card nvidia-smi lists.
        processes: MiB on the cards (all cards added) of each mesh process nvidia-smi lists, by its mesh name.
        other_mib: MiB of compute processes that are not the mesh's (another tenant, or pids nvidia-smi sees in
            another pid namespace than ours, as in a container).
        unmapped_pids: those processes' pids.
    """

    available: bool
    reason: str | None = None
    cards: list[CardSample] = field(default_factory=list)
    processes: dict[str, int] = field(default_factory=dict)
    other_mib: int = 0
    unmapped_pids: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


class SmiOutputError(ValueError):
    """A line of nvidia-smi's CSV that is not what the query asked for."""

    code = "unreadable_nvidia_smi"


def parse_cards(text: str) -> list[CardSample]:
    """`index, memory.used, memory.total` lines (csv, noheader, nounits) -> the cards."""
    cards = []
    for fields in _rows(text, 3):
        index = _integer(fields[0])
        if index is None:
            raise SmiOutputError(f"a card without an index in nvidia-smi's output: {fields}")
        cards.append(CardSample(index, _integer(fields[1]), _integer(fields[2])))
    return cards


def parse_apps(text: str) -> dict[int, int]:
    """`pid, used_memory` lines (csv, noheader, nounits) -> MiB by pid, a pid on several cards added up; a process
    whose memory reads N/A counts 0."""
    used: dict[int, int] = {}
    for pid_field, memory_field in _rows(text, 2):
        pid = _integer(pid_field)
        if pid is None:
            raise SmiOutputError(f"a process without a pid in nvidia-smi's output: {pid_field}, {memory_field}")
        used[pid] = used.get(pid, 0) + (_integer(memory_field) or 0)
    return used


def name_processes(used_by_pid: dict[int, int], mesh: dict[str, int]) -> tuple[dict[str, int], int, list[int]]:
    """The mesh's processes' MiB by name, and the MiB and pids of the rest."""
    name_of = {pid: name for name, pid in mesh.items()}
    named = {name_of[pid]: mib for pid, mib in used_by_pid.items() if pid in name_of}
    others = sorted(pid for pid in used_by_pid if pid not in name_of)
    return named, sum(used_by_pid[pid] for pid in others), others


async def sample_gpu(mesh: dict[str, int]) -> GpuSample:
    """The cards and `mesh`'s processes (name -> pid) now; not available without nvidia-smi or when it fails."""
    if shutil.which(NVIDIA_SMI) is None:
        return GpuSample(available=False, reason="no GPU: nvidia-smi is not on PATH")
    try:
        cards = parse_cards(await _smi(CARDS_QUERY))
        used = parse_apps(await _smi(APPS_QUERY))
    except (OSError, TimeoutError, RuntimeError, SmiOutputError) as error:
        return GpuSample(available=False, reason=f"no GPU sample: {error}")
    named, other_mib, others = name_processes(used, mesh)
    return GpuSample(available=True, cards=cards, processes=named, other_mib=other_mib, unmapped_pids=others)


async def _smi(query: tuple[str, ...]) -> str:
    process = await asyncio.create_subprocess_exec(NVIDIA_SMI, *query, stdin=asyncio.subprocess.DEVNULL,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(process.communicate(), SMI_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    if process.returncode != 0:
        raise RuntimeError(f"nvidia-smi {' '.join(query)} failed ({process.returncode}): "
                           f"{(err or out).decode(errors='replace').strip()[:200]}")
    return out.decode(errors="replace")


def _rows(text: str, width: int) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [part.strip() for part in line.split(",")]
        if len(fields) != width:
            raise SmiOutputError(f"expected {width} fields in nvidia-smi's line {line!r}")
        rows.append(fields)
    return rows


def _integer(text: str) -> int | None:
    """An integer field, or None for nvidia-smi's `[N/A]`, `[Not Supported]` and the like."""
    return int(text) if text.isdigit() else None
