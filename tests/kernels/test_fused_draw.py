"""The fused keyed draw (top-k and top-p cuts, keyed Gumbel noise, argmax, greedy rows) draws what the torch form of
`sampling.sample` draws, row for row: under Triton's interpreter on the CPU, compiled on CUDA."""

from __future__ import annotations

import pytest
import torch

from services.model import sampling
from tests.support.triton_interpreter import interpreted

VOCAB = 300
FRAMES_ON_CUDA = 12
FRAMES_INTERPRETED = 6
"""Frames drawn per case under the interpreter (each new logits and keys; each launch costs a tenth of a second
there): still more than 100 distinct draws over the cases, every row kind drawn in every codebook."""
CODEBOOKS = (0, 4, 15)


def _rows(device: str, top_k: list[int], top_p: list[float], temperature: list[float],
          frames: list[int]) -> sampling.RowSampling:
    params = [sampling.SamplingParams(temperature=t, top_k=k, top_p=p) for k, p, t in zip(top_k, top_p, temperature)]
    return sampling.RowSampling.build(params, [7, -3, 2**40, 11, 0, 5][: len(params)], frames, device)


def _columns(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """Each [B] tensor as the middle column of a [B, 3] table whose other columns hold other values."""
    columns = []
    for tensor in tensors:
        table = torch.stack((tensor + 1, tensor, tensor * 2 + 3), dim=1)
        assert table[:, 1].stride(0) == 3
        columns.append(table[:, 1])
    return columns


@torch.no_grad()
def compare(device: str, frames: int = FRAMES_ON_CUDA, columns_every_call: bool = True) -> dict[str, int]:
    """How many of a few hundred draws the fused kernel and the torch form agree on, how many were drawn, and how
    many of them read their per-row inputs as columns of wider tables (every call also in that form, or one call a
    frame, in turn over the codebooks)."""
    from services.kernels.fused_draw import draw

    generator = torch.Generator().manual_seed(11)
    agreed = drawn = from_columns = 0
    cases = (
        # top_k per row (0: the whole vocabulary), top_p, temperature (0: greedy)
        ([50, 5, 50, 1, 50, 20], [1.0, 1.0, 0.9, 1.0, 0.5, 0.99], [0.9, 1.3, 0.7, 0.9, 1.0, 0.0]),
        ([0, 50, 0, 7, 0, 3], [0.8, 1.0, 1.0, 0.95, 0.3, 1.0], [1.0, 0.9, 0.0, 2.0, 0.6, 0.8]),
    )
    seen = set()
    for top_k, top_p, temperature in cases:
        for frame in range(frames):
            rows = _rows(device, top_k, top_p, temperature, [frame] * len(top_k))
            logits = (3 * torch.randn(len(top_k), VOCAB, generator=generator)).to(device)
            for codebook in CODEBOOKS:
                expected = sampling.sample(logits.cpu(), _rows("cpu", top_k, top_p, temperature, [frame] * 6),
                                           codebook)
                greedy = logits.argmax(dim=1)
                scaled = logits / torch.where(rows.temperature > 0, rows.temperature, 1.0)[:, None]
                values, ids = sampling._top(scaled, rows)
                forms = [(rows.top_k, rows.top_p, rows.temperature, greedy)]
                if columns_every_call or codebook == CODEBOOKS[frame % len(CODEBOOKS)]:
                    # As the sampling graphs pass them: columns of wider static tables (a kernel that ignored a
                    # column's stride would misread every row of any call in this form).
                    forms.append((*_columns(rows.top_k, rows.top_p, rows.temperature), _columns(greedy)[0]))
                for top_k_in, top_p_in, temperature_in, greedy_in in forms:
                    got = draw(values, ids, top_k_in, top_p_in, rows.keys, sampling._codebook_salts(codebook),
                               temperature_in, greedy_in, VOCAB, rows.uses_top_p).cpu()
                    agreed += int((got == expected).sum())
                    drawn += len(top_k)
                from_columns += len(top_k) * (len(forms) - 1)
                seen.update(zip(range(len(top_k)), expected.tolist()))
    return {"agreed": agreed, "drawn": drawn, "distinct": len(seen), "from_columns": from_columns}


def test_the_fused_draw_agrees_with_the_torch_form_under_the_interpreter():
    result = interpreted(f"tests.kernels.test_fused_draw.compare('cpu', {FRAMES_INTERPRETED}, False)")
    assert result["from_columns"] == 2 * FRAMES_INTERPRETED * 6, result
    assert result["drawn"] == 2 * FRAMES_INTERPRETED * (len(CODEBOOKS) + 1) * 6 and result["distinct"] > 100, result
    assert result["agreed"] == result["drawn"], result


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernel needs a CUDA device")
def test_the_fused_draw_agrees_with_the_torch_form_on_cuda():
    result = compare("cuda")
    assert result["agreed"] == result["drawn"] and result["distinct"] > 100, result
