"""`silu(gate) * up` of the MLP as one Triton kernel on CUDA, reading the fused gate/up projection's output.

With the gate and up projections fused into one GEMM (`layers.MLP.fuse_projections`), the activation and the
product are the two launches left between it and the down projection, in every layer of every step (the code
predictor runs 75 a frame). One launch reads each row once. Numerics as torch's: the activation in float32,
rounded to the model dtype, then the product in float32, rounded. Off CUDA the torch form serves; the CPU tests
check this kernel under Triton's interpreter.
"""

from __future__ import annotations

import torch

from services.kernels.triton_support import tl, triton

BLOCK = 1024
"""Columns a program handles: rows are split across programs along their width as well."""

if triton is not None:

    @triton.jit
    def _silu_mul_kernel(gate_up_ptr, out_ptr, stride_in, stride_out, width, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < width
        dtype = out_ptr.dtype.element_ty
        gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=inside, other=0.0).to(tl.float32)
        up = tl.load(gate_up_ptr + row * stride_in + width + cols, mask=inside, other=0.0).to(tl.float32)
        activated = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        tl.store(out_ptr + row * stride_out + cols, (activated * up).to(dtype), mask=inside)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` for gate_up [..., 2I] holding gate in its first I columns and up in the rest -> [..., I]."""
    width = gate_up.shape[-1] // 2
    rows = gate_up.reshape(-1, 2 * width)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty((rows.shape[0], width), dtype=gate_up.dtype, device=gate_up.device)
    _silu_mul_kernel[(rows.shape[0], triton.cdiv(width, BLOCK))](rows, out, rows.stride(0), out.stride(0), width,
                                                                 BLOCK=BLOCK)
    return out.view(*gate_up.shape[:-1], width)
