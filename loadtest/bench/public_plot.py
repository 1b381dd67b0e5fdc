"""p95 audible first audio against the offered rate: voxmesh's runs of the public method beside the public figures.

    python -m loadtest.bench.public_plot RUN.json [RUN.json ...] --out first_audio_vs_rate.png

Each RUN.json is a `voxmesh bench --transport http --mode open` document (with `--trials`, the median of the
trials); its open levels give one line, labelled from `--label` (one per run) or the document's commit. The public
figures are the ones issue 41 quotes from the public open-loop comparison of Qwen3-TTS servers (one H100 SXM, the 1.7B
CustomVoice model, Seed-TTS English prompts, three seeds, a fresh server per trial): each project's p95 audible first
audio at the rates it reports.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from loadtest.bench.plot import load_pyplot


@dataclass(frozen=True, slots=True)
class PublicSeries:
    """One server's p95 audible first audio (ms) at the rates (requests/s) the public comparison reports."""

    project: str
    points: tuple[tuple[float, float], ...]


PUBLIC_FIGURES = (
    PublicSeries("Nari's server", ((1.0, 26.5), (10.0, 34.0), (20.0, 77.0))),
    PublicSeries("vLLM-Omni", ((1.0, 57.0), (10.0, 136.0), (20.0, 397.0))),
    PublicSeries("SGLang-Omni", ((1.0, 121.0),)),
)
"""As issue 41 quotes them (the highest rate each project reports; SGLang-Omni sustains about 12 requests/s)."""

BOUND_MS = 50.0
"""Issue 41's bound on p95 audible first audio for a rate to count as sustained."""


def open_levels(document: dict) -> list[tuple[float, float]]:
    """(offered rate, p95 audible first audio in ms) of every open level of the document's first target."""
    target = document["targets"][0]
    points = []
    for level in target["levels"]:
        if level["level"]["mode"] != "open":
            continue
        audible = level["summary"].get("first_audible_s") or {}
        if audible.get("p95") is not None:
            points.append((float(level["level"]["load"]), audible["p95"] * 1000.0))
    return sorted(points)


def run_label(document: dict) -> str:
    meta = document.get("meta") or {}
    return f"voxmesh {str(meta.get('commit') or '')[:7]}".strip()


def write_public_plot(runs: list[tuple[str, dict]], path: str | Path) -> Path:
    """Draw each (label, document)'s open levels and the public figures into a PNG at `path`."""
    pyplot = load_pyplot()
    figure, axes = pyplot.subplots(figsize=(7.5, 4.8))
    for label, document in runs:
        points = open_levels(document)
        if not points:
            raise ValueError(f"{label}: the document has no open level with audible first audio (run the bench "
                             "with --transport http --mode open)")
        axes.plot(*zip(*points), marker="o", linewidth=2, label=label)
    for series in PUBLIC_FIGURES:
        axes.plot(*zip(*series.points), marker="s", linestyle="--", label=f"{series.project} (public figures)")
    axes.axhline(BOUND_MS, color="grey", linewidth=1, linestyle=":", label=f"{BOUND_MS:.0f} ms bound")
    axes.set_yscale("log")
    axes.set_xlabel("offered rate (requests/s, open loop, Poisson)")
    axes.set_ylabel("p95 audible first audio (ms)")
    axes.set_title("1.7B on one H100: p95 first audio against rate")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    out = Path(path)
    figure.savefig(out, dpi=120)
    pyplot.close(figure)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench.public_plot", description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="bench JSON documents (open levels, HTTP transport)")
    parser.add_argument("--label", action="append", default=[], help="one line's label, in the order of the runs")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    if args.label and len(args.label) != len(args.runs):
        parser.error(f"{len(args.label)} labels for {len(args.runs)} runs: give one per run, or none")
    documents = [json.loads(path.read_text()) for path in args.runs]
    labels = args.label or [run_label(document) for document in documents]
    print(f"wrote {write_public_plot(list(zip(labels, documents)), args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
