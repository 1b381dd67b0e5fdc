"""`python -m loadtest.soak [--duration-s 600] [--warmup-s 60]`: the soak (see the package docstring). Writes
loadtest/results/soak_<label>_<date>.json and .md; the mesh's state and log and the bench's own JSON stay in a work
directory the JSON names. Exits 1 when something is not flat."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import shlex
import sys
import tempfile
from pathlib import Path

from loadtest.soak.flatness import markdown
from loadtest.soak.soak_run import REPO, SoakConfig, soak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=600.0, help="seconds of load between the samples (600)")
    parser.add_argument("--warmup-s", type=float, default=60.0, help="seconds of load before the first sample (60)")
    parser.add_argument("--concurrency", type=int, default=4, help="closed-loop clients (4)")
    parser.add_argument("--fixed-frames", type=int, default=48, help="frames per request (48)")
    parser.add_argument("--out-dir", type=Path, default=REPO / "loadtest" / "results", help="loadtest/results")
    parser.add_argument("--label", default="cpu", help="names the outputs (cpu)")
    args = parser.parse_args(argv)
    config = SoakConfig(duration_s=args.duration_s, warmup_s=args.warmup_s, concurrency=args.concurrency,
                        fixed_frames=args.fixed_frames, work_dir=Path(tempfile.mkdtemp(prefix="voxmesh-soak-")))
    command = shlex.join(["python", "-m", "loadtest.soak", *(sys.argv[1:] if argv is None else argv)])
    document = asyncio.run(soak(config, command))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / f"soak_{args.label}_{datetime.date.today().isoformat()}"
    stem.with_suffix(".json").write_text(json.dumps(document, indent=1) + "\n")
    table = markdown(document)
    stem.with_suffix(".md").write_text(table)
    print(table)
    print(f"wrote {stem}.json, {stem}.md", file=sys.stderr)
    return 0 if document["flat"] else 1


if __name__ == "__main__":
    sys.exit(main())
