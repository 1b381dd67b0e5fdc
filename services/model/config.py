"""The checkpoint's `config.json` and `generation_config.json`, parsed into typed, validated configs.

Field names follow the released files (MODEL.md). Sizes and special ids are required; only values with a
well-known default (norm epsilon, RoPE base, activation) may be absent. Every error names the file and
the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.model.errors import CheckpointError

MODEL_TYPES = ("base", "custom_voice", "voice_design")
ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh", "relu")
_MISSING = object()


class _Fields:
    """Typed reads from one JSON object, with errors that name the file and the dotted field."""

    def __init__(self, data: Any, file: Path, prefix: str = "") -> None:
        if not isinstance(data, dict):
            raise CheckpointError(file, f"{prefix or 'top level'} must be a JSON object")
        self.data, self.file, self.prefix = data, file, prefix

    def fail(self, name: str, message: str) -> CheckpointError:
        return CheckpointError(self.file, f"field {self.prefix}{name}: {message}")

    def get(self, name: str, kind: type | tuple[type, ...], default: Any = _MISSING) -> Any:
        value = self.data.get(name, _MISSING)
        if value is _MISSING or value is None:
            if default is _MISSING:
                raise self.fail(name, "missing")
            return default
        ok = isinstance(value, kind) and not (isinstance(value, bool) and kind in (int, float, (int, float)))
        if not ok:
            raise self.fail(name, f"expected {getattr(kind, '__name__', kind)}, got {value!r}")
        return value

    def positive(self, name: str, default: Any = _MISSING) -> int:
        value = self.get(name, int, default)
        if value <= 0:
            raise self.fail(name, f"must be positive, got {value}")
        return value

    def number(self, name: str, default: Any = _MISSING) -> float:
        return float(self.get(name, (int, float), default))

    def sub(self, name: str) -> _Fields:
        return _Fields(self.get(name, dict), self.file, f"{self.prefix}{name}.")


@dataclass(frozen=True, slots=True)
class DecoderConfig:
    """One Qwen3-style decoder stack (the talker's or the code predictor's)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    attention_bias: bool
    hidden_act: str


@dataclass(frozen=True, slots=True)
class CodePredictorConfig:
    decoder: DecoderConfig
    vocab_size: int
    """Entries per codebook (2048 in the releases)."""
    num_code_groups: int


@dataclass(frozen=True, slots=True)
class TalkerConfig:
    decoder: DecoderConfig
    code_predictor: CodePredictorConfig
    vocab_size: int
    text_vocab_size: int
    text_hidden_size: int
    num_code_groups: int
    codec_eos_id: int
    codec_pad_id: int
    codec_bos_id: int
    codec_think_id: int
    codec_nothink_id: int
    codec_think_bos_id: int
    codec_think_eos_id: int
    speaker_ids: dict[str, int]
    """Lower-cased speaker name -> codec id of the speaker's embedding row."""
    speaker_dialects: dict[str, str]
    """Lower-cased speaker name -> the dialect language it speaks, for dialect speakers only."""
    language_ids: dict[str, int]
    """Lower-cased language (dialects included) -> codec id."""


@dataclass(frozen=True, slots=True)
class SpeakerEncoderConfig:
    """ECAPA-TDNN speaker encoder of base checkpoints (voice cloning)."""

    mel_dim: int
    enc_dim: int
    enc_channels: tuple[int, ...]
    enc_kernel_sizes: tuple[int, ...]
    enc_dilations: tuple[int, ...]
    enc_attention_channels: int
    enc_res2net_scale: int
    enc_se_channels: int
    sample_rate: int


@dataclass(frozen=True, slots=True)
class TTSConfig:
    talker: TalkerConfig
    speaker_encoder: SpeakerEncoderConfig | None
    """Present for base checkpoints only."""
    tts_model_type: str
    tts_model_size: str | None
    im_start_id: int
    im_end_id: int
    tts_pad_id: int
    tts_bos_id: int
    tts_eos_id: int

    @property
    def languages(self) -> list[str]:
        """Languages a request may name: "auto" and every non-dialect language id."""
        return ["auto"] + [name for name in self.talker.language_ids if "dialect" not in name]


@dataclass(frozen=True, slots=True)
class GenerationDefaults:
    """Sampling values from `generation_config.json`, falling back to the reference's defaults."""

    do_sample: bool = True
    top_k: int = 50
    top_p: float = 1.0
    temperature: float = 0.9
    repetition_penalty: float = 1.05
    subtalker_dosample: bool = True
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    subtalker_temperature: float = 0.9
    max_new_tokens: int = 2048


def read_json(path: Path) -> Any:
    if not path.is_file():
        raise CheckpointError(path, "file is missing")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(path, f"not valid JSON: {exc}") from exc


def _decoder(f: _Fields) -> DecoderConfig:
    if f.get("use_sliding_window", bool, False):
        raise f.fail("use_sliding_window", "sliding-window attention is not supported")
    layer_types = f.get("layer_types", list, [])
    if any(kind != "full_attention" for kind in layer_types):
        raise f.fail("layer_types", "only full_attention layers are supported")
    rope = f.get("rope_scaling", dict, {})
    # The multimodal RoPE of the talker reduces to plain RoPE (all three position streams are equal).
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise f.fail("rope_scaling.rope_type", f"only 'default' RoPE is supported, got {rope!r}")
    hidden, heads, kv_heads = f.positive("hidden_size"), f.positive("num_attention_heads"), f.positive("num_key_value_heads")
    if heads % kv_heads:
        raise f.fail("num_key_value_heads", f"{kv_heads} does not divide num_attention_heads {heads}")
    act = f.get("hidden_act", str, "silu")
    if act not in ACTIVATIONS:
        raise f.fail("hidden_act", f"unsupported activation {act!r} (supported: {', '.join(ACTIVATIONS)})")
    return DecoderConfig(
        hidden_size=hidden,
        intermediate_size=f.positive("intermediate_size"),
        num_layers=f.positive("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=f.positive("head_dim", hidden // heads),
        rms_norm_eps=f.number("rms_norm_eps", 1e-6),
        rope_theta=f.number("rope_theta", 10000.0),
        attention_bias=f.get("attention_bias", bool, False),
        hidden_act=act,
    )


def _code_id(f: _Fields, name: str, vocab: int, value: Any = _MISSING) -> int:
    value = f.get(name, int) if value is _MISSING else value
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < vocab:
        raise f.fail(name, f"{value!r} is not an id of the codec vocabulary [0, {vocab})")
    return value


def _id_table(f: _Fields, name: str, vocab: int) -> dict[str, int]:
    table = f.get(name, dict, {})
    return {key.lower(): _code_id(f, f"{name}.{key}", vocab, value) for key, value in table.items()}


def _talker(f: _Fields) -> TalkerConfig:
    decoder = _decoder(f)
    cp = f.sub("code_predictor_config")
    groups = f.positive("num_code_groups")
    predictor = CodePredictorConfig(_decoder(cp), cp.positive("vocab_size"), cp.positive("num_code_groups", groups))
    if predictor.num_code_groups != groups or groups < 2:
        raise cp.fail("num_code_groups", f"{predictor.num_code_groups} must equal the talker's {groups} (at least 2)")
    vocab = f.positive("vocab_size")
    if vocab <= 1024 or vocab - 1024 < predictor.vocab_size:
        raise f.fail("vocab_size", f"{vocab} leaves no room for {predictor.vocab_size} codes below the 1024 special ids")
    languages = _id_table(f, "codec_language_id", vocab)
    dialects = {}
    for speaker, dialect in f.get("spk_is_dialect", dict, {}).items():
        if dialect is False or dialect is None:
            continue
        if not isinstance(dialect, str) or dialect.lower() not in languages:
            raise f.fail(f"spk_is_dialect.{speaker}", f"{dialect!r} is not a language of codec_language_id")
        dialects[speaker.lower()] = dialect.lower()
    ids = {name: _code_id(f, name, vocab) for name in (
        "codec_eos_token_id", "codec_pad_id", "codec_bos_id", "codec_think_id", "codec_nothink_id",
        "codec_think_bos_id", "codec_think_eos_id")}
    return TalkerConfig(
        decoder=decoder, code_predictor=predictor, vocab_size=vocab,
        text_vocab_size=f.positive("text_vocab_size"), text_hidden_size=f.positive("text_hidden_size"),
        num_code_groups=groups, codec_eos_id=ids["codec_eos_token_id"], codec_pad_id=ids["codec_pad_id"],
        codec_bos_id=ids["codec_bos_id"], codec_think_id=ids["codec_think_id"], codec_nothink_id=ids["codec_nothink_id"],
        codec_think_bos_id=ids["codec_think_bos_id"], codec_think_eos_id=ids["codec_think_eos_id"],
        speaker_ids=_id_table(f, "spk_id", vocab), speaker_dialects=dialects, language_ids=languages,
    )


def _speaker_encoder(f: _Fields) -> SpeakerEncoderConfig:
    lists = {name: tuple(f.get(name, list)) for name in ("enc_channels", "enc_kernel_sizes", "enc_dilations")}
    if len({len(v) for v in lists.values()}) != 1 or len(lists["enc_channels"]) < 3:
        raise f.fail("enc_channels", "enc_channels, enc_kernel_sizes and enc_dilations need one equal length >= 3")
    return SpeakerEncoderConfig(
        mel_dim=f.positive("mel_dim", 128), enc_dim=f.positive("enc_dim"), **lists,
        enc_attention_channels=f.positive("enc_attention_channels", 128),
        enc_res2net_scale=f.positive("enc_res2net_scale", 8), enc_se_channels=f.positive("enc_se_channels", 128),
        sample_rate=f.positive("sample_rate", 24000),
    )


def parse_config(data: Any, file: Path) -> TTSConfig:
    """Validate a `config.json` object; `file` is named in every error."""
    f = _Fields(data, file)
    model_type = f.get("tts_model_type", str)
    if model_type not in MODEL_TYPES:
        raise f.fail("tts_model_type", f"{model_type!r} is not one of {', '.join(MODEL_TYPES)}")
    talker = _talker(f.sub("talker_config"))
    text_ids = {name: f.get(name, int) for name in (
        "im_start_token_id", "im_end_token_id", "tts_pad_token_id", "tts_bos_token_id", "tts_eos_token_id")}
    for name, value in text_ids.items():
        if not 0 <= value < talker.text_vocab_size:
            raise f.fail(name, f"{value} is outside the text vocabulary [0, {talker.text_vocab_size})")
    encoder = _speaker_encoder(f.sub("speaker_encoder_config")) if model_type == "base" else None
    if encoder is not None and encoder.enc_dim != talker.decoder.hidden_size:
        raise f.fail("speaker_encoder_config.enc_dim", f"{encoder.enc_dim} must equal the talker width {talker.decoder.hidden_size}")
    return TTSConfig(
        talker=talker, speaker_encoder=encoder, tts_model_type=model_type,
        tts_model_size=f.get("tts_model_size", str, None),
        im_start_id=text_ids["im_start_token_id"], im_end_id=text_ids["im_end_token_id"],
        tts_pad_id=text_ids["tts_pad_token_id"], tts_bos_id=text_ids["tts_bos_token_id"],
        tts_eos_id=text_ids["tts_eos_token_id"],
    )


def parse_generation_config(data: Any, file: Path) -> GenerationDefaults:
    """Read the sampling defaults the reference reads; other keys (e.g. transformers' own) are ignored."""
    f = _Fields(data, file)
    defaults = GenerationDefaults()
    known: dict[str, Any] = {"max_new_tokens": f.positive("max_new_tokens", defaults.max_new_tokens)}
    for name in ("do_sample", "subtalker_dosample"):
        known[name] = f.get(name, bool, getattr(defaults, name))
    for name in ("top_k", "subtalker_top_k"):
        known[name] = f.get(name, int, getattr(defaults, name))
    for name in ("top_p", "temperature", "repetition_penalty", "subtalker_top_p", "subtalker_temperature"):
        known[name] = f.number(name, getattr(defaults, name))
    return GenerationDefaults(**known)


def load_config(directory: Path) -> tuple[TTSConfig, GenerationDefaults]:
    """Both JSON files of a checkpoint directory."""
    config = parse_config(read_json(directory / "config.json"), directory / "config.json")
    generation_file = directory / "generation_config.json"
    return config, parse_generation_config(read_json(generation_file), generation_file)
