"""Write the text tokenizer files of a `voxmesh model init` checkpoint: a byte-level BPE in the Qwen2 layout.

`build_byte_level_bpe` trains a small deterministic vocabulary on the built-in corpus and writes
vocab.json, merges.txt, tokenizer.json and tokenizer_config.json; `services.model.text_tokenizer`
loads them back the way it loads a released checkpoint's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers

from services.model.text_tokenizer import (
    IM_END,
    IM_START,
    TTS_BOS,
    TTS_EOS,
    TTS_PAD,
    TextTokenizer,
    TokenizerError,
    qwen2_pipeline,
)
from services.random_checkpoint.tokenizer_corpus import corpus_lines

# The added tokens of the released Qwen3-TTS tokenizer, in id order right after the regular
# vocabulary (151643 in the releases), with their "special" flag.
SPECIAL_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), (IM_START, True), (IM_END, True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
    ("<|audio_start|>", True), ("<|audio_end|>", True), (TTS_PAD, True), (TTS_BOS, True), (TTS_EOS, True),
    ("<tts_text_bos_single>", True), ("<|audio_pad|>", True),
)
_TRAINED_VOCAB_CAP = 8192  # the built-in corpus runs out of merges long before this


def special_token_ids(num_regular_tokens: int) -> dict[str, int]:
    """Where `build_byte_level_bpe(num_regular_tokens=...)` puts each added token."""
    return {content: num_regular_tokens + i for i, (content, _) in enumerate(SPECIAL_TOKENS)}


def build_byte_level_bpe(
    out_dir: str | Path, num_regular_tokens: int, lines: Iterable[str] | None = None
) -> TextTokenizer:
    """Train a byte-level BPE (deterministic) and write it in the Qwen2 layout into `out_dir`.

    The regular vocabulary has exactly `num_regular_tokens` entries (padded with unreachable
    placeholders once the corpus runs out of merges), then the added tokens of `SPECIAL_TOKENS`
    follow in order: with 151643 regular tokens they land on the released ids.
    Writes vocab.json, merges.txt, tokenizer.json and tokenizer_config.json.
    """
    if num_regular_tokens < 256 + 1:
        raise TokenizerError(f"num_regular_tokens must exceed the 256 byte tokens, got {num_regular_tokens}")
    vocab, merges = _train_vocab_and_merges(list(lines) if lines is not None else corpus_lines(), num_regular_tokens)
    for index in range(len(vocab), num_regular_tokens):
        vocab[f"<|placeholder_{index}|>"] = index
    tokenizer = qwen2_pipeline(models.BPE(vocab=vocab, merges=merges))
    _add_special_tokens(tokenizer, num_regular_tokens)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    _write_vocab_files(out, vocab, merges)
    _write_tokenizer_config(out, num_regular_tokens)
    return TextTokenizer(tokenizer)


def _train_vocab_and_merges(lines: list[str], num_regular_tokens: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    trainer = trainers.BpeTrainer(
        vocab_size=min(num_regular_tokens, _TRAINED_VOCAB_CAP),
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    scratch = qwen2_pipeline(models.BPE())
    scratch.train_from_iterator(lines, trainer=trainer)
    model = json.loads(scratch.to_str())["model"]
    merges = [tuple(pair) if isinstance(pair, list) else tuple(pair.split(" ")) for pair in model["merges"]]
    return dict(model["vocab"]), merges


def _add_special_tokens(tokenizer: Tokenizer, first_id: int) -> None:
    tokens = [AddedToken(content, special=special, normalized=False) for content, special in SPECIAL_TOKENS]
    tokenizer.add_special_tokens(tokens)
    for content, expected in special_token_ids(first_id).items():
        if tokenizer.token_to_id(content) != expected:
            raise TokenizerError(f"{content} got id {tokenizer.token_to_id(content)}, expected {expected}")


def _write_vocab_files(out: Path, vocab: dict[str, int], merges: list[tuple[str, str]]) -> None:
    ordered = dict(sorted(vocab.items(), key=lambda item: item[1]))
    (out / "vocab.json").write_text(json.dumps(ordered, ensure_ascii=False), encoding="utf-8")
    lines = ["#version: 0.2"] + [f"{left} {right}" for left, right in merges]
    (out / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _write_tokenizer_config(out: Path, first_id: int) -> None:
    decoder = {
        str(first_id + i): {
            "content": content, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": special,
        }
        for i, (content, special) in enumerate(SPECIAL_TOKENS)
    }
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [IM_START, IM_END, TTS_PAD, TTS_BOS, TTS_EOS],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
