"""Text tokenization for Qwen3-TTS checkpoints: a byte-level BPE in the Qwen2 file layout.

`TextTokenizer.from_dir(path)` loads `tokenizer.json` when present, else builds the same
pipeline from `vocab.json` + `merges.txt` + `tokenizer_config.json` (the way transformers
converts a slow Qwen2 tokenizer), so it gives the ids that the reference's processor gives
on the same files. Writing tokenizer files (for `voxmesh model init`) lives in
`services.random_checkpoint.tokenizer_writer`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TTS_PAD = "<tts_pad>"
TTS_BOS = "<tts_text_bos>"
TTS_EOS = "<tts_text_eod>"

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


def qwen2_pipeline(model: models.BPE) -> Tokenizer:
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
    tokenizer = qwen2_pipeline(model)
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
