"""Whether the GPU's memory stayed flat: each card's memory in use and each mesh process's memory on the cards, at the
end against the start, within the tolerance resident memory has (flatness.MEMORY_TOLERANCE)."""

from __future__ import annotations

from loadtest.soak.gpu_samples import GpuSample

NOT_SAMPLED = "no GPU: not sampled"


def gpu_verdict(start: GpuSample | None, end: GpuSample | None, tolerance: float) -> dict:
    """The GPU section of a soak's document; `flat` is None (not judged) when either moment has no sample."""
    unavailable = [sample for sample in (start, end) if sample is None or not sample.available]
    if unavailable:
        reason = NOT_SAMPLED if unavailable[0] is None else unavailable[0].reason
        return {"available": False, "reason": reason, "flat": None, "cards": [], "processes": [], "notes": []}
    before = {card.index: card for card in start.cards}
    cards = [{"index": card.index, "total_mib": card.total_mib,
              **_change(before[card.index].used_mib if card.index in before else None, card.used_mib, tolerance)}
             for card in end.cards]
    processes = [{"process": name, **_change(start.processes.get(name, 0), end.processes.get(name, 0), tolerance)}
                 for name in sorted(start.processes.keys() | end.processes.keys())]
    notes = []
    if not processes:
        notes.append("nvidia-smi lists no process of the mesh (none on the GPU, or pids of another namespace): "
                     "the cards alone are judged")
    if end.other_mib:
        notes.append(f"{end.other_mib} MiB on the cards belong to processes outside the mesh (pids "
                     f"{', '.join(map(str, end.unmapped_pids))})")
    return {"available": True, "reason": None, "cards": cards, "processes": processes, "notes": notes,
            "flat": all(row["flat"] for row in cards + processes)}


def _change(first: int | None, last: int | None, tolerance: float) -> dict:
    """MiB at both moments and whether the change is within `tolerance` of the first (from nothing: only to
    nothing; an unreadable figure is not flat)."""
    if first is None or last is None:
        return {"start_mib": first, "end_mib": last, "change": None, "flat": False}
    if first == 0:
        return {"start_mib": first, "end_mib": last, "change": None, "flat": last == 0}
    change = (last - first) / first
    return {"start_mib": first, "end_mib": last, "change": change, "flat": abs(change) <= tolerance}


def markdown_lines(gpu: dict | None) -> list[str]:
    """The GPU table, or the line that says there was no GPU."""
    if gpu is None or not gpu["available"]:
        return [f"GPU: {NOT_SAMPLED if gpu is None else gpu['reason']} (not judged)."]
    verdict = "flat" if gpu["flat"] else "NOT flat"
    lines = [f"GPU memory (nvidia-smi, at the same quiet moments). Verdict: **{verdict}**.", ""]
    lines += [f"Note: {note}." for note in gpu.get("notes", [])] + ([""] if gpu.get("notes") else [])
    lines += ["| card / process | GPU memory start -> end | change | flat |", "|---|---|---|---|"]
    rows = [(f"card {card['index']} (of {card['total_mib']} MiB)", card) for card in gpu["cards"]]
    rows += [(process["process"], process) for process in gpu["processes"]]
    for name, row in rows:
        change = "-" if row["change"] is None else f"{row['change']:+.1%}"
        lines.append(f"| {name} | {row['start_mib']} MiB -> {row['end_mib']} MiB | {change} | "
                     f"{'yes' if row['flat'] else 'NO'} |")
    return lines
