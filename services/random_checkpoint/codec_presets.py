"""`speech_tokenizer/config.json` contents for the checkpoint presets.

The 0.6B and 1.7B releases ship one and the same 12 Hz codec, so both presets share the
released shapes. `tiny` keeps everything that other parts of the system rely on (16
codebooks of 2048 entries, 24 kHz, 1920 samples per frame, the layer structure) and shrinks
only the widths and depths, so it decodes in milliseconds on a CPU.
"""

from __future__ import annotations

import copy
from typing import Any

from services.model.codec.config import MODEL_TYPE
from services.model.codec.errors import CodecConfigError

_RELEASED_ENCODER: dict[str, Any] = {
    "_frame_rate": 12.5,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "audio_channels": 1,
    "codebook_dim": 256,
    "codebook_size": 2048,
    "compress": 2,
    "dilation_growth_rate": 2,
    "head_dim": 64,
    "hidden_act": "gelu",
    "hidden_size": 512,
    "initializer_range": 0.02,
    "intermediate_size": 2048,
    "kernel_size": 7,
    "last_kernel_size": 3,
    "layer_scale_initial_scale": 0.01,
    "max_position_embeddings": 8000,
    "model_type": "mimi",
    "norm_eps": 1e-05,
    "num_attention_heads": 8,
    "num_filters": 64,
    "num_hidden_layers": 8,
    "num_key_value_heads": 8,
    "num_quantizers": 32,
    "num_residual_layers": 1,
    "num_semantic_quantizers": 1,
    "pad_mode": "constant",
    "residual_kernel_size": 3,
    "rope_theta": 10000.0,
    "sampling_rate": 24000,
    "sliding_window": 250,
    "trim_right_ratio": 1.0,
    "upsample_groups": 512,
    "upsampling_ratios": [8, 6, 5, 4],
    "use_cache": False,
    "use_causal_conv": True,
    "use_conv_shortcut": False,
    "use_streaming": False,
    "vector_quantization_hidden_dimension": 256,
}

_RELEASED_DECODER: dict[str, Any] = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "codebook_dim": 512,
    "codebook_size": 2048,
    "decoder_dim": 1536,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 512,
    "intermediate_size": 1024,
    "latent_dim": 1024,
    "layer_scale_initial_scale": 0.01,
    "max_position_embeddings": 8000,
    "num_attention_heads": 16,
    "num_hidden_layers": 8,
    "num_key_value_heads": 16,
    "num_quantizers": 16,
    "num_semantic_quantizers": 1,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000,
    "semantic_codebook_size": 4096,
    "sliding_window": 72,
    "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2],
    "vector_quantization_hidden_dimension": 512,
}

_TINY_ENCODER_CHANGES: dict[str, Any] = {
    "codebook_dim": 16,
    "head_dim": 16,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_filters": 4,
    "num_hidden_layers": 1,
    "num_key_value_heads": 2,
    "upsample_groups": 32,
    "vector_quantization_hidden_dimension": 16,
}

_TINY_DECODER_CHANGES: dict[str, Any] = {
    "codebook_dim": 32,
    "decoder_dim": 64,
    "head_dim": 16,
    "hidden_size": 32,
    "intermediate_size": 64,
    "latent_dim": 32,
    "num_attention_heads": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 1,
    "vector_quantization_hidden_dimension": 32,
}


def _speech_tokenizer_config(encoder: dict[str, Any], decoder: dict[str, Any]) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": MODEL_TYPE,
        "encoder_valid_num_quantizers": 16,
        "input_sample_rate": 24000,
        "output_sample_rate": 24000,
        "decode_upsample_rate": 1920,
        "encode_downsample_rate": 1920,
        "encoder_config": encoder,
        "decoder_config": decoder,
    }


CODEC_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": _speech_tokenizer_config(
        {**_RELEASED_ENCODER, **_TINY_ENCODER_CHANGES}, {**_RELEASED_DECODER, **_TINY_DECODER_CHANGES}
    ),
    "0.6b": _speech_tokenizer_config(_RELEASED_ENCODER, _RELEASED_DECODER),
    "1.7b": _speech_tokenizer_config(_RELEASED_ENCODER, _RELEASED_DECODER),
}

PREPROCESSOR_CONFIG: dict[str, Any] = {
    "chunk_length_s": None,
    "feature_extractor_type": "EncodecFeatureExtractor",
    "feature_size": 1,
    "overlap": None,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": 24000,
}
"""`preprocessor_config.json`: the reference loads a feature extractor beside the model."""


def codec_preset(name: str) -> dict[str, Any]:
    """A fresh copy of a preset's `config.json` dict (tiny, 0.6b or 1.7b)."""
    if name not in CODEC_PRESETS:
        raise CodecConfigError("unknown_preset", f"unknown codec preset {name!r}; choose one of {sorted(CODEC_PRESETS)}")
    return copy.deepcopy(CODEC_PRESETS[name])
