"""A one-line progress bar on stderr per load level, closed by the level's headline figures."""

from __future__ import annotations

import sys
from typing import TextIO

from loadtest.aggregate import LevelSummary
from loadtest.levels import Level
from loadtest.metrics import StreamRecord

_BAR_WIDTH = 20


class Progress:
    """Redraws the current level's line as requests end (on a terminal; elsewhere only the final line per level
    is written, so logs stay readable)."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self._stream = stream
        self._live = bool(getattr(stream, "isatty", lambda: False)())
        self._prefix = ""
        self._total = 0
        self._done = 0
        self._failed = 0

    def start(self, label: str, level: Level) -> None:
        self._prefix = f"[{label}] {level.name}"
        self._total = level.num_requests
        self._done = self._failed = 0
        self._draw()

    def update(self, record: StreamRecord) -> None:
        self._done += 1
        self._failed += record.error is not None
        self._draw()

    def finish(self, summary: LevelSummary) -> None:
        p95 = summary.first_packet_s.p95
        first_packet = "-" if p95 is None else f"{p95 * 1000:.0f} ms"
        continuous = "-" if summary.continuous_share is None else f"{summary.continuous_share:.0%}"
        line = (f"{self._prefix}: {summary.num_completed}/{summary.num_requests} ok, {summary.num_failed} failed, "
                f"{summary.num_not_sent} not sent | {summary.requests_per_s:.2f} req/s, "
                f"{summary.audio_s_per_s:.2f} audio s/s | p95 first packet {first_packet} | continuous {continuous}"
                f" | goodput {summary.goodput_per_s:.2f}/s")
        self._write(line, final=True)

    def note(self, text: str) -> None:
        self._write(text, final=True)

    def _draw(self) -> None:
        if not self._live:
            return
        filled = _BAR_WIDTH * self._done // max(1, self._total)
        bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
        self._write(f"{self._prefix} [{bar}] {self._done}/{self._total} failed {self._failed}", final=False)

    def _write(self, text: str, *, final: bool) -> None:
        if self._live:
            self._stream.write("\r\x1b[2K" + text + ("\n" if final else ""))
        elif final:
            self._stream.write(text + "\n")
        self._stream.flush()
