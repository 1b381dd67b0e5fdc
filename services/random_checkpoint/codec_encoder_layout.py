"""Tensor names and shapes of the speech tokenizer's encoder half (a Mimi encoder).

Voice cloning runs the encoder (`services/model/codec/encoder.py`) on reference audio, and the
reference warns about every missing tensor, so a complete checkpoint holds it. The layout is
that of a Mimi model without its decoder side: a SEANet encoder, an encoder transformer, a
strided downsampling conv, and a split RVQ (semantic + acoustic).
"""

from __future__ import annotations

import math
from typing import Any

from services.model.codec.errors import CodecConfigError

Shapes = dict[str, tuple[int, ...]]


def encoder_tensor_shapes(encoder_config: dict[str, Any]) -> Shapes:
    """`encoder.*` tensor name -> shape for a Mimi `encoder_config` dict."""
    try:
        shapes: Shapes = {}
        _seanet_encoder(encoder_config, shapes)
        _transformer(encoder_config, shapes)
        _downsample(encoder_config, shapes)
        _quantizer(encoder_config, shapes)
    except (KeyError, TypeError) as exc:
        raise CodecConfigError("invalid_field", f"encoder_config is missing or has a malformed field: {exc}") from exc
    return shapes


def _conv(shapes: Shapes, prefix: str, in_channels: int, out_channels: int, kernel: int, bias: bool = True) -> None:
    shapes[f"{prefix}.conv.weight"] = (out_channels, in_channels, kernel)
    if bias:
        shapes[f"{prefix}.conv.bias"] = (out_channels,)


def _seanet_encoder(cfg: dict[str, Any], shapes: Shapes) -> None:
    """Input conv; per ratio (coarsest last): residual blocks, ELU, strided conv doubling the
    channels; then ELU and the output conv. ELUs hold no tensors but take a layer index."""
    prefix, filters = "encoder.encoder.layers", cfg["num_filters"]
    _conv(shapes, f"{prefix}.0", cfg["audio_channels"], filters, cfg["kernel_size"])
    index, scale = 1, 1
    for ratio in reversed(cfg["upsampling_ratios"]):
        dim = scale * filters
        for _ in range(cfg["num_residual_layers"]):
            hidden = dim // cfg["compress"]
            _conv(shapes, f"{prefix}.{index}.block.1", dim, hidden, cfg["residual_kernel_size"])
            _conv(shapes, f"{prefix}.{index}.block.3", hidden, dim, 1)
            if cfg["use_conv_shortcut"]:
                _conv(shapes, f"{prefix}.{index}.shortcut", dim, dim, 1)
            index += 1
        _conv(shapes, f"{prefix}.{index + 1}", dim, dim * 2, ratio * 2)
        index += 2
        scale *= 2
    _conv(shapes, f"{prefix}.{index + 1}", scale * filters, cfg["hidden_size"], cfg["last_kernel_size"])


def _transformer(cfg: dict[str, Any], shapes: Shapes) -> None:
    hidden, heads, kv_heads = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    projections = {"q_proj": (heads * head_dim, hidden), "k_proj": (kv_heads * head_dim, hidden),
                   "v_proj": (kv_heads * head_dim, hidden), "o_proj": (hidden, heads * head_dim)}
    for layer in range(cfg["num_hidden_layers"]):
        prefix = f"encoder.encoder_transformer.layers.{layer}"
        for name, shape in projections.items():
            shapes[f"{prefix}.self_attn.{name}.weight"] = shape
            if cfg.get("attention_bias", False):
                shapes[f"{prefix}.self_attn.{name}.bias"] = (shape[0],)
        shapes[f"{prefix}.mlp.fc1.weight"] = (cfg["intermediate_size"], hidden)
        shapes[f"{prefix}.mlp.fc2.weight"] = (hidden, cfg["intermediate_size"])
        for norm in ("input_layernorm", "post_attention_layernorm"):
            shapes[f"{prefix}.{norm}.weight"] = (hidden,)
            shapes[f"{prefix}.{norm}.bias"] = (hidden,)
        shapes[f"{prefix}.self_attn_layer_scale.scale"] = (hidden,)
        shapes[f"{prefix}.mlp_layer_scale.scale"] = (hidden,)


def _downsample(cfg: dict[str, Any], shapes: Shapes) -> None:
    """Present when the SEANet frame rate differs from the codec's (25 Hz -> 12.5 Hz)."""
    seanet_rate = math.ceil(cfg["sampling_rate"] / math.prod(cfg["upsampling_ratios"]))
    frame_rate = cfg.get("_frame_rate") or cfg["frame_rate"]
    if frame_rate != seanet_rate:
        kernel = 2 * int(seanet_rate / frame_rate)
        _conv(shapes, "encoder.downsample", cfg["hidden_size"], cfg["hidden_size"], kernel, bias=False)


def _quantizer(cfg: dict[str, Any], shapes: Shapes) -> None:
    hidden, vq_dim = cfg["hidden_size"], cfg["vector_quantization_hidden_dimension"]
    semantic = cfg["num_semantic_quantizers"]
    groups = {"semantic_residual_vector_quantizer": semantic,
              "acoustic_residual_vector_quantizer": cfg["num_quantizers"] - semantic}
    for group, count in groups.items():
        prefix = f"encoder.quantizer.{group}"
        for layer in range(count):
            shapes[f"{prefix}.layers.{layer}.codebook.initialized"] = (1,)
            shapes[f"{prefix}.layers.{layer}.codebook.cluster_usage"] = (cfg["codebook_size"],)
            shapes[f"{prefix}.layers.{layer}.codebook.embed_sum"] = (cfg["codebook_size"], cfg["codebook_dim"])
        if vq_dim != hidden:
            shapes[f"{prefix}.input_proj.weight"] = (vq_dim, hidden, 1)
            shapes[f"{prefix}.output_proj.weight"] = (hidden, vq_dim, 1)
