"""The fused row keys equal `sampling.row_keys` to the bit: under Triton's interpreter on the CPU, compiled on CUDA."""

from __future__ import annotations

import pytest
import torch

from services.model import sampling
from tests.support.triton_interpreter import interpreted

SEEDS = [0, 1, -1, 7, -3, 2**40, 2**63 - 1, -(2**63), 0x9E3779B9, -0x85EBCA6B]


@torch.no_grad()
def compare(device: str) -> dict[str, int]:
    """How many rows' keys the kernel and the torch form agree on, over seeds of every sign and size and frames up to
    past 2**32, with the inputs as strided columns of a wider table (as the sampling graph passes them)."""
    from services.kernels.fused_row_keys import row_keys

    generator = torch.Generator().manual_seed(5)
    random_seeds = torch.randint(-(2**62), 2**62, (150,), generator=generator, dtype=torch.int64) * 2
    seeds = torch.cat((torch.tensor(SEEDS, dtype=torch.int64), random_seeds))
    frames = torch.randint(0, 5000, (seeds.shape[0],), generator=generator, dtype=torch.int64)
    frames[:3] = torch.tensor([0, 2**32 - 1, 2**32 + 5])
    expected = sampling.row_keys(seeds, frames)
    table = torch.stack((frames, seeds, frames * 3, seeds), dim=1).to(device)
    got = row_keys(table[:, 1], table[:, 0]).cpu()
    # Written into two columns of a wider table, as the sampler stages them (here a transposed one: the lanes a row
    # apart), the other columns untouched.
    wide = torch.full((5, seeds.shape[0]), -7, dtype=torch.int64, device=device).T
    row_keys(table[:, 1], table[:, 0], out=wide[:, 2:4])
    wide = wide.cpu()
    in_place = int((wide[:, 2:4] == expected).all(dim=1).sum()) if bool((wide[:, [0, 1, 4]] == -7).all()) else -1
    empty = row_keys(table[:0, 1], table[:0, 0])
    return {"rows": int(seeds.shape[0]), "agreed": int((got == expected).all(dim=1).sum()), "in_place": in_place,
            "distinct": len(set(map(tuple, expected.tolist()))), "empty": tuple(empty.shape)}


def test_the_fused_row_keys_equal_the_torch_form_under_the_interpreter():
    result = interpreted("tests.kernels.test_fused_row_keys.compare('cpu')")
    assert result["distinct"] == result["rows"] == 160 and result["empty"] == (0, 2), result
    assert result["agreed"] == result["in_place"] == result["rows"], result


def test_without_a_compiler_the_torch_form_serves():
    seeds, frames = torch.tensor([3, -9]), torch.tensor([0, 12])
    row_keys = sampling.row_keys_into  # the model's seam: the kernel where it compiles, the torch form here

    assert torch.equal(row_keys(seeds, frames), sampling.row_keys(seeds, frames))
    out = torch.zeros((2, 3), dtype=torch.int64)
    assert row_keys(seeds, frames, out=out[:, 1:]).data_ptr() == out[:, 1:].data_ptr()
    assert torch.equal(out[:, 1:], sampling.row_keys(seeds, frames)) and not out[:, 0].any()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernel needs a CUDA device")
def test_the_fused_row_keys_equal_the_torch_form_on_cuda():
    result = compare("cuda")
    assert result["agreed"] == result["in_place"] == result["rows"] == result["distinct"], result
