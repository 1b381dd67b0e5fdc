"""How long a reference recording may be, and the sample rates accepted: one owner for the gateway's early checks
and the model's own. Plain Python (no torch), so the gateway can import it without loading the model stack."""

from __future__ import annotations

from services.model.voice.errors import ReferenceAudioError

MIN_REFERENCE_S = 1.0
"""Shorter audio says too little about a voice (and leaves the speaker encoder only a few mel frames)."""
MAX_REFERENCE_S = 30.0
"""Longer audio costs prefill rows (12.5 per second in in-context mode) without making the clone better."""
MIN_SAMPLE_RATE = 8000
MAX_SAMPLE_RATE = 192000
MODEL_SAMPLE_RATE = 24000
"""The rate the speaker encoder's mel and the codec encoder take (every released checkpoint)."""


def check_reference(num_samples: int, sample_rate: int) -> None:
    """Raise `ReferenceAudioError` for a sample rate or a duration outside the limits above."""
    if not MIN_SAMPLE_RATE <= sample_rate <= MAX_SAMPLE_RATE:
        raise ReferenceAudioError("unsupported_sample_rate", f"reference audio at {sample_rate} Hz: the sample rate "
                                  f"must lie in [{MIN_SAMPLE_RATE}, {MAX_SAMPLE_RATE}] Hz")
    seconds = num_samples / sample_rate
    if seconds < MIN_REFERENCE_S:
        raise ReferenceAudioError("ref_audio_too_short", f"reference audio of {seconds:.2f} s is too short: give at "
                                  f"least {MIN_REFERENCE_S:g} s of the voice (3-10 s clone best)")
    if seconds > MAX_REFERENCE_S:
        raise ReferenceAudioError("ref_audio_too_long", f"reference audio of {seconds:.1f} s is too long: give at "
                                  f"most {MAX_REFERENCE_S:g} s (3-10 s clone best)")
