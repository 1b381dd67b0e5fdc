"""The fused code-predictor attention (cache write + attention over <= 16 tokens in one launch) against the torch
form it replaces, over a whole frame's steps (two tokens at position 0, then one at a time), with grouped heads and
values read from a strided slice as the fused q/k/v projection leaves them: under Triton's interpreter on the CPU,
compiled on CUDA. The start-up check that refuses a kernel that fails on its device is tested too."""

from __future__ import annotations

import pytest
import torch

from tests.triton_interpreter import interpreted


@torch.no_grad()
def compare(device: str, dtype_name: str = "float32") -> dict[str, float]:
    """Largest differences of outputs and caches over a frame's 15 steps (fused vs torch form)."""
    from services.model.fused_small_attention import small_attention, torch_form

    dtype = getattr(torch, dtype_name)
    generator = torch.Generator().manual_seed(5)
    rows, heads, kv_heads, head_dim, max_len = 3, 4, 2, 16, 16
    fused_cache = torch.zeros((2, rows, kv_heads, max_len, head_dim), dtype=dtype, device=device)
    plain_cache = fused_cache.clone()
    worst_out = worst_cache = 0.0
    start, distinct = 0, set()
    for step in range(15):
        num_new = 2 if step == 0 else 1
        q = torch.randn((rows, num_new, heads, head_dim), generator=generator).to(device, dtype)
        k = torch.randn((rows, num_new, kv_heads, head_dim), generator=generator).to(device, dtype)
        wide = torch.randn((rows, num_new, 3 * kv_heads * head_dim), generator=generator).to(device, dtype)
        v = wide[..., kv_heads * head_dim: 2 * kv_heads * head_dim].view(rows, num_new, kv_heads, head_dim)
        got = small_attention(fused_cache, start, q, k, v, head_dim**-0.5)
        want = torch_form(plain_cache, start, q, k, v, head_dim**-0.5)
        worst_out = max(worst_out, float((got.float() - want.float()).abs().max()))
        worst_cache = max(worst_cache, float((fused_cache.float() - plain_cache.float()).abs().max()))
        distinct.add(round(float(want[0, 0, 0, 0]), 4))
        start += num_new
    return {"out": worst_out, "cache": worst_cache, "distinct": float(len(distinct))}


def test_the_fused_predictor_attention_equals_the_torch_form_under_the_interpreter():
    worst = interpreted("tests.test_fused_small_attention.compare('cpu')")
    assert worst["distinct"] > 10, worst  # the outputs move from step to step: a constant would prove nothing
    assert worst["out"] < 1e-5 and worst["cache"] == 0.0, worst


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernel needs a CUDA device")
def test_the_fused_predictor_attention_equals_the_torch_form_on_cuda():
    worst = compare("cuda")
    assert worst["out"] < 1e-5 and worst["cache"] == 0.0, worst
    in_bf16 = compare("cuda", "bfloat16")
    assert in_bf16["out"] < 3e-2 and in_bf16["cache"] == 0.0, in_bf16


def test_the_start_up_check_accepts_the_kernel_under_the_interpreter():
    # The check once compared a step of two tokens after cached ones, where the torch form is not causal: it refused
    # the kernel on every GPU, and the torch form served unseen.
    assert interpreted("tests.test_fused_small_attention.verified_here()") is True


def verified_here() -> bool:
    from services.model import fused_small_attention as module

    return module._verified(torch.device("cpu"), torch.float32, heads=4, kv_heads=2, head_dim=16, max_len=16)


@pytest.mark.parametrize("kernel", ["raises", "differs", "agrees"])
def test_the_start_up_check_refuses_a_kernel_that_fails_on_its_device(monkeypatch, caplog, kernel):
    from services.model import fused_small_attention as module

    monkeypatch.setattr(module, "_refused", set())
    plain = module.torch_form

    def raises(*args):
        raise RuntimeError("no kernel image is available for execution on the device")

    def differs(*args):
        return plain(*args) + 0.5

    monkeypatch.setattr(module, "small_attention", {"raises": raises, "differs": differs, "agrees": plain}[kernel])
    device = torch.device("cpu")  # the check itself is device-agnostic; `check` runs it only where the kernel serves
    served = module._verified(device, torch.float32, heads=4, kv_heads=2, head_dim=16, max_len=16)
    assert served is (kernel == "agrees")
    assert ((str(device), torch.float32) in module._refused) is (kernel != "agrees")
    assert ("the torch form serves" in caplog.text) is (kernel != "agrees")
