"""Settings of the prefill service: the engine's limits (as decode's: the same engine runs the prompts) and how long
a prompt's KV waits for its decode replica."""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.decode.settings import DecodeSettings
from services.runtime.settings_schema import SettingsError, setting


@dataclass(frozen=True, slots=True)
class PrefillSettings(DecodeSettings):
    """Flags and environment of `voxmesh serve prefill`. The engine knobs mean what they mean for decode; its KV pool
    holds only prompts being prefilled, so it can be far smaller than decode's."""

    handoff_ttl_s: float = setting(
        30.0, "seconds a prefilled prompt's KV is kept for its decode replica to fetch; past it the decode replica "
              "prefills the prompt itself (the hand-off carries everything needed)")

    def __post_init__(self) -> None:
        DecodeSettings.__post_init__(self)
        if not (math.isfinite(self.handoff_ttl_s) and self.handoff_ttl_s > 0):
            raise SettingsError(f"--handoff-ttl-s: must be a finite number > 0, got {self.handoff_ttl_s}")
