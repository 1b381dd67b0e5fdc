"""The start-up check of the whole-row sampler (`kernels.fused_sample`) against `sampling.sample`'s torch form."""

from __future__ import annotations

import logging

import torch

from services.kernels import fused_sample
from services.model import sampling

log = logging.getLogger(__name__)


def check(device: torch.device, vocab_sizes: tuple[int, ...]) -> bool:
    """Draw with the kernel and with the torch form on `device` (at load time, before any graph is captured): bf16
    logits with ties at the cut, mixed top_k and temperatures, greedy rows; on an error or a single different token,
    False (said in the log): the torch form serves there. Returns the verdict, for the caller to keep."""
    generator = torch.Generator().manual_seed(5)
    params = [sampling.SamplingParams(temperature=t, top_k=k, top_p=1.0)
              for t, k in ((0.9, 50), (0.0, 50), (1.3, 5), (0.7, 0), (0.9, 1), (0.5, 100))]
    try:
        for vocab_size in vocab_sizes:
            rows = sampling.RowSampling.build(params, list(range(len(params))), [3] * len(params), device)
            logits = (4 * torch.randn((len(params), vocab_size), generator=generator)).to(torch.bfloat16)
            for codebook in (0, 9):
                got = fused_sample.sample(logits.to(device), rows.temperature, rows.top_k, rows.keys,
                                          sampling._codebook_salts(codebook)).cpu()
                cpu_rows = sampling.RowSampling.build(params, list(range(len(params))), [3] * len(params))
                want = sampling.sample(logits, cpu_rows, codebook)  # the torch form (the CPU never takes the kernel)
                if not torch.equal(got, want):
                    log.warning("the fused sampler drew %s where the torch form drew %s on %s; the torch form "
                                "serves", got.tolist(), want.tolist(), device)
                    return False
    except Exception:  # noqa: BLE001 - a kernel that cannot run here must not take the replica down
        log.exception("the fused sampler failed its start-up check on %s; the torch form serves", device)
        return False
    return True
