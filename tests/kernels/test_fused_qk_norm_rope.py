"""The one-launch q/k norm + RoPE kernel (`fused_qk_norm_rope.py`) against what it replaces: two `norm_rope` launches
(bit for bit) and, in store mode, `write_kv` (the whole pool compared); and the attention layer through it against the
layer as it was.

The kernels run under Triton's interpreter on the CPU, which is chosen when Triton is imported, so each check runs in
a fresh process with TRITON_INTERPRET=1 (`interpreted`); on a CUDA device the compiled kernel is checked the same way,
bit for bit. Inputs are random and every head, weight and slot distinct, so a wrong head, slot, position or a k/v swap
changes the compared bits.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.triton_interpreter import interpreted

# (q heads, kv heads, head dim, the projection's leading shape, positions): talker-shaped steps (one position per
# token, up to 4000) and a code-predictor-shaped one (3 rows of the 2 tokens at positions 0 and 1).
CASES = [
    (4, 2, 16, (6,), [0, 1, 7, 300, 2048, 4000]),
    (4, 2, 32, (6,), [5, 4000, 3, 2, 1, 0]),
    (4, 2, 32, (3, 2), [0, 1]),
]
DTYPES = (torch.float32, torch.bfloat16)


def _inputs(case: tuple, dtype: torch.dtype, generator: torch.Generator, device: str) -> dict:
    """A projection output qkv, distinct q and k norms, positions in a strided column, the inverse frequencies."""
    from services.model.layers import Rope

    num_heads, num_kv_heads, head_dim, lead, positions = case
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = (2 * torch.randn((*lead, width), generator=generator)).to(device, dtype)
    norms = tuple((torch.randn(head_dim, generator=generator).to(device, dtype), eps) for eps in (1e-6, 1e-5))
    column = torch.tensor(positions)
    positions = _column(torch.stack([column, -column], dim=1), device)
    return dict(qkv=qkv, q_norm=norms[0], k_norm=norms[1], positions=positions,
                inv_freq=Rope(head_dim, 1_000_000.0).inv_freq(torch.device(device)), num_heads=num_heads,
                head_dim=head_dim)


def _column(pairs: torch.Tensor, device: str) -> torch.Tensor:
    """The first column of [N, 2] on `device`: strided, as the engine's step metadata keeps positions and slots."""
    return pairs.to(device)[:, 0]


def _two_launches(inputs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q and k as the layer made them before (one `norm_rope` each), and v: the kernel's oracle."""
    from services.kernels.fused_norm_rope import norm_rope

    qkv, num_heads, head_dim = inputs["qkv"], inputs["num_heads"], inputs["head_dim"]
    q_width = num_heads * head_dim
    kv_width = (qkv.shape[-1] - q_width) // 2
    q, k, v = (part.view(*qkv.shape[:-1], -1, head_dim) for part in qkv.split([q_width, kv_width, kv_width], -1))
    rotated = [norm_rope(x, weight, eps, inputs["positions"], inputs["inv_freq"])
               for x, (weight, eps) in ((q, inputs["q_norm"]), (k, inputs["k_norm"]))]
    return rotated[0], rotated[1], v


@torch.no_grad()
def compare_plain(device: str) -> list[str]:
    """The cases where plain mode's q or k differ from `norm_rope`'s by any bit (empty: none)."""
    from services.kernels.fused_qk_norm_rope import qk_norm_rope

    generator = torch.Generator().manual_seed(11)
    failures = []
    for case, dtype in ((case, dtype) for case in CASES for dtype in DTYPES):
        inputs = _inputs(case, dtype, generator, device)
        expected_q, expected_k, _ = _two_launches(inputs)
        q, k = qk_norm_rope(**inputs)
        if not (torch.equal(q, expected_q) and torch.equal(k, expected_k)):
            failures.append(f"{case} {dtype}")
    return failures


@torch.no_grad()
def compare_store(device: str) -> list[str]:
    """The cases where store mode's pool differs from `write_kv`'s anywhere, or its q from `norm_rope`'s (empty: none).
    The pool is random, so a write to a wrong place shows; the talker's [T, width] rows only."""
    from services.kernels.fused_qk_norm_rope import KvDestination, qk_norm_rope_into_pool
    from services.model.paged_attention import write_kv

    generator = torch.Generator().manual_seed(12)
    failures = []
    talker_cases = [case for case in CASES if len(case[3]) == 1]
    pool_dtypes = [(dtype, dtype) for dtype in DTYPES] + [(torch.bfloat16, torch.float32)]
    for case, (dtype, pool_dtype) in ((case, dtypes) for case in talker_cases for dtypes in pool_dtypes):
        inputs = _inputs(case, dtype, generator, device)
        expected_q, expected_k, v = _two_launches(inputs)
        num_kv_heads, head_dim, tokens = case[1], case[2], case[3][0]
        pool = torch.randn((5, 3, 2, 4, num_kv_heads, head_dim), generator=generator).to(device, pool_dtype)
        slots = torch.randperm(5 * 4, generator=generator)[:tokens]
        slot_column = _column(torch.stack([slots, slots + 1], dim=1), device)
        expected_pool = pool.clone()
        write_kv(expected_pool, 1, slot_column, expected_k, v)
        got_pool = pool.clone()
        q = qk_norm_rope_into_pool(**inputs, destination=KvDestination(got_pool, 1, slot_column))
        if torch.equal(expected_pool, pool):
            raise AssertionError("write_kv changed nothing: the comparison would prove nothing")
        if not (torch.equal(got_pool, expected_pool) and torch.equal(q, expected_q)):
            failures.append(f"{case} {dtype} pool {pool_dtype}")
    return failures


def test_plain_mode_equals_two_norm_rope_launches_bit_for_bit():
    assert interpreted("tests.kernels.test_fused_qk_norm_rope.compare_plain('cpu')") == []


def test_store_mode_writes_the_pool_as_write_kv_does_and_nothing_else():
    assert interpreted("tests.kernels.test_fused_qk_norm_rope.compare_store('cpu')") == []


def _attention(dtype: torch.dtype, generator: torch.Generator, device: str):
    """A fused-projection attention layer (4 q heads, 2 kv heads of 16) with random weights, norms included."""
    from services.model.config import DecoderConfig
    from services.model.layers import SelfAttention

    cfg = DecoderConfig(hidden_size=64, intermediate_size=96, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16,
                        rms_norm_eps=1e-6, rope_theta=10000.0, attention_bias=False, hidden_act="silu")
    attention = SelfAttention(cfg)
    for parameter in attention.parameters():
        parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
    attention = attention.to(device, dtype)
    attention.fuse_projections()  # after `to`: the fused weight is no parameter that `to` converts
    return attention


def _forward_before(attention, x: torch.Tensor, rope, layer: int, attend) -> torch.Tensor:
    """`SelfAttention.forward` as it was before the fused kernel: one `norm_and_rotate` for q, one for k."""
    from torch.nn import functional as F

    from services.model.layers import norm_and_rotate

    heads = (*x.shape[:-1], -1, attention.head_dim)
    q, k, v = F.linear(x, *attention.qkv).split(attention.widths, dim=-1)
    q = norm_and_rotate(attention.q_norm, q.view(heads), rope)
    k = norm_and_rotate(attention.k_norm, k.view(heads), rope)
    return attention.o_proj(attend(layer, q, k, v.view(heads)).reshape(*x.shape[:-1], -1))


def _decode_step(generator: torch.Generator, device: str):
    """A decode-only batch of 6 sequences (lengths ending mid-block and on a block edge) over a random pool of 3
    layers and blocks of 4; positions and slots in strided columns."""
    from services.model.attention_batch import AttentionBatch

    lengths, block_size = torch.tensor([1, 5, 9, 16, 13, 4]), 4
    tables = torch.randperm(24, generator=generator).view(6, 4)
    last = lengths - 1
    slots = tables[torch.arange(6), last // block_size] * block_size + last % block_size
    metadata = torch.stack([last, slots], dim=1).to(device)
    batch = AttentionBatch(positions=metadata[:, 0], slot_mapping=metadata[:, 1],
                           query_start=torch.arange(7, device=device), seq_lens=lengths.to(device),
                           block_tables=tables.to(device))
    return batch, torch.randn((24, 3, 2, block_size, 2, 16), generator=generator).to(device)


def _recording(kernel_name: str, pool: torch.Tensor, batch):
    """A `PagedAttention` that counts the layers handing it k and v (the unfused write)."""
    from services.model import paged_attention

    class Recording(paged_attention.PagedAttention):
        calls_with_kv = 0

        def __call__(self, layer, q, k, v):
            self.calls_with_kv += 1
            return super().__call__(layer, q, k, v)

    return Recording(pool, batch, 0.25, getattr(paged_attention, kernel_name))


@torch.no_grad()
def compare_layer(device: str) -> dict[str, object]:
    """The attention layer through the fused kernel against the layer before it, on the talker's paged pool (the
    Triton kernel: store mode; the torch kernel: plain mode and `write_kv`) and on a code-predictor-shaped call
    (plain mode), in float32 and bfloat16; and, in float32, against the all-torch path (cos/sin tables)."""
    from services.model.layers import FusedRope, Rope

    generator = torch.Generator().manual_seed(13)
    report: dict[str, object] = {}
    for dtype in DTYPES:
        attention = _attention(dtype, generator, device)
        batch, pool = _decode_step(generator, device)
        pool = pool.to(dtype)
        x = torch.randn((6, 64), generator=generator).to(device, dtype)
        rope = FusedRope(batch.positions, _inv_freq(device))
        stored = None
        for kernel_name in ("FUSED_DECODE", "DECODE"):
            fused, before = _recording(kernel_name, pool.clone(), batch), _recording(kernel_name, pool.clone(), batch)
            got, expected = attention(x, rope, 1, fused), _forward_before(attention, x, rope, 1, before)
            report[f"{kernel_name} {dtype}"] = (torch.equal(got, expected) and torch.equal(fused.pool, before.pool)
                                                and not torch.equal(fused.pool, pool), fused.calls_with_kv)
            stored = got if stored is None else stored
        if dtype == torch.float32:
            plain = _recording("DECODE", pool.clone(), batch)
            expected = attention(x, Rope(16, 10000.0).tables(batch.positions, dtype), 1, plain)
            report["torch path"] = float((stored - expected).abs().max() / expected.abs().max())
        rows = torch.randn((3, 2, 64), generator=generator).to(device, dtype)
        rope = FusedRope(_column(torch.arange(2)[:, None].repeat(1, 2), device), _inv_freq(device))
        report[f"predictor {dtype}"] = torch.equal(attention(rows, rope, 0, _causal),
                                                   _forward_before(attention, rows, rope, 0, _causal))
    return report


def _inv_freq(device: str) -> torch.Tensor:
    """The layer's RoPE frequencies (head dim 16, theta 10000)."""
    from services.model.layers import Rope

    return Rope(16, 10000.0).inv_freq(torch.device(device))


def _causal(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Dense causal attention of rows [B, n, H, D] over their own tokens, as the code predictor's first step."""
    from torch.nn import functional as F

    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                         enable_gqa=True)
    return out.transpose(1, 2)


def test_the_layer_through_the_fused_kernel_computes_what_it_did_before():
    _check_layer(interpreted("tests.kernels.test_fused_qk_norm_rope.compare_layer('cpu')"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernel needs a CUDA device")
def test_the_compiled_kernel_equals_what_it_replaces_bit_for_bit_on_cuda():
    assert compare_plain("cuda") == [] and compare_store("cuda") == []
    _check_layer(compare_layer("cuda"))


def _check_layer(report: dict[str, object]) -> None:
    for dtype in DTYPES:
        # The Triton attention kernel: k and v written by the fused kernel (no call with k and v); the torch kernel:
        # plain mode, then its own write. Output and pool equal the layer's before, and the pool did change.
        assert report[f"FUSED_DECODE {dtype}"] == (True, 0), report
        assert report[f"DECODE {dtype}"] == (True, 1), report
        assert report[f"predictor {dtype}"] is True, report
    assert report["torch path"] < 1e-5, report


@pytest.mark.parametrize("kernel_name", ["REFERENCE", "DECODE", "TOKEN", "FUSED_DECODE"])
def test_only_a_triton_attention_kernel_lets_the_fused_kernel_write_the_pool(kernel_name):
    from services.model.attention_batch import AttentionBatch
    from services.kernels.fused_qk_norm_rope import KvDestination

    lengths = torch.tensor([3, 5])
    batch = AttentionBatch(positions=lengths - 1, slot_mapping=torch.tensor([2, 12]), query_start=torch.arange(3),
                           seq_lens=lengths, block_tables=torch.tensor([[0, 1], [2, 3]]), token_rows=torch.arange(2),
                           token_limits=lengths)
    attend = _recording(kernel_name, torch.zeros((4, 2, 2, 4, 2, 16)), batch)
    destination = attend.kv_destination(1)
    if kernel_name == "FUSED_DECODE":  # Triton wherever it runs (on the CPU, only when forced, as here)
        assert isinstance(destination, KvDestination) and destination.layer == 1
        assert destination.pool is attend.pool and destination.slot_mapping is batch.slot_mapping
    else:  # torch kernels, TOKEN included: on the CPU it runs the torch form
        assert destination is None
