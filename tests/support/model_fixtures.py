"""Tiny checkpoints built WITH THE REFERENCE (`qwen-tts`) for the model parity tests.

Each variant is built once per test session (cached here, in a temporary directory removed at exit): the
reference model with re-initialised random weights (default init gives degenerate outputs, MODEL.md),
saved with the reference's own `save_pretrained`, plus the byte-level BPE tokenizer `voxmesh model init` writes. The in-memory
reference model is kept as the oracle.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from services.model import text_tokenizer
from services.model.text_tokenizer import TextTokenizer
from services.random_checkpoint.tokenizer_writer import build_byte_level_bpe, special_token_ids
from tests.support.oracle.reference import load as load_reference

HIDDEN = 64
TEXT_VOCAB = 1024
NUM_REGULAR_TEXT_TOKENS = 960
"""Enough merges that "assistant" is one token, so the role is exactly 3 ids (as with the released tokenizer)."""
_SPECIAL_IDS = special_token_ids(NUM_REGULAR_TEXT_TOKENS)

_ROOT = Path(tempfile.mkdtemp(prefix="voxmesh-model-fixtures-"))
atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)


@dataclass(frozen=True)
class Variant:
    tts_model_type: str = "custom_voice"
    tts_model_size: str = "1b7"
    predictor_hidden: int = 48
    """A width other than HIDDEN gives the code predictor its `small_to_mtp_projection` Linear."""
    with_speakers: bool = True
    shard_size: str | None = None
    """`max_shard_size` for save_pretrained: sharded with an index when set."""


VARIANTS = {
    "custom_voice": Variant(),
    "custom_voice_0b6": Variant(tts_model_size="0b6"),
    "voice_design": Variant(tts_model_type="voice_design", predictor_hidden=HIDDEN, with_speakers=False),
    "base": Variant(tts_model_type="base", tts_model_size="0b6"),
    "sharded": Variant(shard_size="2MB"),
}


def reference_config(variant: Variant):
    from qwen_tts.core.models import Qwen3TTSConfig

    predictor = dict(
        vocab_size=2048, hidden_size=variant.predictor_hidden, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_code_groups=16, rope_theta=10000,
    )
    speakers = dict(spk_id={"alice": 3000, "bob": 3001, "chen": 3002},
                    spk_is_dialect={"alice": False, "bob": False, "chen": "sichuan_dialect"}) if variant.with_speakers else {}
    talker = dict(
        code_predictor_config=predictor, vocab_size=3072, hidden_size=HIDDEN, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_code_groups=16,
        rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3], "interleaved": True}, rope_theta=1e6,
        text_hidden_size=32, text_vocab_size=TEXT_VOCAB, codec_eos_token_id=2150, codec_think_id=2154,
        codec_nothink_id=2155, codec_think_bos_id=2156, codec_think_eos_id=2157, codec_pad_id=2148,
        codec_bos_id=2149, codec_language_id={"english": 2050, "chinese": 2055, "german": 2053, "sichuan_dialect": 2062},
        spk_id=speakers.get("spk_id", {}), spk_is_dialect=speakers.get("spk_is_dialect", {}),
    )
    encoder = dict(enc_dim=HIDDEN, enc_channels=[32, 32, 32, 32, 96], enc_attention_channels=16,
                   enc_res2net_scale=4, enc_se_channels=16, mel_dim=128)
    return Qwen3TTSConfig(
        talker_config=talker, speaker_encoder_config=encoder, tts_model_type=variant.tts_model_type,
        tts_model_size=variant.tts_model_size, tokenizer_type="qwen3_tts_tokenizer_12hz",
        im_start_token_id=_SPECIAL_IDS[text_tokenizer.IM_START], im_end_token_id=_SPECIAL_IDS[text_tokenizer.IM_END],
        tts_pad_token_id=_SPECIAL_IDS[text_tokenizer.TTS_PAD], tts_bos_token_id=_SPECIAL_IDS[text_tokenizer.TTS_BOS],
        tts_eos_token_id=_SPECIAL_IDS[text_tokenizer.TTS_EOS],
    )


def _reinitialise(model: torch.nn.Module, seed: int) -> None:
    """Large random weights (talker std 0.3, MODEL.md) and non-trivial norms, so logits have wide margins."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if "norm" in name:
                param.copy_(1.0 + 0.2 * noise)
            elif name.endswith("bias"):
                param.copy_(0.1 * noise)
            else:
                param.copy_(0.3 * noise)


@dataclass(frozen=True)
class ReferenceCheckpoint:
    directory: Path
    model: torch.nn.Module
    """The reference `Qwen3TTSForConditionalGeneration` whose weights are on disk."""
    tokenizer: TextTokenizer


def reference_model(name: str, seed: int = 0) -> torch.nn.Module:
    """A fresh reference `Qwen3TTSForConditionalGeneration` of a variant; equal seeds give equal weights."""
    load_reference()
    from qwen_tts.core.models import Qwen3TTSForConditionalGeneration

    torch.manual_seed(seed)
    model = Qwen3TTSForConditionalGeneration(reference_config(VARIANTS[name])).eval()
    _reinitialise(model, seed)
    return model


@functools.cache
def reference_checkpoint(name: str, seed: int = 0) -> ReferenceCheckpoint:
    variant = VARIANTS[name]
    model = reference_model(name, seed)
    directory = _ROOT / f"{name}-{seed}"
    kwargs = {"max_shard_size": variant.shard_size} if variant.shard_size else {}
    model.save_pretrained(directory, **kwargs)
    tokenizer = build_byte_level_bpe(directory, NUM_REGULAR_TEXT_TOKENS)
    return ReferenceCheckpoint(directory, model, tokenizer)
