"""A ready voice prompt: what a base checkpoint needs to speak in a cloned voice, computed once from reference
audio (`VoiceCloner`) and then reused by any number of requests at no audio cost."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.model.voice.errors import ReferenceAudioError

REF_ROLE_TOKENS = 3
"""`<|im_start|>assistant\\n` before the transcript."""
REF_TAIL_TOKENS = 2
"""`<|im_end|>\\n` after it (no second role: the target text's template follows)."""


def reference_text(transcript: str) -> str:
    """The template a reference transcript is tokenized in; its first 3 and last 2 ids are dropped."""
    return f"<|im_start|>assistant\n{transcript}<|im_end|>\n"


@dataclass(frozen=True, slots=True)
class VoicePrompt:
    """A cloned voice.

    x-vector mode (`ref_codes` None): the speaker row alone conditions the talker. In-context mode: the talker also
    reads the reference's transcript and codec frames and continues from them in the same voice.
    """

    speaker_embedding: torch.Tensor
    """[hidden]: the x-vector, the codec prompt's speaker row."""
    ref_codes: torch.Tensor | None = None
    """[frames, 16] int64: the reference audio as codec frames (in-context mode)."""
    ref_text_ids: tuple[int, ...] | None = None
    """Token ids of the reference's transcript, without its template (in-context mode)."""

    def __post_init__(self) -> None:
        if self.speaker_embedding.dim() != 1:
            raise ReferenceAudioError("invalid_voice_prompt", "the speaker embedding must be one vector")
        if (self.ref_codes is None) != (self.ref_text_ids is None):
            raise ReferenceAudioError("invalid_voice_prompt", "in-context cloning needs both the reference codes and "
                                      "its transcript")
        if self.ref_codes is not None and (self.ref_codes.dim() != 2 or self.ref_codes.shape[0] == 0):
            raise ReferenceAudioError("invalid_voice_prompt", "the reference codes must be [frames >= 1, codebooks]")
        if self.ref_text_ids is not None and not self.ref_text_ids:
            raise ReferenceAudioError("ref_text_required", "the reference transcript tokenizes to nothing")

    @property
    def in_context(self) -> bool:
        return self.ref_codes is not None

    @property
    def num_ref_frames(self) -> int:
        return 0 if self.ref_codes is None else int(self.ref_codes.shape[0])
