"""Checkpoint presets for `voxmesh model init`: config.json dicts in the released Qwen3-TTS format.

`0.6b` and `1.7b` have the released sizes (MODEL.md), special ids, languages and speakers; `tiny`
keeps every id of the releases (so prompts look the same) with layers small enough to run a
sentence on one CPU core in well under a second. `preset_config(name, tts_model_type)` returns a
fresh dict for one checkpoint type; `generation_config(name)` its generation_config.json.
"""

from __future__ import annotations

import copy
from types import MappingProxyType
from typing import Any

from services.model.text_tokenizer import IM_END, IM_START, TTS_BOS, TTS_EOS, TTS_PAD
from services.random_checkpoint.tokenizer_writer import special_token_ids

TTS_MODEL_TYPES = ("custom_voice", "voice_design", "base")
RELEASED_NUM_REGULAR_TEXT_TOKENS = 151643  # Qwen2's byte-level BPE; the added tokens follow
# config.json records the transformers that wrote it; the reference's tokenizer loading depends on it.
TRANSFORMERS_VERSION = "4.57.3"

# Codec ids of the releases: special tokens, languages, speakers (all inside [vocab - 1024, vocab)).
CODEC_SPECIAL_IDS = MappingProxyType({
    "codec_pad_id": 2148, "codec_bos_id": 2149, "codec_eos_token_id": 2150, "codec_think_id": 2154,
    "codec_nothink_id": 2155, "codec_think_bos_id": 2156, "codec_think_eos_id": 2157,
})
RELEASED_LANGUAGES = MappingProxyType({
    "chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071, "spanish": 2054,
    "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069, "beijing_dialect": 2074,
    "sichuan_dialect": 2062,
})
RELEASED_SPEAKERS = MappingProxyType({
    "vivian": 3065, "serena": 3066, "uncle_fu": 3010, "dylan": 2878, "eric": 2875, "ryan": 3061,
    "aiden": 2861, "ono_anna": 2873, "sohee": 2864,
})
RELEASED_DIALECTS = MappingProxyType({"dylan": "beijing_dialect", "eric": "sichuan_dialect"})

TINY_SPEAKERS = ("ryan", "vivian", "eric")  # eric speaks a dialect
TINY_LANGUAGES = ("english", "chinese", "japanese", "sichuan_dialect")
TINY_NUM_REGULAR_TEXT_TOKENS = 960


class PresetError(ValueError):
    """An unknown preset or checkpoint type; `code` is machine-readable."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def _decoder(hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int, ffn: int,
             max_positions: int = 32768) -> dict[str, Any]:
    return {
        "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "intermediate_size": ffn, "hidden_act": "silu",
        "rms_norm_eps": 1e-06, "rope_theta": 1000000, "attention_bias": False, "attention_dropout": 0.0,
        "max_position_embeddings": max_positions, "use_sliding_window": False, "sliding_window": None,
    }


def _talker(decoder: dict, predictor: dict, mrope_section: list[int], text_vocab: int, text_hidden: int,
            speakers: dict[str, int], languages: dict[str, int]) -> dict[str, Any]:
    return {
        "model_type": "qwen3_tts_talker",
        **decoder,
        # The talker's multimodal RoPE (its three position streams are equal for TTS).
        "rope_scaling": {"rope_type": "default", "mrope_section": mrope_section, "interleaved": True},
        "vocab_size": 3072, "num_code_groups": 16, "text_vocab_size": text_vocab, "text_hidden_size": text_hidden,
        "position_id_per_seconds": 13,
        **CODEC_SPECIAL_IDS,
        "codec_language_id": dict(languages),
        "spk_id": dict(speakers),
        "spk_is_dialect": {name: RELEASED_DIALECTS.get(name, False) for name in speakers},
        "code_predictor_config": {
            "model_type": "qwen3_tts_talker_code_predictor", **predictor,
            "rope_scaling": None, "vocab_size": 2048, "num_code_groups": 16,
        },
    }


def _speaker_encoder(enc_dim: int, channels: list[int], attention: int, scale: int, se: int) -> dict[str, Any]:
    # No model_type here: the reference's speaker-encoder config takes no extra keys.
    return {
        "mel_dim": 128, "enc_dim": enc_dim, "enc_channels": channels, "enc_kernel_sizes": [5, 3, 3, 3, 1],
        "enc_dilations": [1, 2, 3, 4, 1], "enc_attention_channels": attention, "enc_res2net_scale": scale,
        "enc_se_channels": se, "sample_rate": 24000,
    }


def _top(size: str, talker: dict, speaker_encoder: dict, num_regular_text_tokens: int) -> dict[str, Any]:
    ids = special_token_ids(num_regular_text_tokens)
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": size,
        "tts_model_type": "custom_voice",
        "im_start_token_id": ids[IM_START], "im_end_token_id": ids[IM_END],
        "tts_pad_token_id": ids[TTS_PAD], "tts_bos_token_id": ids[TTS_BOS], "tts_eos_token_id": ids[TTS_EOS],
        "talker_config": talker,
        "speaker_encoder_config": speaker_encoder,
        "transformers_version": TRANSFORMERS_VERSION,
    }


def _released(size: str, hidden: int, ffn: int) -> dict[str, Any]:
    talker = _talker(
        _decoder(hidden, 28, 16, 8, 128, ffn), _decoder(1024, 5, 16, 8, 128, 3072, 65536), [24, 20, 20],
        text_vocab=151936, text_hidden=2048, speakers=dict(RELEASED_SPEAKERS), languages=dict(RELEASED_LANGUAGES),
    )
    encoder = _speaker_encoder(hidden, [512, 512, 512, 512, 1536], 128, 8, 128)
    return _top(size, talker, encoder, RELEASED_NUM_REGULAR_TEXT_TOKENS)


def _tiny() -> dict[str, Any]:
    # The code predictor is narrower than the talker (as in 1.7b), so small_to_mtp_projection exists.
    talker = _talker(
        _decoder(64, 2, 4, 2, 16, 128), _decoder(48, 2, 4, 2, 16, 96, 65536), [4, 2, 2],
        text_vocab=1024, text_hidden=64,
        speakers={name: RELEASED_SPEAKERS[name] for name in TINY_SPEAKERS},
        languages={name: RELEASED_LANGUAGES[name] for name in TINY_LANGUAGES},
    )
    encoder = _speaker_encoder(64, [32, 32, 32, 32, 96], 16, 4, 16)
    return _top("tiny", talker, encoder, TINY_NUM_REGULAR_TEXT_TOKENS)


PRESETS: MappingProxyType[str, dict[str, Any]] = MappingProxyType({
    "tiny": _tiny(),
    "0.6b": _released("0b6", hidden=1024, ffn=3072),
    "1.7b": _released("1b7", hidden=2048, ffn=8192),
})

_MAX_NEW_TOKENS = MappingProxyType({"tiny": 256, "0.6b": 8192, "1.7b": 8192})


def preset_config(preset: str, tts_model_type: str = "custom_voice") -> dict[str, Any]:
    """A fresh config.json dict of `preset` for one checkpoint type (speakers only in custom_voice)."""
    _check_preset(preset)
    if tts_model_type not in TTS_MODEL_TYPES:
        raise PresetError(
            f"unknown checkpoint type {tts_model_type!r} (known: {', '.join(TTS_MODEL_TYPES)})", "unknown_model_type"
        )
    config = copy.deepcopy(PRESETS[preset])
    config["tts_model_type"] = tts_model_type
    if tts_model_type != "custom_voice":
        config["talker_config"]["spk_id"] = {}
        config["talker_config"]["spk_is_dialect"] = {}
    return config


def generation_config(preset: str) -> dict[str, Any]:
    """generation_config.json: the reference's sampling defaults, talker and code predictor alike."""
    _check_preset(preset)
    return {
        "do_sample": True, "top_k": 50, "top_p": 1.0, "temperature": 0.9, "repetition_penalty": 1.05,
        "subtalker_dosample": True, "subtalker_top_k": 50, "subtalker_top_p": 1.0, "subtalker_temperature": 0.9,
        "max_new_tokens": _MAX_NEW_TOKENS[preset],
    }


def num_regular_text_tokens(config: dict[str, Any]) -> int:
    """The regular (BPE) vocabulary size that puts the added tokens where `config` says they are."""
    return config["im_start_token_id"] - special_token_ids(0)[IM_START]


def _check_preset(preset: str) -> None:
    if preset not in PRESETS:
        raise PresetError(f"unknown preset {preset!r} (known: {', '.join(PRESETS)})", "unknown_preset")
