"""The byte-level BPE of `model init`: the reference's processor gives the same ids on the same files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from services.model.text_tokenizer import IM_END, IM_START, TTS_BOS, TTS_EOS, TTS_PAD, TextTokenizer, TokenizerError
from services.random_checkpoint.model_presets import (
    RELEASED_NUM_REGULAR_TEXT_TOKENS,
    TINY_NUM_REGULAR_TEXT_TOKENS,
    num_regular_text_tokens,
    preset_config,
)
from services.random_checkpoint.tokenizer_corpus import corpus_lines
from services.random_checkpoint.tokenizer_writer import SPECIAL_TOKENS, build_byte_level_bpe
from tests.support.oracle.reference import load

TEXTS = [
    "Hello, world! This is a plain ASCII sentence.",
    "Ünïcödé: café, naïve, 日本語のテキスト, 한국어, emoji 🎉🙂 and e\u0301 (combining).",
    "Digits 0123456789, 3.14159, 1,000,000 and the year 2026.",
    "Contractions: don't, I'LL, we've; CamelCase McDonald; tabs\tand   spaces\n\nnew lines.",
    "",
]


def chat(text: str) -> str:
    return f"{IM_START}assistant\n{text}{IM_END}\n{IM_START}assistant\n"


@pytest.fixture(scope="module")
def reference_processor():
    """Load a tokenizer directory the way the reference does: AutoProcessor with fix_mistral_regex=True."""
    load()
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSProcessor
    from transformers import AutoConfig, AutoProcessor

    AutoConfig.register("qwen3_tts", Qwen3TTSConfig)
    AutoProcessor.register(Qwen3TTSConfig, Qwen3TTSProcessor)

    def ids(directory: Path, text: str) -> list[int]:
        processor = AutoProcessor.from_pretrained(str(directory), fix_mistral_regex=True)
        return processor(text=text, return_tensors="pt", padding=True)["input_ids"][0].tolist()

    return ids


def write_tokenizer_dir(directory: Path, num_regular: int, transformers_version: str, lines=None) -> Path:
    build_byte_level_bpe(directory, num_regular, lines)
    config = {"model_type": "qwen3_tts", "transformers_version": transformers_version}
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return write_tokenizer_dir(tmp_path_factory.mktemp("tok") / "tiny", TINY_NUM_REGULAR_TEXT_TOKENS, "4.57.3")


@pytest.mark.parametrize("text", TEXTS)
def test_ids_equal_the_reference_processor(tiny_dir, reference_processor, text):
    ours = TextTokenizer.from_dir(tiny_dir)
    for variant in (text, chat(text)):
        assert ours.encode(variant) == reference_processor(tiny_dir, variant)


def test_vocab_files_alone_give_the_same_ids(tiny_dir, reference_processor, tmp_path):
    """Without tokenizer.json both sides rebuild from vocab.json + merges.txt (the released layout)."""
    slow = tmp_path / "slow"
    slow.mkdir()
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json", "config.json"):
        shutil.copy(tiny_dir / name, slow / name)
    ours = TextTokenizer.from_dir(slow)
    for text in TEXTS:
        assert ours.encode(chat(text)) == reference_processor(slow, chat(text))
        assert ours.encode(chat(text)) == TextTokenizer.from_dir(tiny_dir).encode(chat(text))


def test_chat_template_has_the_role_and_tail_the_prompt_builder_slices(tiny_dir):
    tokenizer = TextTokenizer.from_dir(tiny_dir)
    ids = tokenizer.encode(chat("Hello there."))
    role = tokenizer.encode(f"{IM_START}assistant\n")
    tail = tokenizer.encode(f"{IM_END}\n{IM_START}assistant\n")
    assert len(role) == 3 and len(tail) == 5
    assert ids[:3] == role and ids[-5:] == tail
    assert tokenizer.decode(ids[3:-5]) == "Hello there."
    assert len(tokenizer.encode(f"{IM_START}user\n")) == 3


def test_special_ids_follow_the_regular_vocabulary_and_match_the_config(tiny_dir):
    tokenizer = TextTokenizer.from_dir(tiny_dir)
    expected = {content: TINY_NUM_REGULAR_TEXT_TOKENS + i for i, (content, _) in enumerate(SPECIAL_TOKENS)}
    assert dict(tokenizer.special_ids) == expected
    config = preset_config("tiny")
    for key, token in (("im_start_token_id", IM_START), ("im_end_token_id", IM_END),
                       ("tts_pad_token_id", TTS_PAD), ("tts_bos_token_id", TTS_BOS), ("tts_eos_token_id", TTS_EOS)):
        assert config[key] == tokenizer.special_ids[token]
        assert tokenizer.encode(token) == [config[key]]
    assert max(tokenizer.special_ids.values()) < config["talker_config"]["text_vocab_size"]


def test_training_is_deterministic_and_depends_on_the_corpus(tmp_path):
    first = build_byte_level_bpe(tmp_path / "a", 700)
    build_byte_level_bpe(tmp_path / "b", 700)
    for name in ("vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    other = build_byte_level_bpe(tmp_path / "c", 700, corpus_lines() + ["zyzzyva quixotic"] * 50)
    assert other.encode("zyzzyva") != first.encode("zyzzyva")


@pytest.mark.parametrize("version", ["4.57.3", "4.57.1"])
def test_released_layout_puts_special_tokens_on_the_released_ids(tmp_path_factory, reference_processor, version):
    """151643 regular tokens: specials land on 151643+; the reference's regex swap (4.57.3 configs) is mirrored."""
    lines = corpus_lines() + ["McDonald and McGregor met DeShawn at McDonald's."] * 30
    directory = write_tokenizer_dir(
        tmp_path_factory.mktemp("released") / version, RELEASED_NUM_REGULAR_TEXT_TOKENS, version, lines
    )
    tokenizer = TextTokenizer.from_dir(directory)
    assert tokenizer.special_ids[IM_START] == 151644 and tokenizer.special_ids[TTS_PAD] == 151671
    assert num_regular_text_tokens(preset_config("0.6b")) == RELEASED_NUM_REGULAR_TEXT_TOKENS
    text = chat("McDonald met McGregor; don't stop.")
    assert tokenizer.encode(text) == reference_processor(directory, text)
    if version == "4.57.3":
        # The swap must change ids here, or this test could not tell whether it is mirrored.
        (directory / "config.json").write_text(json.dumps({"model_type": "qwen3_tts", "transformers_version": "4.57.1"}))
        assert TextTokenizer.from_dir(directory).encode(text) != tokenizer.encode(text)


def test_missing_files_raise_a_clear_error(tmp_path):
    with pytest.raises(TokenizerError, match="missing vocab.json, merges.txt, tokenizer_config.json") as info:
        TextTokenizer.from_dir(tmp_path)
    assert info.value.code == "tokenizer_files_missing"


def test_corrupt_tokenizer_json_names_the_file(tiny_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_dir, broken)
    (broken / "tokenizer.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(TokenizerError, match="tokenizer.json") as info:
        TextTokenizer.from_dir(broken)
    assert info.value.code == "tokenizer_invalid"


def test_added_token_ids_that_do_not_follow_the_vocabulary_are_refused(tiny_dir, tmp_path):
    shifted = tmp_path / "shifted"
    shifted.mkdir()
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(tiny_dir / name, shifted / name)
    config = json.loads((tiny_dir / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = {str(int(k) + 5): v for k, v in config["added_tokens_decoder"].items()}
    (shifted / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(TokenizerError, match="declares id"):
        TextTokenizer.from_dir(shifted)


def test_encode_rejects_non_text(tiny_dir):
    with pytest.raises(TypeError, match="text must be str"):
        TextTokenizer.from_dir(tiny_dir).encode(b"bytes")
