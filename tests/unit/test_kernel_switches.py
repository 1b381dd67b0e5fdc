"""The kernels' code-path switches are settings: a flag and a variable of the same name, read once at start-up and
handed to the loaders; the defaults are the serving path (both kernels on)."""

from __future__ import annotations

import argparse

from services.model.config import DecoderConfig
from services.model.kernel_choices import KernelChoices
from services.model.layers import MLP, DecoderStack, fuse_projections
from services.runtime.common_settings import CommonSettings
from services.runtime.settings_schema import add_arguments, resolve


def test_by_default_both_kernels_may_serve():
    assert resolve(CommonSettings, environ={}).kernel_choices() == KernelChoices(triton_conv=True, gated_gemm=True)


def test_the_variables_of_the_same_name_switch_them_off():
    settings = resolve(CommonSettings, environ={"VOXMESH_TRITON_CONV": "0", "VOXMESH_GATED_GEMM": "0"})
    assert settings.kernel_choices() == KernelChoices(triton_conv=False, gated_gemm=False)


def test_a_flag_wins_over_the_variable():
    parser = argparse.ArgumentParser()
    add_arguments(parser, CommonSettings)
    args = parser.parse_args(["--gated-gemm", "off"])
    settings = resolve(CommonSettings, args, environ={"VOXMESH_GATED_GEMM": "1"})
    assert settings.kernel_choices() == KernelChoices(triton_conv=True, gated_gemm=False)


def test_the_choice_reaches_every_mlp_the_loader_fuses():
    cfg = DecoderConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16,
                        rms_norm_eps=1e-6, rope_theta=1e4, attention_bias=False, hidden_act="silu")
    for gated in (True, False):
        stack = DecoderStack(cfg)
        fuse_projections(stack, gated)
        mlps = [part for part in stack.modules() if isinstance(part, MLP)]
        assert len(mlps) == 2 and all(mlp.gated_gemm is gated and mlp.gate_up is not None for mlp in mlps)
