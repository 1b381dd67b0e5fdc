"""Text tokenization for Qwen3-TTS checkpoints: a byte-level BPE in the Qwen2 file layout.

`TextTokenizer.from_dir(path)` loads `tokenizer.json` when present, else builds the same
pipeline from `vocab.json` + `merges.txt` + `tokenizer_config.json` (the way transformers
converts a slow Qwen2 tokenizer), so it gives the ids that the reference's processor gives
on the same files. `build_byte_level_bpe` trains a small deterministic vocabulary for
checkpoints made by `voxmesh model init`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from services.model.tokenizer_corpus import corpus_lines

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TTS_PAD = "<tts_pad>"
TTS_BOS = "<tts_text_bos>"
TTS_EOS = "<tts_text_eod>"

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

# Qwen2's pre-tokenizer split: contractions, letter runs, single digits, punctuation, newlines.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# transformers 4.57.3 swaps the first split for this one when the reference loads its processor
# (`fix_mistral_regex=True`) and the checkpoint looks affected; see `_reference_swaps_split`.
REFERENCE_SWAPPED_SPLIT_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
    r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SWAP_MIN_VOCAB = 100_000  # transformers only considers the swap for vocabularies this large
_SWAP_EXEMPT_UP_TO = (4, 57, 2, 1)  # configs saved by transformers <= this version (non-mistral) keep the split
_MISTRAL_MODEL_TYPES = ("mistral", "mistral3", "voxtral", "ministral", "pixtral")
_TRAINED_VOCAB_CAP = 8192  # the built-in corpus runs out of merges long before this


class TokenizerError(ValueError):
    """Tokenizer files that are missing or inconsistent; `code` is machine-readable."""

    def __init__(self, message: str, code: str = "tokenizer_invalid") -> None:
        super().__init__(message)
        self.code = code


class TextTokenizer:
    """Text -> ids with the chat special tokens; a thin, typed wrapper over `tokenizers.Tokenizer`."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        added = tokenizer.get_added_tokens_decoder()
        self._special_ids = MappingProxyType({tok.content: idx for idx, tok in sorted(added.items())})

    @classmethod
    def from_dir(cls, path: str | Path) -> TextTokenizer:
        """Load the tokenizer files of a checkpoint directory (tokenizer.json, else vocab + merges)."""
        directory = Path(path)
        tokenizer_json = directory / "tokenizer.json"
        if tokenizer_json.is_file():
            try:
                tokenizer = Tokenizer.from_file(str(tokenizer_json))
            except Exception as exc:  # the Rust error text is the useful part
                raise TokenizerError(f"{tokenizer_json}: cannot be parsed: {exc}") from exc
        else:
            tokenizer = _tokenizer_from_vocab_files(directory)
        if _reference_swaps_split(directory, tokenizer.get_vocab_size(with_added_tokens=False)):
            tokenizer.pre_tokenizer[0] = pre_tokenizers.Split(Regex(REFERENCE_SWAPPED_SPLIT_PATTERN), "isolated")
        return cls(tokenizer)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token strings in it (e.g. `<|im_start|>`) become their ids."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, not {type(text).__name__}")
        return self._tokenizer.encode(text).ids

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`, special tokens included."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)

    @property
    def special_ids(self) -> Mapping[str, int]:
        """Every added token's content -> id (`<|im_start|>`, `<tts_pad>`, ...)."""
        return self._special_ids

    @property
    def vocab_size(self) -> int:
        """Regular vocabulary plus added tokens (ids are below this, except after a gap)."""
        return self._tokenizer.get_vocab_size(with_added_tokens=True)


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
    tokenizer = _qwen2_pipeline(models.BPE(vocab=vocab, merges=merges))
    _add_special_tokens(tokenizer, num_regular_tokens)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    _write_vocab_files(out, vocab, merges)
    _write_tokenizer_config(out, num_regular_tokens)
    return TextTokenizer(tokenizer)


def _qwen2_pipeline(model: models.BPE) -> Tokenizer:
    """The Qwen2 tokenizer around a BPE model: NFC, regex split, byte-level bytes, no BOS/EOS."""
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tokenizer.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return tokenizer


def _train_vocab_and_merges(lines: list[str], num_regular_tokens: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    trainer = trainers.BpeTrainer(
        vocab_size=min(num_regular_tokens, _TRAINED_VOCAB_CAP),
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    scratch = _qwen2_pipeline(models.BPE())
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


def _tokenizer_from_vocab_files(directory: Path) -> Tokenizer:
    """Build the pipeline from vocab.json + merges.txt and the added tokens of tokenizer_config.json."""
    paths = {name: directory / name for name in ("vocab.json", "merges.txt", "tokenizer_config.json")}
    missing = [name for name, path in paths.items() if not path.is_file()]
    if missing:
        raise TokenizerError(
            f"{directory}: no tokenizer.json and missing {', '.join(missing)}", code="tokenizer_files_missing"
        )
    try:
        model = models.BPE.from_file(str(paths["vocab.json"]), str(paths["merges.txt"]))
        config = json.loads(paths["tokenizer_config.json"].read_text(encoding="utf-8"))
    except Exception as exc:
        raise TokenizerError(f"{directory}: unreadable vocab.json/merges.txt/tokenizer_config.json: {exc}") from exc
    tokenizer = _qwen2_pipeline(model)
    for id_text, entry in sorted(config.get("added_tokens_decoder", {}).items(), key=lambda item: int(item[0])):
        token = AddedToken(entry["content"], special=entry.get("special", True), normalized=entry.get("normalized", False))
        tokenizer.add_special_tokens([token])
        if tokenizer.token_to_id(entry["content"]) != int(id_text):
            raise TokenizerError(
                f"{paths['tokenizer_config.json']}: added token {entry['content']!r} declares id {id_text} but follows "
                f"a vocabulary that puts it at {tokenizer.token_to_id(entry['content'])}"
            )
    return tokenizer


def _reference_swaps_split(directory: Path, model_vocab_size: int) -> bool:
    """Whether the reference's processor (transformers 4.57.3, `fix_mistral_regex=True`) swaps the split.

    transformers decides from the checkpoint's config.json: large vocabularies whose config was
    saved by a transformers newer than 4.57.2 and older than 5 (or by a mistral model, or with no
    version at all) get `REFERENCE_SWAPPED_SPLIT_PATTERN`. Mirroring the rule keeps our ids equal
    to the reference's on released checkpoints too.
    """
    config_path = directory / "config.json"
    if model_vocab_size <= _SWAP_MIN_VOCAB or not config_path.is_file():
        return False
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    version = _version_tuple(config.get("transformers_version"))
    model_type = config.get("model_type")
    if version is not None and version <= _SWAP_EXEMPT_UP_TO:
        return model_type is None or model_type in _MISTRAL_MODEL_TYPES
    if version is not None and version >= (5, 0, 0, 1):
        return False
    return True


def _version_tuple(text: object) -> tuple[int, int, int, int] | None:
    """(major, minor, patch, 1) for a release, (..., 0) for a pre-release, which sorts below it."""
    match = re.match(r"^(\d+)\.(\d+)(?:\.(\d+))?(.*)$", text) if isinstance(text, str) else None
    if match is None:
        return None
    major, minor, patch, rest = match.groups()
    return int(major), int(minor), int(patch or 0), 0 if rest else 1
