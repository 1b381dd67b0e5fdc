"""`speech_tokenizer/config.json` of a Qwen3-TTS-12Hz checkpoint, parsed and validated.

Only the decoder half (`decoder_config` plus the top-level rates) drives decoding; the
encoder half is kept verbatim so checkpoint writers can round-trip it. Defaults are the
reference's defaults, so a config that omits a field means what it means there.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.model.codec.errors import CodecConfigError

MODEL_TYPE = "qwen3_tts_tokenizer_12hz"
CONFIG_FILE = "config.json"

# decoder_config field -> default (the reference's defaults; codebook_dim has none there).
_DECODER_INT_FIELDS: dict[str, int | None] = {
    "codebook_size": 2048,
    "codebook_dim": None,
    "num_quantizers": 16,
    "latent_dim": 1024,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "intermediate_size": 3072,
    "num_hidden_layers": 8,
    "sliding_window": 72,
    "decoder_dim": 1536,
    "max_position_embeddings": 8000,
}


@dataclass(frozen=True, slots=True)
class CodecConfig:
    """The codec decoder's hyper-parameters (the fields of `decoder_config` plus sample rates)."""

    codebook_size: int
    codebook_dim: int
    num_quantizers: int
    latent_dim: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    num_hidden_layers: int
    sliding_window: int
    decoder_dim: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float
    layer_scale_initial_scale: float
    attention_bias: bool
    upsample_rates: tuple[int, ...]
    upsampling_ratios: tuple[int, ...]
    output_sample_rate: int
    decode_upsample_rate: int

    @property
    def sample_rate(self) -> int:
        """Samples per second of decoded audio (24000 in the releases)."""
        return self.output_sample_rate

    @property
    def samples_per_frame(self) -> int:
        """Samples each frame of 16 codes decodes to (1920 in the releases)."""
        return math.prod(self.upsample_rates + self.upsampling_ratios)

    @property
    def codebook_entry_dim(self) -> int:
        """Width of one codebook row: the reference halves `codebook_dim` inside the RVQ."""
        return self.codebook_dim // 2

    @property
    def num_semantic_quantizers(self) -> int:
        """The reference fixes one semantic codebook (the first); the rest are acoustic."""
        return 1

    @classmethod
    def from_dir(cls, speech_tokenizer_dir: str | Path) -> CodecConfig:
        """Read and validate `<dir>/config.json`; errors name the file and the field."""
        path = Path(speech_tokenizer_dir) / CONFIG_FILE
        return cls.from_dict(read_config_json(path), source=str(path))

    @classmethod
    def from_dict(cls, raw: Any, source: str = CONFIG_FILE) -> CodecConfig:
        """Validate a parsed `config.json` dict; `source` names the file in error messages."""
        fields = _FieldReader(raw, source, prefix="")
        model_type = raw.get("model_type") if isinstance(raw, dict) else None
        if model_type != MODEL_TYPE:
            raise CodecConfigError(
                "unsupported_model_type",
                f"{source}: model_type must be {MODEL_TYPE!r} (the 12 Hz codec), got {model_type!r}",
            )
        decoder = _FieldReader(fields.dict("decoder_config"), source, prefix="decoder_config.")
        ints = {name: decoder.positive_int(name, default) for name, default in _DECODER_INT_FIELDS.items()}
        head_dim = decoder.positive_int("head_dim", ints["hidden_size"] // ints["num_attention_heads"] or None)
        config = cls(
            **ints,
            head_dim=head_dim,
            rope_theta=decoder.positive_float("rope_theta", 10000.0),
            rms_norm_eps=decoder.positive_float("rms_norm_eps", 1e-5),
            layer_scale_initial_scale=decoder.number("layer_scale_initial_scale", 0.01),
            attention_bias=decoder.boolean("attention_bias", False),
            upsample_rates=decoder.int_tuple("upsample_rates", (8, 5, 4, 3)),
            upsampling_ratios=decoder.int_tuple("upsampling_ratios", (2, 2)),
            output_sample_rate=fields.positive_int("output_sample_rate", 24000),
            decode_upsample_rate=fields.positive_int("decode_upsample_rate", 1920),
        )
        decoder.require_equal("hidden_act", "silu")
        _check_consistency(config, source)
        return config


def _check_consistency(config: CodecConfig, source: str) -> None:
    def fail(message: str) -> None:
        raise CodecConfigError("inconsistent_config", f"{source}: {message}")

    if config.codebook_dim % 2:
        fail(f"decoder_config.codebook_dim must be even (the RVQ uses half of it), got {config.codebook_dim}")
    if config.num_quantizers < 2:
        fail(f"decoder_config.num_quantizers must be at least 2 (1 semantic + acoustic), got {config.num_quantizers}")
    if config.num_attention_heads % config.num_key_value_heads:
        fail("decoder_config.num_attention_heads must be a multiple of num_key_value_heads")
    if config.head_dim % 2:
        fail(f"decoder_config.head_dim must be even for rotary embeddings, got {config.head_dim}")
    if config.decoder_dim % 2 ** len(config.upsample_rates):
        fail("decoder_config.decoder_dim must be divisible by 2 ** len(upsample_rates)")
    if config.decode_upsample_rate != config.samples_per_frame:
        fail(
            f"decode_upsample_rate is {config.decode_upsample_rate} but the decoder's rates "
            f"multiply to {config.samples_per_frame} samples per frame"
        )


class _FieldReader:
    """Typed access to one JSON object, raising errors that name the file and dotted field."""

    def __init__(self, raw: Any, source: str, prefix: str) -> None:
        if not isinstance(raw, dict):
            where = prefix.rstrip(".") or "top level"
            raise CodecConfigError("invalid_field", f"{source}: {where} must be a JSON object")
        self.raw, self.source, self.prefix = raw, source, prefix

    def _fail(self, name: str, expected: str, value: Any) -> CodecConfigError:
        return CodecConfigError(
            "invalid_field", f"{self.source}: {self.prefix}{name} must be {expected}, got {value!r}"
        )

    def _get(self, name: str, default: Any) -> Any:
        value = self.raw.get(name, default)
        if value is None:
            raise CodecConfigError("missing_field", f"{self.source}: {self.prefix}{name} is required")
        return value

    def dict(self, name: str) -> dict:
        value = self._get(name, None)
        if not isinstance(value, dict):
            raise self._fail(name, "a JSON object", value)
        return value

    def positive_int(self, name: str, default: int | None) -> int:
        value = self._get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self._fail(name, "a positive integer", value)
        return value

    def number(self, name: str, default: float) -> float:
        value = self._get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._fail(name, "a number", value)
        return float(value)

    def positive_float(self, name: str, default: float) -> float:
        value = self.number(name, default)
        if value <= 0:
            raise self._fail(name, "a positive number", value)
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self._get(name, default)
        if not isinstance(value, bool):
            raise self._fail(name, "true or false", value)
        return value

    def int_tuple(self, name: str, default: tuple[int, ...]) -> tuple[int, ...]:
        value = self._get(name, default)
        valid = isinstance(value, (list, tuple)) and len(value) > 0
        if not valid or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value):
            raise self._fail(name, "a non-empty list of positive integers", value)
        return tuple(value)

    def require_equal(self, name: str, expected: str) -> None:
        value = self.raw.get(name, expected)
        if value != expected:
            raise self._fail(name, f"{expected!r} (the only activation the codec uses)", value)


def read_config_json(path: Path) -> Any:
    """The parsed codec `config.json` at `path` (the decoder's and the encoder's configs both read it)."""
    if not path.is_file():
        raise CodecConfigError("missing_file", f"{path}: codec config not found")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CodecConfigError("invalid_json", f"{path}: cannot read JSON: {exc}") from exc
