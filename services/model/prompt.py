"""Prompt building: the talker's prefill rows and the trailing text rows of a request (MODEL.md, steps 1-3).

A request is described by token ids and names (`PromptRequest`), which travel cheaply; `build_prompt` turns
it into embeddings where the talker's weights are. A base checkpoint also takes a ready voice prompt (the
speaker row, and in in-context mode the reference's codes and transcript: `services/model/voice/`). Two text modes:
- non-streaming (the reference's high-level default): the whole text is in the prefill, every frame's
  trailing row is tts_pad;
- streaming: the prefill holds the first text token, frame k's trailing row is text token k+1, then
  tts_eos, then tts_pad.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from services.model.config import TTSConfig
from services.model.errors import RequestError, UnsupportedModelError
from services.model.talker import Talker
from services.model.uploads import upload
from services.model.voice.prompt_rows import in_context_rows, with_speaker_row
from services.model.voice.voice_prompt import VoicePrompt

ROLE_TOKENS = 3
"""`<|im_start|>assistant\\n`: the first ids of a wrapped text."""
TAIL_TOKENS = 5
"""`<|im_end|>\\n<|im_start|>assistant\\n`: the last ids of a wrapped text."""


def assistant_text(text: str) -> str:
    """The template a text is tokenized in; its first 3 and last 5 ids are the role and the tail."""
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def instruct_text(instruct: str) -> str:
    return f"<|im_start|>user\n{instruct}<|im_end|>\n"


@dataclass(frozen=True, slots=True)
class PromptRequest:
    text_ids: tuple[int, ...]
    """Ids of `assistant_text(text)`."""
    instruct_ids: tuple[int, ...] | None = None
    """Ids of `instruct_text(instruct)`, or None for no instruction."""
    speaker: str | None = None
    language: str = "auto"
    non_streaming: bool = True
    voice: VoicePrompt | None = None
    """A cloned voice (base checkpoints only), computed beforehand from reference audio."""


@dataclass(frozen=True, slots=True)
class Prompt:
    embeds: torch.Tensor
    """[L, hidden]: the prefill input rows."""
    trailing: torch.Tensor
    """[N, hidden]: the text row added to frame k's input for k < N; tts_pad after that."""
    tts_pad: torch.Tensor
    """[hidden]"""

    def trailing_rows(self, frames: torch.Tensor) -> torch.Tensor:
        """The text rows [B, hidden] for frame indices [B] (frame k's input also holds its codes)."""
        rows = torch.cat((self.trailing, self.tts_pad[None]), dim=0)
        return rows[frames.clamp(max=self.trailing.shape[0])]


class TextEncoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


def make_request(
    tokenizer: TextEncoder, text: str, *, instruct: str | None = None, speaker: str | None = None,
    language: str = "auto", non_streaming: bool = True,
) -> PromptRequest:
    """Tokenize a request's text and instruction in their templates; blank text is refused."""
    if not text.strip():
        raise RequestError("empty_text", "the text is empty: give at least one word to speak")
    instruct_ids = tuple(tokenizer.encode(instruct_text(instruct))) if instruct else None
    return PromptRequest(tuple(tokenizer.encode(assistant_text(text))), instruct_ids, speaker, language, non_streaming)


def check_can_generate(cfg: TTSConfig, has_voice: bool = False) -> None:
    """A base checkpoint speaks only in a cloned voice; the others cannot clone one."""
    if cfg.tts_model_type == "base" and not has_voice:
        raise UnsupportedModelError(
            "this is a base (voice-cloning) checkpoint: it speaks only in a voice cloned from reference audio; "
            "give ref_audio (and its ref_text), or a saved voice"
        )
    if cfg.tts_model_type != "base" and has_voice:
        raise RequestError("voice_cloning_unsupported", f"this is a {cfg.tts_model_type} checkpoint: only base "
                           "checkpoints clone a voice from reference audio")


def codec_prefix(cfg: TTSConfig, speaker: str | None, language: str) -> list[int]:
    """The codec ids of the prompt: language tag, the speaker's row if any, then codec_pad and codec_bos."""
    talker = cfg.talker
    lang = language.lower()
    if lang not in cfg.languages:
        raise RequestError("unknown_language", f"unknown language {language!r}; this model knows: {', '.join(cfg.languages)}")
    spk = speaker.lower() if speaker else None
    if spk is not None and cfg.tts_model_type == "voice_design":
        raise RequestError("unknown_speaker", "a voice_design model takes no speaker: describe the voice in the instruction")
    if spk is not None and spk not in talker.speaker_ids:
        known = ", ".join(sorted(talker.speaker_ids)) or "none"
        raise RequestError("unknown_speaker", f"unknown speaker {speaker!r}; this model knows: {known}")
    language_id = None if lang == "auto" else talker.language_ids[lang]
    if lang in ("chinese", "auto") and spk in talker.speaker_dialects:
        language_id = talker.language_ids[talker.speaker_dialects[spk]]
    if language_id is None:
        ids = [talker.codec_nothink_id, talker.codec_think_bos_id, talker.codec_think_eos_id]
    else:
        ids = [talker.codec_think_id, talker.codec_think_bos_id, language_id, talker.codec_think_eos_id]
    if spk is not None:
        ids.append(talker.speaker_ids[spk])
    return ids + [talker.codec_pad_id, talker.codec_bos_id]


def uses_instruction(cfg: TTSConfig) -> bool:
    """The 0.6B custom_voice model ignores instructions, as the reference does."""
    return not (cfg.tts_model_type == "custom_voice" and cfg.tts_model_size == "0b6")


def _check_ids(ids: tuple[int, ...], vocab_size: int, what: str) -> None:
    # Requests arrive as ids over the bus: a bad one must fail alone, not index out of an embedding.
    if any(not 0 <= i < vocab_size for i in ids):
        raise RequestError("bad_token_ids", f"the {what} holds token ids outside the text vocabulary [0, {vocab_size})")


def build_prompt(talker: Talker, cfg: TTSConfig, request: PromptRequest) -> Prompt:
    check_can_generate(cfg, request.voice is not None)
    num_text = len(request.text_ids) - ROLE_TOKENS - TAIL_TOKENS
    if num_text <= 0:
        raise RequestError("empty_text", "the text is empty: give at least one word to speak")
    _check_ids(request.text_ids, cfg.talker.text_vocab_size, "text")
    _check_ids(request.instruct_ids or (), cfg.talker.text_vocab_size, "instruction")
    device = talker.codec_head.weight.device
    # Every id the prompt needs in one upload, and every text row in one embedding pass (admission runs beside the
    # step loop: fewer launches and host copies there leave the interpreter lock to the loop); the rows are
    # sliced out below.
    instruct = request.instruct_ids if request.instruct_ids and uses_instruction(cfg) else ()
    prefix = codec_prefix(cfg, request.speaker, request.language)
    specials = (cfg.tts_bos_id, cfg.tts_eos_id, cfg.tts_pad_id)
    text_ids = (*specials, *request.text_ids, *instruct)
    all_ids = upload(torch.tensor((*text_ids, *prefix), dtype=torch.long), device)
    embedded = talker.embed_text(all_ids[: len(text_ids)])
    codec = talker.codec_embedding(all_ids[len(text_ids) :])
    if request.voice is not None:
        codec = with_speaker_row(codec, request.voice)
    tts_bos, tts_eos, tts_pad = embedded[0:1], embedded[1:2], embedded[2]
    start, end = len(specials), len(specials) + len(request.text_ids)
    ids = all_ids[start:end]
    text = embedded[start + ROLE_TOKENS : end - TAIL_TOKENS]
    pads = tts_pad.expand(codec.shape[0] - 2, -1)
    parts = [embedded[start : start + ROLE_TOKENS], torch.cat((pads, tts_bos)) + codec[:-1]]
    if instruct:
        parts.insert(0, embedded[end:])
    if request.voice is not None and request.voice.in_context:
        rows, trailing = in_context_rows(talker, cfg, request.voice, ids[ROLE_TOKENS:-TAIL_TOKENS], tts_eos, tts_pad,
                                         request.non_streaming)
        parts.append(rows)
    elif request.non_streaming:
        pad_ids = torch.full((num_text + 1,), cfg.talker.codec_pad_id, device=device)
        parts.append(torch.cat((text, tts_eos)) + talker.codec_embedding(pad_ids))
        parts.append(tts_pad[None] + codec[-1:])
        trailing = text[:0]
    else:
        parts.append(text[:1] + codec[-1:])
        trailing = torch.cat((text[1:], tts_eos))
    return Prompt(embeds=torch.cat(parts), trailing=trailing, tts_pad=tts_pad)
