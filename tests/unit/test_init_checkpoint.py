"""`write_checkpoint`: released names and shapes, loadable by the reference, deterministic, streamed, clear errors."""

from __future__ import annotations

import hashlib
import io
import json
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from services.model.text_tokenizer import IM_START, TTS_PAD, TextTokenizer
from services.random_checkpoint.checkpoint_writer import CheckpointInitError, tensor_chunks, write_checkpoint
from services.random_checkpoint.model_presets import PresetError, preset_config
from services.random_checkpoint.safetensors_writer import ProgressLine, write_safetensors
from services.random_checkpoint.tensor_plan import EOS_ROW_GAIN, TensorPlan, plan_tensors
from tests.support.oracle.reference import load


@pytest.fixture(scope="module")
def reference():
    """The reference's model class, with its config registered for AutoConfig (as Qwen3TTSModel does)."""
    load()
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration
    from transformers import AutoConfig

    AutoConfig.register("qwen3_tts", Qwen3TTSConfig)
    return Qwen3TTSConfig, Qwen3TTSForConditionalGeneration


def load_in_reference(reference, directory: Path):
    """HF's own from_pretrained (the reference's override also wants speech_tokenizer/), with loading info."""
    from transformers import PreTrainedModel

    model_class = reference[1]
    return PreTrainedModel.from_pretrained.__func__(model_class, str(directory), output_loading_info=True)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("tts_model_type", ["custom_voice", "voice_design", "base"])
def test_tiny_checkpoint_loads_in_the_reference_with_exactly_its_keys(reference, tmp_path, tts_model_type):
    directory = write_checkpoint(tmp_path / "ckpt", "tiny", seed=0, tts_model_type=tts_model_type, with_codec=False)
    model, info = load_in_reference(reference, directory)
    assert info == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": [], "error_msgs": []}
    stored = load_file(directory / "model.safetensors")
    state = model.state_dict()
    assert set(stored) == set(state)
    for name, tensor in stored.items():
        assert torch.equal(state[name], tensor), name
    assert model.tts_model_type == tts_model_type
    expected_speakers = {"ryan", "vivian", "eric"} if tts_model_type == "custom_voice" else set()
    assert set(model.get_supported_speakers()) == expected_speakers
    assert sorted(model.get_supported_languages()) == ["auto", "chinese", "english", "japanese"]
    assert (model.speaker_encoder is not None) == (tts_model_type == "base")


@pytest.mark.parametrize("preset", ["0.6b", "1.7b"])
@pytest.mark.parametrize("tts_model_type", ["custom_voice", "base"])
def test_released_presets_plan_the_reference_shapes(reference, preset, tts_model_type):
    """Shapes from metadata only: the reference model is built on the meta device, nothing is written."""
    config_class, model_class = reference
    config = preset_config(preset, tts_model_type)
    with torch.device("meta"):
        model = model_class(config_class(**config))
    expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    assert {plan.name: plan.shape for plan in plan_tensors(config)} == expected


def test_released_shapes_are_the_published_ones():
    shapes = {plan.name: plan.shape for plan in plan_tensors(preset_config("0.6b"))}
    assert shapes["talker.model.text_embedding.weight"] == (151936, 2048)
    assert shapes["talker.model.codec_embedding.weight"] == (3072, 1024)
    assert shapes["talker.model.layers.27.self_attn.q_proj.weight"] == (2048, 1024)
    assert shapes["talker.model.layers.27.self_attn.k_proj.weight"] == (1024, 1024)
    assert shapes["talker.model.layers.27.mlp.down_proj.weight"] == (1024, 3072)
    assert shapes["talker.code_predictor.model.layers.4.mlp.up_proj.weight"] == (3072, 1024)
    assert shapes["talker.code_predictor.lm_head.14.weight"] == (2048, 1024)
    assert "talker.code_predictor.small_to_mtp_projection.weight" not in shapes  # equal widths: Identity
    big = {plan.name: plan.shape for plan in plan_tensors(preset_config("1.7b"))}
    assert big["talker.model.layers.0.mlp.gate_proj.weight"] == (8192, 2048)
    assert big["talker.code_predictor.model.codec_embedding.0.weight"] == (2048, 2048)
    assert big["talker.code_predictor.small_to_mtp_projection.weight"] == (1024, 2048)


def test_config_special_ids_are_the_tokenizer_ids(tmp_path):
    directory = write_checkpoint(tmp_path / "ckpt", "tiny", seed=0, with_codec=False)
    config = json.loads((directory / "config.json").read_text())
    tokenizer = TextTokenizer.from_dir(directory)
    assert config["im_start_token_id"] == tokenizer.special_ids[IM_START]
    assert config["tts_pad_token_id"] == tokenizer.special_ids[TTS_PAD]
    assert tokenizer.vocab_size <= config["talker_config"]["text_vocab_size"]
    generation = json.loads((directory / "generation_config.json").read_text())
    assert generation["top_k"] == 50 and generation["temperature"] == 0.9 and generation["repetition_penalty"] == 1.05
    assert generation["subtalker_top_k"] == 50 and generation["subtalker_temperature"] == 0.9


def test_weights_depend_only_on_the_seed(tmp_path):
    first = write_checkpoint(tmp_path / "a", "tiny", seed=7, with_codec=False)
    again = write_checkpoint(tmp_path / "b", "tiny", seed=7, with_codec=False)
    other = write_checkpoint(tmp_path / "c", "tiny", seed=8, with_codec=False)
    for name in ("model.safetensors", "config.json", "tokenizer.json", "vocab.json", "merges.txt"):
        assert sha256(first / name) == sha256(again / name), name
    assert sha256(first / "model.safetensors") != sha256(other / "model.safetensors")
    # A tensor's values do not depend on which other tensors exist (custom_voice vs base share the talker).
    base = write_checkpoint(tmp_path / "d", "tiny", seed=7, tts_model_type="base", with_codec=False)
    name = "talker.model.layers.1.mlp.up_proj.weight"
    with safe_open(first / "model.safetensors", "pt") as a, safe_open(base / "model.safetensors", "pt") as b:
        assert torch.equal(a.get_tensor(name), b.get_tensor(name))


def test_weights_are_scaled_for_lively_logits(tmp_path):
    directory = write_checkpoint(tmp_path / "ckpt", "tiny", seed=0, with_codec=False)
    weights = load_file(directory / "model.safetensors")
    assert weights["talker.model.layers.0.self_attn.q_proj.weight"].std().item() == pytest.approx(0.3, rel=0.05)
    assert torch.equal(weights["talker.model.norm.weight"], torch.ones(64))
    head = weights["talker.codec_head.weight"]
    eos = json.loads((directory / "config.json").read_text())["talker_config"]["codec_eos_token_id"]
    ratio = head[eos].norm() / head[:2048].norm(dim=1).mean()
    assert ratio.item() == pytest.approx(EOS_ROW_GAIN, rel=0.25)


def test_bfloat16_weights_are_the_float32_weights_rounded(tmp_path):
    full = write_checkpoint(tmp_path / "f32", "tiny", seed=3, with_codec=False)
    half = write_checkpoint(tmp_path / "bf16", "tiny", seed=3, dtype="bfloat16", with_codec=False)
    assert json.loads((half / "config.json").read_text())["dtype"] == "bfloat16"
    a, b = load_file(full / "model.safetensors"), load_file(half / "model.safetensors")
    assert set(a) == set(b)
    for name in a:
        assert b[name].dtype == torch.bfloat16
        assert torch.equal(a[name].to(torch.bfloat16), b[name]), name


def test_tiny_preset_writes_in_well_under_a_few_seconds(tmp_path):
    started = time.perf_counter()
    directory = write_checkpoint(tmp_path / "ckpt", "tiny", seed=0)
    assert time.perf_counter() - started < 4.0  # about 0.3 s (1.3 s with the codec) on one busy core
    assert (directory / "speech_tokenizer" / "config.json").is_file()


def test_large_tensors_stream_in_independent_row_blocks(tmp_path):
    plan = TensorPlan("big.weight", (5000, 2048), "normal", std=0.5)  # 10M values: two blocks
    blocks = list(tensor_chunks(plan, seed=1))
    assert len(blocks) == 2 and sum(block.shape[0] for block in blocks) == 5000
    assert not torch.equal(blocks[0][:10], blocks[1][:10])
    values = torch.cat(blocks)
    assert values.std().item() == pytest.approx(0.5, rel=0.01)
    path = tmp_path / "big.safetensors"
    write_safetensors(path, [("big.weight", plan.shape)], torch.float32, lambda _: tensor_chunks(plan, 1))
    assert torch.equal(load_file(path)["big.weight"], values)


def test_progress_line_reports_on_stderr(capsys, tmp_path):
    write_checkpoint(tmp_path / "ckpt", "tiny", seed=0, with_codec=False, show_progress=True)
    assert "writing model.safetensors: 100%" in capsys.readouterr().err
    stream = io.StringIO()
    progress = ProgressLine("label", 4 * 1024**3, stream)
    progress.advance(1024**3)
    assert "label:  25% (1.00 of 4.00 GB)" in stream.getvalue()


def test_a_failed_write_leaves_no_file(tmp_path):
    path = tmp_path / "model.safetensors"

    def too_few(_index):
        yield torch.zeros(3)

    with pytest.raises(ValueError, match="chunks hold 3 elements, expected 4"):
        write_safetensors(path, [("x", (2, 2))], torch.float32, too_few)
    assert list(tmp_path.iterdir()) == []


def test_bad_requests_raise_typed_errors(tmp_path):
    with pytest.raises(PresetError, match="unknown preset 'huge'") as info:
        write_checkpoint(tmp_path / "a", "huge", seed=0, with_codec=False)
    assert info.value.code == "unknown_preset"
    with pytest.raises(PresetError, match="unknown checkpoint type") as info:
        write_checkpoint(tmp_path / "a", "tiny", seed=0, tts_model_type="clone", with_codec=False)
    assert info.value.code == "unknown_model_type"
    with pytest.raises(CheckpointInitError, match="unknown dtype") as info:
        write_checkpoint(tmp_path / "a", "tiny", seed=0, dtype="float16", with_codec=False)
    assert info.value.code == "unknown_dtype"
    with pytest.raises(CheckpointInitError, match="seed must be a non-negative integer") as info:
        write_checkpoint(tmp_path / "a", "tiny", seed=-1, with_codec=False)
    assert info.value.code == "invalid_seed"
    assert not (tmp_path / "a").exists()


def test_a_non_empty_directory_is_refused_unless_overwrite(tmp_path):
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(CheckpointInitError, match="is not empty") as info:
        write_checkpoint(out, "tiny", seed=0, with_codec=False)
    assert info.value.code == "out_not_empty"
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    write_checkpoint(out, "tiny", seed=0, with_codec=False, overwrite=True)
    assert (out / "model.safetensors").is_file()
