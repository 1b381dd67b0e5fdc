"""Fused projections (q/k/v in one GEMM, gate/up in one GEMM) compute what the separate ones do, and leave the
parameters, their names and values, as they were (on CUDA the loader fuses them; here they are fused by hand)."""

from __future__ import annotations

import torch

from services.model.layers import MLP, SelfAttention, fuse_projections
from services.model.loader import load_model


def test_a_fused_model_computes_the_same_hidden_states_and_keeps_its_parameters(tiny_checkpoint) -> None:
    model = load_model(tiny_checkpoint)
    fused = load_model(tiny_checkpoint)
    fuse_projections(fused.talker)
    fuse_projections(fused.code_predictor)
    parts = [m for m in fused.talker.modules() if isinstance(m, (SelfAttention, MLP))]
    assert parts and all(p.qkv is not None if isinstance(p, SelfAttention) else p.gate_up is not None for p in parts)
    before, after = model.talker.state_dict(), fused.talker.state_dict()
    assert list(before) == list(after) and all(torch.equal(before[name], after[name]) for name in before)
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(5, 3, model.code_predictor.cfg.decoder.hidden_size, generator=generator)
    positions = torch.arange(3)

    def attend(layer, q, k, v):  # plain causal attention over the call's own tokens
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(q.shape[2] // k.shape[2], dim=2))
        mask = torch.ones(3, 3, dtype=torch.bool).tril()
        weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        return torch.einsum("bhqk,bkhd->bqhd", weights, v.repeat_interleave(q.shape[2] // v.shape[2], dim=2))

    with torch.no_grad():
        expected = model.code_predictor.model(hidden, positions, attend)
        got = fused.code_predictor.model(hidden, positions, attend)
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5), (got - expected).abs().max()
    assert not torch.equal(expected[:, 0], expected[:, 1]), "a degenerate input proves nothing"
