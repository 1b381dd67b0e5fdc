"""The kernels' support module: Triton where it is installed, and the one rule for when the fused kernels run.

Fused kernels serve CUDA tensors; everywhere else the model's plain torch form is the path (the CPU tests check each
kernel against that form under Triton's interpreter, in a process that imported Triton with it on).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU install may lack Triton: the torch forms serve
    triton = tl = None


def compiles_for(device: torch.device) -> bool:
    """Whether the fused kernels serve tensors on `device` (CUDA with Triton)."""
    return triton is not None and device.type == "cuda"


def dot_precision(dtype: torch.dtype) -> str:
    """`tl.dot`'s input precision for operands of `dtype`: float32 stays float32 ("ieee"; Triton's default rounds
    it to TF32 on CUDA), bfloat16 products are exact either way."""
    return "ieee" if dtype == torch.float32 else "tf32"
