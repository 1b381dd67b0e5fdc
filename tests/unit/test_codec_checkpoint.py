"""Checkpoints written by `write_codec_checkpoint`: the released layout, loadable by the
reference, decoding there exactly as here, deterministic, and audible."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from services.model.codec import load_codec_decoder
from services.random_checkpoint.codec_presets import codec_preset
from services.random_checkpoint.codec_writer import codec_checkpoint_shapes, write_codec_checkpoint
from tests.support.codec_reference import reference_classes
from tests.support.oracle.reference import load as load_reference

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    return write_codec_checkpoint(tmp_path_factory.mktemp("written"), "tiny", seed=7)


def _codes(num_frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (num_frames, 16), generator=torch.Generator().manual_seed(seed))


def _file_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(str(path), framework="pt") as handle:
        return {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}


def _reference_shapes(config_dict: dict) -> dict[str, tuple[int, ...]]:
    config_class, model_class = reference_classes()
    config = config_class(**{k: v for k, v in config_dict.items() if k not in ("architectures", "model_type")})
    with torch.device("meta"):
        model = model_class(config)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def test_written_layout(tiny_dir):
    assert sorted(p.name for p in tiny_dir.iterdir()) == ["config.json", "model.safetensors", "preprocessor_config.json"]
    assert tiny_dir.name == "speech_tokenizer"
    assert _file_shapes(tiny_dir / "model.safetensors") == codec_checkpoint_shapes("tiny")


@pytest.mark.parametrize("preset", ["tiny", "0.6b", "1.7b"])
def test_writer_layout_equals_the_reference_model(preset):
    """Encoder and decoder tensors: the same names and shapes as the reference builds from the
    same config (built on the meta device, so the released sizes cost nothing)."""
    assert codec_checkpoint_shapes(preset) == _reference_shapes(codec_preset(preset))


def test_released_presets_have_the_released_codec_shapes():
    shapes = codec_checkpoint_shapes("0.6b")
    assert codec_preset("0.6b") == codec_preset("1.7b"), "both releases ship one codec"
    assert shapes["decoder.quantizer.rvq_first.vq.layers.0._codebook.embedding_sum"] == (2048, 256)
    assert len([n for n in shapes if n.startswith("decoder.quantizer.rvq_rest.vq.layers.")]) == 2 * 15
    assert shapes["decoder.pre_transformer.layers.7.self_attn.q_proj.weight"] == (1024, 512)
    assert shapes["decoder.pre_conv.conv.weight"] == (1024, 512, 3)
    assert shapes["decoder.decoder.0.conv.weight"] == (1536, 1024, 7)
    assert shapes["decoder.decoder.6.conv.weight"] == (1, 96, 7)
    assert shapes["encoder.quantizer.acoustic_residual_vector_quantizer.layers.30.codebook.embed_sum"] == (2048, 256)


def test_reference_loads_every_tensor_and_decodes_the_same(tiny_dir):
    """Through the reference's public loader (which also needs preprocessor_config.json)."""
    qwen_tts = load_reference()
    tokenizer = qwen_tts.Qwen3TTSTokenizer.from_pretrained(str(tiny_dir))
    _, model_class = reference_classes()
    _, info = model_class.from_pretrained(str(tiny_dir), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]

    codes = _codes(25, seed=1)
    reference_wavs, sample_rate = tokenizer.decode({"audio_codes": codes})
    audio = load_codec_decoder(tiny_dir).decode(codes)
    assert sample_rate == 24000
    assert float((audio - torch.from_numpy(reference_wavs[0])).abs().max()) <= TOLERANCE


def test_written_audio_is_audible(tiny_dir):
    decoder = load_codec_decoder(tiny_dir)
    codes = _codes(25, seed=2)
    audio = decoder.decode(codes)
    rms = float(audio.pow(2).mean().sqrt())
    assert 0.05 < rms < 0.5, f"rms {rms}"
    assert abs(float(audio.mean())) < 0.05, "no DC offset"
    assert float((audio.abs() >= 1.0).float().mean()) < 0.01, "barely any clipping"
    per_frame_rms = audio.view(25, -1).pow(2).mean(dim=1).sqrt()
    assert float(per_frame_rms.min()) > 0.01, "every frame is audible"
    other = codes.clone()
    other[10:] = _codes(15, seed=3)
    difference = float((decoder.decode(other) - audio)[10 * 1920 :].pow(2).mean().sqrt())
    assert difference > 0.5 * rms, "the audio follows the codes"


def test_same_seed_same_bytes_other_seed_other_weights(tiny_dir, tmp_path):
    again = write_codec_checkpoint(tmp_path / "again", "tiny", seed=7)
    other = write_codec_checkpoint(tmp_path / "other", "tiny", seed=8)

    def digest(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()

    for name in ("model.safetensors", "config.json", "preprocessor_config.json"):
        assert digest(again / name) == digest(tiny_dir / name)
    assert digest(other / "model.safetensors") != digest(tiny_dir / "model.safetensors")


def test_bfloat16_checkpoint(tmp_path):
    directory = write_codec_checkpoint(tmp_path, "tiny", seed=7, dtype="bfloat16")
    tensors = load_file(str(directory / "model.safetensors"))
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    assert json.loads((directory / "config.json").read_text())["dtype"] == "bfloat16"

    _, model_class = reference_classes()
    reference = model_class.from_pretrained(str(directory), dtype=torch.float32)
    codes = _codes(10, seed=4)
    with torch.no_grad():
        expected = reference.decode(codes[None]).audio_values[0]
    audio = load_codec_decoder(directory, dtype=torch.float32).decode(codes)
    assert float((audio - expected).abs().max()) <= TOLERANCE
    assert float(load_codec_decoder(directory, dtype=torch.bfloat16).decode(codes).pow(2).mean().sqrt()) > 0.05


def test_sharded_checkpoint_loads_like_the_single_file(tiny_dir, tmp_path):
    tensors = load_file(str(tiny_dir / "model.safetensors"))
    names = sorted(tensors)
    shards = {f"model-0000{i + 1}-of-00002.safetensors": names[i::2] for i in range(2)}
    for shard, shard_names in shards.items():
        save_file({n: tensors[n] for n in shard_names}, str(tmp_path / shard))
    weight_map = {n: shard for shard, shard_names in shards.items() for n in shard_names}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (tmp_path / "config.json").write_text((tiny_dir / "config.json").read_text())

    codes = _codes(9, seed=5)
    sharded = load_codec_decoder(tmp_path).decode(codes)
    assert torch.equal(sharded, load_codec_decoder(tiny_dir).decode(codes))
