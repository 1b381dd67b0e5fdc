"""What a bus's servers spent during a window: CPU seconds (from /proc) and bytes in and out (from each server's
monitoring endpoint, /varz, which counts clients and routes alike; /routez the routes alone)."""

from __future__ import annotations

import json
import os
import time
import urllib.request

from loadtest.bus.buses import Bus

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def _monitor(url: str | None, path: str) -> dict:
    if url is None or not url.startswith("http://127.0.0.1:"):
        return {}  # loopback only
    with urllib.request.urlopen(f"{url}{path}", timeout=5) as answer:
        return json.load(answer)


def _counters(bus: Bus) -> dict[str, float]:
    cpu = sum(_cpu_seconds(server.pid) for server in bus.servers)
    in_bytes = out_bytes = route_out = 0
    for server in bus.servers:
        varz = _monitor(server.monitor_url, "/varz")
        in_bytes += varz.get("in_bytes", 0)
        out_bytes += varz.get("out_bytes", 0)
        for route in _monitor(server.monitor_url, "/routez").get("routes") or []:
            route_out += route.get("out_bytes", 0)
    return {"cpu_s": cpu, "in_bytes": in_bytes, "out_bytes": out_bytes, "route_out_bytes": route_out}


class ServerUsage:
    """Counters at start() and stop(); stop() returns the rates between (per second, summed over members)."""

    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self._start: dict[str, float] = {}
        self._began = 0.0

    def start(self) -> None:
        self._start, self._began = _counters(self._bus), time.monotonic()

    def stop(self) -> dict[str, float]:
        end, seconds = _counters(self._bus), time.monotonic() - self._began
        rates = {f"{key}_per_s": round((end[key] - self._start[key]) / seconds, 3) for key in end}
        rates["cpu_cores"] = rates.pop("cpu_s_per_s")
        rates["members"] = len(self._bus.servers)
        return rates
