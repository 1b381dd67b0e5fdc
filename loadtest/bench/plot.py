"""The bench's PNG: throughput and first-packet latency against load, one column per load mode."""

from __future__ import annotations

from pathlib import Path

from loadtest.bench.workload import MODES


class PlotError(RuntimeError):
    """matplotlib is missing (it comes with the `bench` extra)."""

    code = "plot_unavailable"


def load_pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotError("the plot needs matplotlib: pip install 'voxmesh[bench]' (or pass --no-plot)") from exc
    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as pyplot

    return pyplot


def _series(target: dict, mode: str, read) -> tuple[list[float], list[float | None]]:
    levels = [level for level in target["levels"] if level["level"]["mode"] == mode]
    return [level["level"]["load"] for level in levels], [read(level["summary"]) for level in levels]


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1000.0


def write_plot(document: dict, path: str | Path) -> Path:
    """Draw `document` (the bench's JSON) into a PNG at `path`."""
    pyplot = load_pyplot()
    modes = [mode for mode in MODES if any(level["level"]["mode"] == mode
                                           for target in document["targets"] for level in target["levels"])]
    figure, axes = pyplot.subplots(2, len(modes), figsize=(6 * len(modes), 8), squeeze=False)
    for column, mode in enumerate(modes):
        throughput, latency = axes[0][column], axes[1][column]
        for target in document["targets"]:
            label = target["label"]
            loads, audio = _series(target, mode, lambda s: s["audio_s_per_s"])
            _, goodput = _series(target, mode, lambda s: s["goodput_per_s"])
            _, requests = _series(target, mode, lambda s: s["requests_per_s"])
            throughput.plot(loads, audio, marker="o", label=f"{label}: audio s/s")
            throughput.plot(loads, requests, marker="s", linestyle="--", label=f"{label}: requests/s")
            throughput.plot(loads, goodput, marker="^", linestyle=":", label=f"{label}: goodput/s")
            for stat, style in (("median", "-"), ("p95", "--")):
                _, values = _series(target, mode, lambda s, stat=stat: _ms(s["first_packet_s"][stat]))
                latency.plot(loads, values, marker="o", linestyle=style, label=f"{label}: first packet {stat}")
        unit = "offered arrival rate (requests/s)" if mode == "open" else "concurrent clients"
        throughput.set(title=f"{mode} loop: throughput", xlabel=unit, ylabel="per second")
        latency.set(title=f"{mode} loop: first packet", xlabel=unit, ylabel="ms")
        latency.axhline(document["config"]["slo"]["first_packet_s"] * 1000.0, color="grey", linewidth=0.8,
                        label="SLO first packet")
        loads = [level["level"]["load"] for target in document["targets"] for level in target["levels"]
                 if level["level"]["mode"] == mode]
        for axis in (throughput, latency):
            if max(loads) >= 8 * min(loads):  # sweeps like 1 8 32 64 read better on a log axis
                axis.set_xscale("log", base=2)
            axis.set_xticks(sorted(set(loads)), [f"{load:g}" for load in sorted(set(loads))])
            axis.minorticks_off()
            axis.set_ylim(bottom=0)
            axis.grid(True, alpha=0.3)
            axis.legend(fontsize="small")
    meta = document["meta"]
    public = document.get("public_method") or {}
    transports = ", ".join(sorted(set((public.get("transports") or {}).values()))) or "websocket"
    figure.suptitle(f"voxmesh bench ({transports}), {document['config']['request']['length']} | {meta['date']} | "
                    f"commit {(meta['commit'] or 'unknown')[:10]} | {meta['machine']['hostname']}", fontsize="small")
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    return path
