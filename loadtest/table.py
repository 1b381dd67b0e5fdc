"""A short fixed-width table of a bench document, for a terminal."""

from __future__ import annotations

from collections.abc import Sequence


def headline_rows(document: dict) -> Sequence[str]:
    """A short fixed-width table of every level of every target, for stdout."""
    rows = [f"{'target':<10} {'level':<14} {'ok/sent':>8} {'req/s':>7} {'audio/s':>8} {'fp p50':>8} {'fp p95':>8}"
            f" {'contin.':>7} {'goodput/s':>9}"]
    for target in document["targets"]:
        for level in target["levels"]:
            s, spec = level["summary"], level["level"]
            name = f"open {spec['load']:g}/s" if spec["mode"] == "open" else f"closed x{spec['load']:g}"
            fp = s["first_packet_s"]
            rows.append(f"{target['label']:<10} {name:<14} {s['num_completed']:>3}/{s['num_requests']:<4} "
                        f"{s['requests_per_s']:>7.2f} {s['audio_s_per_s']:>8.2f} {_ms(fp['median']):>8} "
                        f"{_ms(fp['p95']):>8} {_share(s['continuous_share']):>7} {s['goodput_per_s']:>9.2f}")
        rows.append(f"{target['label']}: highest open-loop rate sustained (no errors, no gaps, p95 first packet <= "
                    f"{document['config']['p95_first_packet_bound_s'] * 1000:.0f} ms): {target['max_sustained_rate']}")
    return rows


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}ms"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"
