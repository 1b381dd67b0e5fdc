"""Tables from py-spy's raw folded stacks (`py-spy record --threads --idle -f raw`), one process a file.

For each thread: its share of the samples, then the frames where it spends them, both as the innermost frame
("self": what the thread was doing) and anywhere on the stack ("inclusive": what it was doing it for). With
`--idle` the samples include waits, so a thread's rows add up to its whole wall time, not its CPU time: a step
thread that waits on the device shows it as `synchronize`.

    python3 -m loadtest.gpu.pyspy_summary profile_serve_decode.txt [--top 15] [--thread decode-engine]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict
from pathlib import Path

THREAD = re.compile(r"^thread \((?:0x)?[0-9a-fA-F]+\): ?(?P<name>.*)$")


def parse(text: str) -> dict[str, list[tuple[list[str], int]]]:
    """Thread name -> [(frames outermost first, samples)]. Lines without a thread frame go under '-'."""
    threads: dict[str, list[tuple[list[str], int]]] = defaultdict(list)
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        match = THREAD.match(frames[0])
        name = "-"
        if match:
            name = match["name"] or frames[0]
            frames = frames[1:]
        threads[name].append((frames, int(count)))
    return threads


def _short(frame: str) -> str:
    """'fn (path/to/file.py:12)' -> 'fn (file.py:12)': the table stays narrow, the line still findable."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit('/', 1)[-1]}" if where else name


def summarise(threads: dict[str, list[tuple[list[str], int]]], top: int, only: str | None) -> str:
    total = sum(count for stacks in threads.values() for _, count in stacks)
    lines = [f"{total} samples in {len(threads)} threads"]
    ranked = sorted(threads.items(), key=lambda item: -sum(count for _, count in item[1]))
    for name, stacks in ranked:
        if only and only not in name:
            continue
        samples = sum(count for _, count in stacks)
        lines.append(f"\n## {name}: {samples} samples ({100 * samples / max(total, 1):.1f}% of the process)")
        own: Counter[str] = Counter()
        anywhere: Counter[str] = Counter()
        for frames, count in stacks:
            if frames:
                own[_short(frames[-1])] += count
            for frame in {_short(frame) for frame in frames}:
                anywhere[frame] += count
        lines.append("self:")
        lines += [f"  {100 * count / samples:5.1f}%  {frame}" for frame, count in own.most_common(top)]
        lines.append("inclusive:")
        lines += [f"  {100 * count / samples:5.1f}%  {frame}" for frame, count in anywhere.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", type=Path, help="py-spy raw output (--threads --idle -f raw)")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--thread", help="only threads whose name contains this")
    args = parser.parse_args()
    print(summarise(parse(args.profile.read_text()), args.top, args.thread))


if __name__ == "__main__":
    main()
