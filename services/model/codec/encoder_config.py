"""The codec ENCODER's settings: `encoder_config` of `speech_tokenizer/config.json` (a Mimi configuration) and the
top-level encode fields. Defaults are the reference's (Mimi's) defaults, so an omitted field means what it means
there. Only what encoding needs is read; the decoder half is `CodecConfig`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.model.codec.config import CONFIG_FILE, read_config_json
from services.model.codec.errors import CodecConfigError

_INT_FIELDS: dict[str, int] = {
    "audio_channels": 1, "num_filters": 64, "num_residual_layers": 1, "kernel_size": 7, "last_kernel_size": 3,
    "residual_kernel_size": 3, "dilation_growth_rate": 2, "compress": 2, "hidden_size": 512,
    "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 2048,
    "codebook_size": 2048, "codebook_dim": 256, "vector_quantization_hidden_dimension": 256, "num_quantizers": 32,
    "num_semantic_quantizers": 1, "sampling_rate": 24000,
}


@dataclass(frozen=True, slots=True)
class CodecEncoderConfig:
    """What the Mimi-style encoder needs; names follow the config file."""

    audio_channels: int
    num_filters: int
    num_residual_layers: int
    kernel_size: int
    last_kernel_size: int
    residual_kernel_size: int
    dilation_growth_rate: int
    compress: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    codebook_size: int
    codebook_dim: int
    vector_quantization_hidden_dimension: int
    num_quantizers: int
    num_semantic_quantizers: int
    sampling_rate: int
    head_dim: int
    upsampling_ratios: tuple[int, ...]
    frame_rate: float
    norm_eps: float
    rope_theta: float
    attention_bias: bool
    use_conv_shortcut: bool
    valid_num_quantizers: int
    """Codebooks a frame keeps (16: what the talker and decoder use), of the `num_quantizers` the RVQ holds."""
    samples_per_frame: int
    """`encode_downsample_rate`: input samples per code frame (1920 at 24 kHz and 12.5 Hz)."""

    @property
    def seanet_stride(self) -> int:
        return math.prod(self.upsampling_ratios)

    @property
    def downsample_stride(self) -> int:
        """The strided convolution from the SEANet rate (25 Hz) to the code rate (12.5 Hz); 1 when they match."""
        seanet_rate = math.ceil(self.sampling_rate / self.seanet_stride)
        return max(1, round(seanet_rate / self.frame_rate))

    @classmethod
    def from_dir(cls, speech_tokenizer_dir: str | Path) -> CodecEncoderConfig:
        path = Path(speech_tokenizer_dir) / CONFIG_FILE
        return cls.from_dict(read_config_json(path), source=str(path))

    @classmethod
    def from_dict(cls, raw: Any, source: str = CONFIG_FILE) -> CodecEncoderConfig:
        encoder = raw.get("encoder_config") if isinstance(raw, dict) else None
        if not isinstance(encoder, dict):
            raise CodecConfigError("missing_field", f"{source}: encoder_config (an object) is required to encode audio")
        ints = {name: _positive(encoder, name, default, source) for name, default in _INT_FIELDS.items()}
        ratios = encoder.get("upsampling_ratios") or [8, 6, 5, 4]
        if not isinstance(ratios, list) or not all(isinstance(r, int) and r > 0 for r in ratios):
            raise CodecConfigError("invalid_field", f"{source}: encoder_config.upsampling_ratios must list positive ints")
        if encoder.get("use_causal_conv", True) is not True:
            raise CodecConfigError("invalid_field", f"{source}: only causal encoders (use_causal_conv true) are supported")
        if encoder.get("hidden_act", "gelu") != "gelu":
            raise CodecConfigError("invalid_field", f"{source}: encoder_config.hidden_act must be 'gelu'")
        frame_rate = encoder.get("_frame_rate") or encoder.get("frame_rate")
        seanet_rate = math.ceil(ints["sampling_rate"] / math.prod(ratios))
        config = cls(
            **ints,
            head_dim=encoder.get("head_dim") or ints["hidden_size"] // ints["num_attention_heads"],
            upsampling_ratios=tuple(ratios),
            frame_rate=float(frame_rate) if frame_rate else float(seanet_rate),
            norm_eps=float(encoder.get("norm_eps", 1e-5)),
            rope_theta=float(encoder.get("rope_theta", 10000.0)),
            attention_bias=bool(encoder.get("attention_bias", False)),
            use_conv_shortcut=bool(encoder.get("use_conv_shortcut", False)),
            valid_num_quantizers=_positive(raw, "encoder_valid_num_quantizers", 16, source),
            samples_per_frame=_positive(raw, "encode_downsample_rate", 1920, source),
        )
        if not config.num_semantic_quantizers < config.valid_num_quantizers <= config.num_quantizers:
            raise CodecConfigError("inconsistent_config", f"{source}: encoder_valid_num_quantizers must lie in "
                                   f"({config.num_semantic_quantizers}, {config.num_quantizers}]")
        return config


def _positive(raw: dict, name: str, default: int, source: str) -> int:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CodecConfigError("invalid_field", f"{source}: {name} must be a positive integer, got {value!r}")
    return value
