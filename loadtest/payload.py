"""The request message the bench sends for a prompt: voice, language, seed and the length mode."""

from __future__ import annotations

from dataclasses import dataclass


class PayloadError(ValueError):
    """Request settings that cannot work (a non-positive frame count)."""

    code = "invalid_request_shape"


@dataclass(frozen=True, slots=True)
class RequestShape:
    """Everything in a request except the text.

    Attributes:
        voice: speaker name; None leaves it out (voice_design and base checkpoints have none).
        language: "auto" or a language of the checkpoint.
        model: the model name; None asks for the gateway's served model.
        fixed_frames: fixed-length mode: `ignore_eos` with `max_new_tokens` = this many codec frames (12.5 per
            second of audio), so random-weight checkpoints, which rarely emit EOS, make requests of known length.
        initial_chunk_frames: frames in the first chunk; None uses the mesh's default.
        temperature: talker sampling temperature; None uses the checkpoint's default.
        seed: request i gets seed + i, so reruns make the same audio.
    """

    voice: str | None = "ryan"
    language: str = "auto"
    model: str | None = None
    fixed_frames: int | None = None
    initial_chunk_frames: int | None = None
    temperature: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("fixed_frames", "initial_chunk_frames"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise PayloadError(f"{name} must be a positive number of frames, got {value}")

    @property
    def length_mode(self) -> str:
        """`fixed` (ignore_eos + max_new_tokens) or `natural` (until the model's EOS)."""
        return "natural" if self.fixed_frames is None else "fixed"

    def describe_length(self) -> str:
        if self.fixed_frames is None:
            return "natural length (until EOS)"
        return f"fixed length: ignore_eos, max_new_tokens={self.fixed_frames} frames"

    def payload(self, text: str, index: int) -> dict:
        """The JSON message for request `index` saying `text`."""
        body: dict = {"input": text, "language": self.language, "seed": self.seed + index}
        optional = {"voice": self.voice, "model": self.model, "initial_chunk_frames": self.initial_chunk_frames,
                    "temperature": self.temperature}
        body.update({key: value for key, value in optional.items() if value is not None})
        if self.fixed_frames is not None:
            body.update(ignore_eos=True, max_new_tokens=self.fixed_frames)
        return body

    def to_dict(self) -> dict:
        return {"voice": self.voice, "language": self.language, "model": self.model,
                "length_mode": self.length_mode, "length": self.describe_length(), "fixed_frames": self.fixed_frames,
                "initial_chunk_frames": self.initial_chunk_frames, "temperature": self.temperature,
                "seed": self.seed}
