"""The tensors of a Qwen3-TTS `model.safetensors`: released names, shapes, and how `model init` fills them.

`plan_tensors(config)` reads a config.json dict and lists every tensor the reference's
`Qwen3TTSForConditionalGeneration` holds for it (speaker encoder included for `base`), with an
initialisation recipe. Nothing is allocated here, so the 0.6b and 1.7b layouts can be checked
without writing gigabytes.

Why the scales: default initialisation (std 0.02) makes every logit nearly equal and the codes
degenerate. Matrices get std `GAIN / sqrt(fan_in)` (0.3 at the tiny width of 64, as MODEL.md
suggests), so logits have a spread of about `GAIN` at every width and sampling stays lively; the
codec-EOS row of `codec_head` is scaled up so that a random model still ends its utterances.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

GAIN = 2.4
EMBEDDING_STD = 0.3
EOS_ROW_GAIN = 1.5  # a random tiny model then ends most sentences within ~10-200 frames


@dataclass(frozen=True, slots=True)
class TensorPlan:
    """One tensor to write: its released name, shape, and recipe (`normal` with `std`, `ones`, `zeros`)."""

    name: str
    shape: tuple[int, ...]
    init: str
    std: float = 0.0
    scaled_row: int | None = None
    """A row whose values are multiplied by `row_gain` after sampling (the codec EOS row)."""
    row_gain: float = 1.0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def _normal(name: str, shape: tuple[int, ...], std: float) -> TensorPlan:
    return TensorPlan(name, shape, "normal", std)


def _linear(name: str, out_features: int, in_features: int) -> TensorPlan:
    return _normal(name, (out_features, in_features), GAIN / math.sqrt(in_features))


def _decoder_layers(prefix: str, cfg: dict[str, Any]) -> list[TensorPlan]:
    hidden, head_dim, ffn = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]
    q_dim, kv_dim = cfg["num_attention_heads"] * head_dim, cfg["num_key_value_heads"] * head_dim
    plans = []
    for layer in range(cfg["num_hidden_layers"]):
        p = f"{prefix}.layers.{layer}"
        plans += [
            _linear(f"{p}.self_attn.q_proj.weight", q_dim, hidden),
            _linear(f"{p}.self_attn.k_proj.weight", kv_dim, hidden),
            _linear(f"{p}.self_attn.v_proj.weight", kv_dim, hidden),
            _linear(f"{p}.self_attn.o_proj.weight", hidden, q_dim),
            TensorPlan(f"{p}.self_attn.q_norm.weight", (head_dim,), "ones"),
            TensorPlan(f"{p}.self_attn.k_norm.weight", (head_dim,), "ones"),
            _linear(f"{p}.mlp.gate_proj.weight", ffn, hidden),
            _linear(f"{p}.mlp.up_proj.weight", ffn, hidden),
            _linear(f"{p}.mlp.down_proj.weight", hidden, ffn),
            TensorPlan(f"{p}.input_layernorm.weight", (hidden,), "ones"),
            TensorPlan(f"{p}.post_attention_layernorm.weight", (hidden,), "ones"),
        ]
        if cfg.get("attention_bias"):
            plans += [TensorPlan(f"{p}.self_attn.{n}_proj.bias", (d,), "zeros")
                      for n, d in (("q", q_dim), ("k", kv_dim), ("v", kv_dim), ("o", hidden))]
    plans.append(TensorPlan(f"{prefix}.norm.weight", (hidden,), "ones"))
    return plans


def _talker(talker: dict[str, Any]) -> list[TensorPlan]:
    hidden, vocab = talker["hidden_size"], talker["vocab_size"]
    text_hidden = talker["text_hidden_size"]
    head = _linear("talker.codec_head.weight", vocab, hidden)
    eos_head = TensorPlan(head.name, head.shape, head.init, head.std, talker["codec_eos_token_id"], EOS_ROW_GAIN)
    return _decoder_layers("talker.model", talker) + [
        _normal("talker.model.codec_embedding.weight", (vocab, hidden), EMBEDDING_STD),
        _normal("talker.model.text_embedding.weight", (talker["text_vocab_size"], text_hidden), EMBEDDING_STD),
        _linear("talker.text_projection.linear_fc1.weight", text_hidden, text_hidden),
        TensorPlan("talker.text_projection.linear_fc1.bias", (text_hidden,), "zeros"),
        _linear("talker.text_projection.linear_fc2.weight", hidden, text_hidden),
        TensorPlan("talker.text_projection.linear_fc2.bias", (hidden,), "zeros"),
        eos_head,
    ]


def _code_predictor(talker: dict[str, Any]) -> list[TensorPlan]:
    cfg = talker["code_predictor_config"]
    width, talker_width, vocab = cfg["hidden_size"], talker["hidden_size"], cfg["vocab_size"]
    prefix = "talker.code_predictor"
    plans = _decoder_layers(f"{prefix}.model", cfg)
    for j in range(cfg["num_code_groups"] - 1):
        # Code embeddings live at the TALKER width: their sum is added to the talker's next input.
        plans.append(_normal(f"{prefix}.model.codec_embedding.{j}.weight", (vocab, talker_width), EMBEDDING_STD))
        plans.append(_linear(f"{prefix}.lm_head.{j}.weight", vocab, width))
    if width != talker_width:
        plans.append(_linear(f"{prefix}.small_to_mtp_projection.weight", width, talker_width))
        plans.append(TensorPlan(f"{prefix}.small_to_mtp_projection.bias", (width,), "zeros"))
    return plans


def _conv(name: str, out_channels: int, in_channels: int, kernel: int) -> list[TensorPlan]:
    fan_in = in_channels * kernel
    return [
        _normal(f"{name}.weight", (out_channels, in_channels, kernel), 1.0 / math.sqrt(fan_in)),
        TensorPlan(f"{name}.bias", (out_channels,), "zeros"),
    ]


def _speaker_encoder(cfg: dict[str, Any]) -> list[TensorPlan]:
    """ECAPA-TDNN: TDNN, SE-Res2Net blocks, multi-layer aggregation, attentive pooling, final conv."""
    channels, kernels, scale = cfg["enc_channels"], cfg["enc_kernel_sizes"], cfg["enc_res2net_scale"]
    se, last = cfg["enc_se_channels"], cfg["enc_channels"][-1]
    p = "speaker_encoder"
    plans = _conv(f"{p}.blocks.0.conv", channels[0], cfg["mel_dim"], kernels[0])
    for i in range(1, len(channels) - 1):
        c_in, c = channels[i - 1], channels[i]
        b = f"{p}.blocks.{i}"
        plans += _conv(f"{b}.tdnn1.conv", c, c_in, 1)
        for k in range(scale - 1):
            plans += _conv(f"{b}.res2net_block.blocks.{k}.conv", c // scale, c // scale, kernels[i])
        plans += _conv(f"{b}.tdnn2.conv", c, c, 1)
        plans += _conv(f"{b}.se_block.conv1", se, c, 1) + _conv(f"{b}.se_block.conv2", c, se, 1)
    plans += _conv(f"{p}.mfa.conv", last, last, kernels[-1])
    plans += _conv(f"{p}.asp.tdnn.conv", cfg["enc_attention_channels"], last * 3, 1)
    plans += _conv(f"{p}.asp.conv", last, cfg["enc_attention_channels"], 1)
    plans += _conv(f"{p}.fc", cfg["enc_dim"], last * 2, 1)
    return plans


def plan_tensors(config: dict[str, Any]) -> list[TensorPlan]:
    """Every tensor of `model.safetensors` for this config.json dict, sorted by name."""
    talker = config["talker_config"]
    plans = _talker(talker) + _code_predictor(talker)
    if config.get("tts_model_type") == "base":
        plans += _speaker_encoder(config["speaker_encoder_config"])
    return sorted(plans, key=lambda plan: plan.name)
