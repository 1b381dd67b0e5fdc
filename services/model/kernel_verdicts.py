"""The verdicts of the model's start-up kernel checks, kept by the model: a kernel that failed on the device is not
taken, and the torch form serves."""

from __future__ import annotations

from dataclasses import dataclass

from services.kernels import fused_sample


@dataclass(frozen=True, slots=True)
class KernelVerdicts:
    """What the start-up checks on the model's device decided (`load_model` runs them on CUDA): a kernel that failed
    there is not taken, and the torch form serves. The default, nothing checked, takes neither."""

    whole_row_sampler: bool = False
    """`kernels.fused_sample` draws rows without top-p (`sampling_check.check`)."""
    small_attention: bool = False
    """`kernels.fused_small_attention` serves the code predictor's attention (`small_attention.check`)."""

    def samples_whole_rows(self, vocab_size: int) -> bool:
        """Whether `sampling.sample` draws rows of `vocab_size` logits without top-p in the whole-row kernel."""
        return self.whole_row_sampler and fused_sample.covers(vocab_size)
