"""The prompt rows a voice prompt adds (MODEL.md step 2-3 for base checkpoints).

The speaker row (the x-vector) goes into the codec prefix before `[codec_pad, codec_bos]`. In-context mode then
replaces the text part: the text rows are `P(ref_text ++ text) ++ tts_eos`, the codec rows `E0(codec_bos)` then
each reference frame's summed embedding (`E0(c0) + sum_j Ej(cj)`, as a generated frame's input). Non-streaming
text: every text row over `E0(codec_pad)`, then every codec row over tts_pad; streaming text: text and codec rows
summed pairwise, the surplus text trailing one row per frame (or tts_pad padding the text when it is shorter).
"""

from __future__ import annotations

import torch

from services.model.config import TTSConfig
from services.model.errors import RequestError
from services.model.talker import Talker
from services.model.voice.voice_prompt import VoicePrompt


def with_speaker_row(codec_rows: torch.Tensor, voice: VoicePrompt) -> torch.Tensor:
    """The codec prefix rows [L, H] with the x-vector inserted before its last two (codec_pad, codec_bos)."""
    if voice.speaker_embedding.shape[0] != codec_rows.shape[1]:
        raise RequestError("invalid_voice_prompt", f"the voice prompt's speaker embedding has width "
                           f"{voice.speaker_embedding.shape[0]}, this talker {codec_rows.shape[1]}: it was made for "
                           "another checkpoint")
    speaker = voice.speaker_embedding.to(device=codec_rows.device, dtype=codec_rows.dtype)
    return torch.cat((codec_rows[:-2], speaker[None], codec_rows[-2:]))


def in_context_rows(talker: Talker, cfg: TTSConfig, voice: VoicePrompt, text_ids: torch.Tensor,
                    tts_eos: torch.Tensor, tts_pad: torch.Tensor, non_streaming: bool
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(prefill rows, trailing text rows) after the prompt's head, for the text ids [N] of the request."""
    device = text_ids.device
    if any(not 0 <= i < cfg.talker.text_vocab_size for i in voice.ref_text_ids):
        raise RequestError("invalid_voice_prompt", "the reference transcript holds ids outside the text vocabulary")
    ref_ids = torch.tensor(voice.ref_text_ids, dtype=torch.long, device=device)
    text = torch.cat((talker.embed_text(torch.cat((ref_ids, text_ids))), tts_eos))
    frames = voice.ref_codes.to(device=device, dtype=torch.long)
    vocab = cfg.talker.code_predictor.vocab_size
    if frames.shape[1] != cfg.talker.num_code_groups or not 0 <= int(frames.min()) <= int(frames.max()) < vocab:
        raise RequestError("invalid_voice_prompt", "the voice prompt's reference codes do not fit this checkpoint's "
                           f"{cfg.talker.num_code_groups} codebooks of {vocab} entries")
    bos = talker.codec_embedding(torch.tensor([cfg.talker.codec_bos_id], device=device))
    codec = torch.cat((bos, talker.embed_codes(frames)))
    if non_streaming:
        pads = talker.codec_embedding(torch.full((text.shape[0],), cfg.talker.codec_pad_id, device=device))
        return torch.cat((text + pads, codec + tts_pad)), text[:0]
    if text.shape[0] > codec.shape[0]:
        return text[: codec.shape[0]] + codec, text[codec.shape[0]:]
    padded = torch.cat((text, tts_pad.expand(codec.shape[0] - text.shape[0], -1)))
    return padded + codec, text[:0]
