"""Which kernels the model may take: the code-path switches, read once from the service's settings at start-up and
handed to the loaders (nothing below reads the environment). The start-up checks' verdicts are `kernel_verdicts`.

Torch-free on purpose: every service's settings (and so `voxmesh health`, a container's healthcheck with a few seconds
to answer) import this; importing torch there costs seconds on a busy machine."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KernelChoices:
    """Which optional kernels may serve on CUDA, where their shape fits (off CUDA the torch forms always serve)."""

    triton_conv: bool = True
    """The vocoder's multi-tap convolutions in the Triton kernel (`kernels.codec.triton_conv`); False: cuDNN's."""
    gated_gemm: bool = True
    """A decode step's MLP gate/up projection and `silu(gate) * up` as one kernel (`kernels.skinny_linear`); False:
    the GEMM, then the fused activation."""
