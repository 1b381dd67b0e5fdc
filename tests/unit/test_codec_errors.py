"""Bad codes, bad states and broken checkpoints fail with typed errors that name the problem."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.model.codec import (
    CodecCheckpointError,
    CodecConfigError,
    CodecInputError,
    load_codec_decoder,
)
from services.random_checkpoint.codec_writer import write_codec_checkpoint


@pytest.fixture(scope="module")
def pristine_dir(tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    return write_codec_checkpoint(tmp_path_factory.mktemp("codec_ok"), "tiny", seed=1)


@pytest.fixture(scope="module")
def decoder(pristine_dir):
    return load_codec_decoder(pristine_dir)


@pytest.fixture
def broken_dir(pristine_dir, tmp_path) -> Path:
    """A private copy of the checkpoint for a test to damage."""
    return Path(shutil.copytree(pristine_dir, tmp_path / "speech_tokenizer"))


def _rewrite_weights(directory: Path, edit) -> None:
    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def _rewrite_config(directory: Path, edit) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize("bad_value", [-1, 2048, 5000])
def test_codes_out_of_range(decoder, bad_value):
    codes = torch.zeros(4, 16, dtype=torch.long)
    codes[2, 5] = bad_value
    with pytest.raises(CodecInputError) as error:
        decoder.decode(codes)
    assert error.value.code == "codes_out_of_range" and "[0, 2048)" in str(error.value)


@pytest.mark.parametrize("shape", [(16,), (4, 15), (4, 17), (1, 4, 16)])
def test_codes_of_wrong_shape(decoder, shape):
    with pytest.raises(CodecInputError) as error:
        decoder.decode(torch.zeros(shape, dtype=torch.long))
    assert error.value.code == "codes_shape" and "[frames, 16]" in str(error.value)


@pytest.mark.parametrize(
    ("codes", "code"),
    [(torch.zeros(4, 16), "codes_dtype"), (torch.zeros(4, 16, dtype=torch.bool), "codes_dtype"), ([[0] * 16], "codes_type")],
)
def test_codes_of_wrong_type(decoder, codes, code):
    with pytest.raises(CodecInputError) as error:
        decoder.decode(codes)
    assert error.value.code == code


def test_rejected_chunk_leaves_the_stream_untouched(decoder):
    codes = torch.randint(0, 2048, (6, 16), generator=torch.Generator().manual_seed(0))
    state = decoder.new_stream()
    first = decoder.decode_chunk(state, codes[:3])
    bad = codes[3:].clone()
    bad[0, 0] = 4096
    with pytest.raises(CodecInputError):
        decoder.decode_chunk(state, bad)
    assert state.num_frames == 3
    rest = decoder.decode_chunk(state, codes[3:])
    assert float((torch.cat([first, rest]) - decoder.decode(codes)).abs().max()) <= 1e-5


def test_state_of_another_decoder(decoder, pristine_dir, tmp_path):
    other_dir = tmp_path / "other"
    shutil.copytree(pristine_dir, other_dir)
    _rewrite_config(other_dir, lambda c: c["decoder_config"].update(num_hidden_layers=1))
    _rewrite_weights(other_dir, lambda t: [t.pop(k) for k in list(t) if ".layers.1." in k and "pre_transformer" in k])
    foreign = load_codec_decoder(other_dir).new_stream()
    codes = torch.zeros(2, 16, dtype=torch.long)
    with pytest.raises(CodecInputError) as error:
        decoder.decode_chunk(foreign, codes)
    assert error.value.code == "foreign_state"
    with pytest.raises(CodecInputError) as error:
        decoder.decode_chunks([decoder.new_stream()], [codes, codes])
    assert error.value.code == "length_mismatch"


def test_missing_config(broken_dir):
    (broken_dir / "config.json").unlink()
    with pytest.raises(CodecConfigError) as error:
        load_codec_decoder(broken_dir)
    assert error.value.code == "missing_file" and "config.json" in str(error.value)


def test_missing_weights_file(broken_dir):
    (broken_dir / "model.safetensors").unlink()
    with pytest.raises(CodecCheckpointError) as error:
        load_codec_decoder(broken_dir)
    assert error.value.code == "missing_file" and "model.safetensors" in str(error.value)


def test_unreadable_weights_file(broken_dir):
    (broken_dir / "model.safetensors").write_bytes(b"\x00\x01 not a safetensors file")
    with pytest.raises(CodecCheckpointError) as error:
        load_codec_decoder(broken_dir)
    assert error.value.code == "unreadable_file" and "model.safetensors" in str(error.value)


def test_missing_tensor(broken_dir):
    _rewrite_weights(broken_dir, lambda t: t.pop("decoder.pre_conv.conv.weight"))
    with pytest.raises(CodecCheckpointError) as error:
        load_codec_decoder(broken_dir)
    message = str(error.value)
    assert error.value.code == "missing_tensor"
    assert "model.safetensors" in message and "decoder.pre_conv.conv.weight" in message


def test_tensor_of_wrong_shape(broken_dir):
    name = "decoder.pre_transformer.layers.1.mlp.up_proj.weight"
    _rewrite_weights(broken_dir, lambda t: t.update({name: torch.zeros(7, 3)}))
    with pytest.raises(CodecCheckpointError) as error:
        load_codec_decoder(broken_dir)
    message = str(error.value)
    assert error.value.code == "tensor_shape_mismatch"
    assert name in message and "(7, 3)" in message and "(64, 32)" in message


def test_tensor_the_config_does_not_describe(broken_dir):
    name = "decoder.pre_transformer.layers.9.mlp.up_proj.weight"
    _rewrite_weights(broken_dir, lambda t: t.update({name: torch.zeros(64, 32)}))
    with pytest.raises(CodecCheckpointError) as error:
        load_codec_decoder(broken_dir)
    assert error.value.code == "unexpected_tensor" and name in str(error.value)


def test_integer_tensor(broken_dir):
    name = "decoder.pre_conv.conv.bias"
    _rewrite_weights(broken_dir, lambda t: t.update({name: torch.zeros(t[name].shape, dtype=torch.int32)}))
    with pytest.raises(CodecCheckpointError) as error:
        load_codec_decoder(broken_dir)
    assert error.value.code == "invalid_dtype" and name in str(error.value)


def test_sharded_checkpoint_with_a_missing_shard(broken_dir):
    tensors = load_file(str(broken_dir / "model.safetensors"))
    (broken_dir / "model.safetensors").unlink()
    names = sorted(tensors)
    save_file({n: tensors[n] for n in names[::2]}, str(broken_dir / "model-00001-of-00002.safetensors"))
    weight_map = {n: f"model-0000{1 + i % 2}-of-00002.safetensors" for i, n in enumerate(names)}
    (broken_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CodecCheckpointError) as error:
        load_codec_decoder(broken_dir)
    assert error.value.code == "missing_file" and "model-00002-of-00002.safetensors" in str(error.value)


@pytest.mark.parametrize(
    ("edit", "code", "named"),
    [
        (lambda c: c["decoder_config"].update(hidden_size="wide"), "invalid_field", "decoder_config.hidden_size"),
        (lambda c: c["decoder_config"].update(upsample_rates=[]), "invalid_field", "decoder_config.upsample_rates"),
        (lambda c: c["decoder_config"].pop("codebook_dim"), "missing_field", "decoder_config.codebook_dim"),
        (lambda c: c.pop("decoder_config"), "missing_field", "decoder_config"),
        (lambda c: c.update(model_type="qwen3_tts_tokenizer_25hz"), "unsupported_model_type", "model_type"),
        (lambda c: c.update(decode_upsample_rate=960), "inconsistent_config", "decode_upsample_rate"),
        (lambda c: c["decoder_config"].update(hidden_act="gelu"), "invalid_field", "decoder_config.hidden_act"),
    ],
)
def test_invalid_config(broken_dir, edit, code, named):
    _rewrite_config(broken_dir, edit)
    with pytest.raises(CodecConfigError) as error:
        load_codec_decoder(broken_dir)
    assert error.value.code == code
    assert named in str(error.value) and "config.json" in str(error.value)


def test_config_that_is_not_json(broken_dir):
    (broken_dir / "config.json").write_text("{ not json")
    with pytest.raises(CodecConfigError) as error:
        load_codec_decoder(broken_dir)
    assert error.value.code == "invalid_json"


def test_writer_rejects_unknown_preset_dtype_and_seed(tmp_path):
    with pytest.raises(CodecConfigError) as error:
        write_codec_checkpoint(tmp_path, "7b", seed=0)
    assert error.value.code == "unknown_preset" and "tiny" in str(error.value)
    with pytest.raises(CodecConfigError) as error:
        write_codec_checkpoint(tmp_path, "tiny", seed=0, dtype="float16")
    assert error.value.code == "unsupported_dtype"
    with pytest.raises(CodecConfigError) as error:
        write_codec_checkpoint(tmp_path, "tiny", seed=-1)
    assert error.value.code == "invalid_seed"
