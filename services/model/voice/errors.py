"""Typed errors of voice cloning: a reference the model cannot use, each with a machine-readable code."""

from __future__ import annotations

from services.model.errors import ModelError


class ReferenceAudioError(ModelError):
    """Reference audio (or its transcript) that cannot make a voice prompt.

    Codes: `ref_audio_too_short`, `ref_audio_too_long`, `invalid_ref_audio` (empty, non-finite, not one channel),
    `unsupported_sample_rate`, `ref_text_required` (in-context cloning without a transcript).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> tuple:
        # Raised in the reference-audio process and re-raised in decode: pickled with its code.
        return type(self), (self.code, str(self))
