"""The two encoders of voice cloning against the reference, and what they refuse.

- The speaker encoder (ECAPA-TDNN) on the reference's own base checkpoint with large weights: x-vectors agree.
- The codec encoder (Mimi-style) on a `model init` speech tokenizer: codes identical for several lengths, one of
  them longer than the configured attention window (the reference attends to the whole input); and on a
  reference-built tokenizer whose transformer matters, with a window of 8 frames, hidden states identical.
- Bad inputs and mismatched checkpoints fail with typed errors naming what is wrong.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from loadtest.gpu.gpu_common import dispatched_ops
from services.model.codec.encoder_loader import load_codec_encoder
from services.model.codec.encoder_quantizer import Codebook
from services.model.codec.errors import CodecCheckpointError, CodecConfigError
from services.model.errors import RequestError, UnsupportedModelError
from services.model.loader import load_model
from services.model.prompt import PromptRequest, assistant_text, build_prompt
from services.model.text_tokenizer import TextTokenizer
from services.model.voice.cloner import VoiceCloner
from services.model.voice.errors import ReferenceAudioError
from services.model.voice.mel import LogMel, MelSettings
from services.model.voice.speaker_encoder import SpeakerEncoder
from services.model.voice.voice_prompt import VoicePrompt
from services.random_checkpoint.codec_writer import write_codec_checkpoint
from tests.support import codec_reference
from tests.support.model_fixtures import reference_checkpoint
from tests.support.oracle.reference import load as load_reference


def noise(seconds: float, seed: int = 3) -> torch.Tensor:
    return (0.3 * torch.randn(int(24000 * seconds), generator=torch.Generator().manual_seed(seed))).clamp(-1, 1)


def test_x_vector_equals_the_reference():
    checkpoint = reference_checkpoint("base")
    model = load_model(checkpoint.directory)
    encoder = SpeakerEncoder.from_checkpoint(model.config.speaker_encoder, model.speaker_encoder)
    for seconds in (1.0, 3.7):
        audio = noise(seconds)
        expected = checkpoint.model.extract_speaker_embedding(audio.numpy(), 24000)
        ours = encoder(LogMel(MelSettings())(audio)[None])[0]
        assert ours.shape == (model.talker.hidden_size,)
        torch.testing.assert_close(ours, expected, atol=2e-6 * float(expected.abs().max()), rtol=0)


@pytest.fixture(scope="module")
def tiny_speech_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_codec_checkpoint(tmp_path_factory.mktemp("codec"), "tiny", seed=0)


@pytest.mark.parametrize("seconds", [1.0, 2.0 + 777 / 24000, 7 * 1920 / 24000, 14.0])
def test_codec_encoder_codes_equal_the_reference(tiny_speech_tokenizer: Path, seconds: float):
    load_reference()
    from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer

    audio = noise(seconds)
    expected = Qwen3TTSTokenizer.from_pretrained(str(tiny_speech_tokenizer)).encode(audio.numpy(), sr=24000)
    ours = load_codec_encoder(tiny_speech_tokenizer).encode(audio)
    assert ours.shape == (-(-audio.shape[0] // 1920), 16)
    assert torch.equal(ours, expected.audio_codes[0])
    assert len(set(ours[:, 0].tolist())) > ours.shape[0] // 2, "degenerate encoder: frames repeat one code"


def test_a_loaded_codec_encoder_computes_its_codebook_entries_once(tiny_speech_tokenizer: Path):
    encoder = load_codec_encoder(tiny_speech_tokenizer)
    codebooks = [part for part in encoder.modules() if isinstance(part, Codebook)]
    assert len(codebooks) >= 16 and all(torch.equal(c.fixed_entries, c.entries()) for c in codebooks)
    audio = noise(1.0)
    with torch.inference_mode():
        fixed = dispatched_ops(lambda: encoder.encode(audio))
        codes = encoder.encode(audio)
        for codebook in codebooks:
            codebook.fixed_entries = None  # as built, before `fix`: entries() each call
        unfixed = dispatched_ops(lambda: encoder.encode(audio))
        assert torch.equal(encoder.encode(audio), codes)
    used = encoder.cfg.valid_num_quantizers  # entries() is a clamp and a division, per codebook used
    for op in ("aten::clamp", "aten::div"):
        assert unfixed.get(op, 0) - fixed.get(op, 0) == used, (op, fixed, unfixed)


def test_the_speaker_encoder_pads_only_its_wider_convolutions():
    checkpoint = reference_checkpoint("base")
    model = load_model(checkpoint.directory)
    encoder = SpeakerEncoder.from_checkpoint(model.config.speaker_encoder, model.speaker_encoder)
    convolutions = [part for part in encoder.modules() if isinstance(part, torch.nn.Conv1d)]
    wider = sum(conv.kernel_size[0] > 1 for conv in convolutions)
    assert 0 < wider < len(convolutions)
    mels = LogMel(MelSettings())(noise(1.0))[None]
    with torch.inference_mode():
        calls = dispatched_ops(lambda: encoder(mels))
    assert calls["aten::conv1d"] == len(convolutions) and calls["aten::pad"] == wider, calls


def test_codec_encoder_attends_to_the_whole_input_like_the_reference(tmp_path: Path, monkeypatch):
    """Layer scales of N(0, 0.3) make the transformer matter; with a configured window of 8 frames over 75, any
    windowing on one side only would change the hidden states."""
    monkeypatch.setattr(codec_reference, "TINY_ENCODER",
                        dict(codec_reference.TINY_ENCODER, sliding_window=8, num_hidden_layers=2))
    reference = codec_reference.build_reference_tokenizer(tmp_path, codec_reference.WINDOWED_DECODER, seed=1)
    ours = load_codec_encoder(tmp_path)
    audio = noise(3.0)[None, None]
    with torch.no_grad():
        expected_conv = reference.encoder.encoder(audio)
        expected = reference.encoder.encoder_transformer(expected_conv.transpose(1, 2))[0]
        conv = ours.encoder(audio)
        hidden = ours.encoder_transformer(conv.transpose(1, 2))
    torch.testing.assert_close(conv, expected_conv, atol=1e-6, rtol=0)
    assert (expected - expected_conv.transpose(1, 2)).abs().max() > 0.1, "the transformer should matter"
    torch.testing.assert_close(hidden, expected, atol=1e-5, rtol=0)
    with torch.no_grad():
        codes = reference.encode(audio[0], torch.ones(1, audio.shape[-1], dtype=torch.long)).audio_codes[0]
    assert torch.equal(ours.encode(audio[0, 0]), codes)


def test_codec_encoder_loading_names_what_is_missing(tiny_speech_tokenizer: Path, tmp_path: Path):
    broken = tmp_path / "speech_tokenizer"
    shutil.copytree(tiny_speech_tokenizer, broken)
    from safetensors.torch import load_file, save_file

    tensors = load_file(broken / "model.safetensors")
    del tensors["encoder.downsample.conv.weight"]
    save_file(tensors, broken / "model.safetensors")
    with pytest.raises(CodecCheckpointError, match="encoder.downsample.conv.weight"):
        load_codec_encoder(broken)
    config = json.loads((broken / "config.json").read_text())
    del config["encoder_config"]
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(CodecConfigError, match="encoder_config"):
        load_codec_encoder(broken)


@pytest.fixture(scope="module")
def cloner(tiny_base_checkpoint: Path) -> VoiceCloner:
    return VoiceCloner.load(load_model(tiny_base_checkpoint), TextTokenizer.from_dir(tiny_base_checkpoint))


@pytest.mark.parametrize("samples,rate,ref_text,x_vector_only,code", [
    (noise(2.0), 24000, None, False, "ref_text_required"),
    (noise(2.0), 24000, "  ", False, "ref_text_required"),
    (noise(0.5), 24000, "hello", False, "ref_audio_too_short"),
    (torch.zeros(16000 * 31), 16000, None, True, "ref_audio_too_long"),
    (torch.full((48000,), float("nan")), 24000, None, True, "invalid_ref_audio"),
    (noise(2.0), 24001, None, True, "unsupported_sample_rate"),
])
def test_unusable_references_are_refused_with_a_code(cloner, samples, rate, ref_text, x_vector_only, code):
    with pytest.raises(ReferenceAudioError) as refused:
        cloner.make_prompt(samples, rate, ref_text, x_vector_only)
    assert refused.value.code == code


def test_x_vector_mode_ignores_the_transcript_and_stereo_is_mixed_down(cloner: VoiceCloner):
    audio = noise(2.0).numpy()
    alone = cloner.make_prompt(audio, 24000, None, x_vector_only=True)
    stereo = cloner.make_prompt(np.stack([audio, audio], axis=1), 24000, "ignored", x_vector_only=True)
    assert alone.ref_codes is None and stereo.ref_text_ids is None
    torch.testing.assert_close(alone.speaker_embedding, stereo.speaker_embedding)


def test_prompts_need_a_voice_on_base_models_and_refuse_one_elsewhere(tiny_base_checkpoint: Path,
                                                                      tiny_checkpoint: Path, cloner: VoiceCloner):
    base, custom = load_model(tiny_base_checkpoint), load_model(tiny_checkpoint)
    ids = tuple(TextTokenizer.from_dir(tiny_checkpoint).encode(assistant_text("hello there")))
    voice = cloner.make_prompt(noise(2.0), 24000, None, x_vector_only=True)
    with pytest.raises(UnsupportedModelError, match="ref_audio"):
        build_prompt(base.talker, base.config, PromptRequest(ids))
    with pytest.raises(RequestError) as refused:
        build_prompt(custom.talker, custom.config, PromptRequest(ids, voice=voice))
    assert refused.value.code == "voice_cloning_unsupported"
    narrow = VoicePrompt(speaker_embedding=torch.zeros(8))
    with pytest.raises(RequestError) as refused:
        build_prompt(base.talker, base.config, PromptRequest(ids, voice=narrow))
    assert refused.value.code == "invalid_voice_prompt"
    with pytest.raises(ReferenceAudioError):
        VoiceCloner.load(custom, TextTokenizer.from_dir(tiny_checkpoint))
