"""Checkpoint loading: what loads (single file, shards, base checkpoints with their speaker encoder), and the
clear errors for everything that does not (missing files, malformed or mismatched checkpoints, bad requests)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from services.model.errors import CheckpointError, RequestError, UnsupportedModelError
from services.model.generate import generate
from services.model.loader import load_model
from services.model.prompt import PromptRequest, assistant_text
from services.model.sampling import SamplingParams
from tests.support.model_fixtures import reference_checkpoint

Q_PROJ = "talker.model.layers.0.self_attn.q_proj.weight"
GREEDY = (SamplingParams(temperature=0.0), SamplingParams(temperature=0.0))


def _copy(name: str, tmp_path: Path) -> Path:
    target = tmp_path / name
    shutil.copytree(reference_checkpoint(name).directory, target)
    return target


def _edit_config(directory: Path, edit) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


def _edit_weights(directory: Path, edit) -> None:
    path = directory / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def _request(name: str, text: str = "hello the voice", **kwargs) -> PromptRequest:
    ids = reference_checkpoint(name).tokenizer.encode(assistant_text(text))
    return PromptRequest(tuple(ids), **kwargs)


@pytest.mark.parametrize("name", ["custom_voice", "voice_design", "sharded", "base"])
def test_loaded_weights_equal_the_reference(name):
    reference = reference_checkpoint(name).model.state_dict()
    model = load_model(reference_checkpoint(name).directory)
    assert torch.equal(model.talker.model.layers[1].mlp.up_proj.weight, reference["talker.model.layers.1.mlp.up_proj.weight"])
    assert torch.equal(model.talker.codebook_embedding[14].weight, reference["talker.code_predictor.model.codec_embedding.14.weight"])
    assert torch.equal(model.code_predictor.lm_head[3].weight, reference["talker.code_predictor.lm_head.3.weight"])
    # Tables used by both modules are loaded once.
    assert model.code_predictor.codec_embedding[0].weight.data_ptr() == model.talker.codebook_embedding[0].weight.data_ptr()
    assert model.code_predictor.first_embedding.weight.data_ptr() == model.talker.codec_embedding.weight.data_ptr()


def test_base_checkpoint_parses_fully_but_refuses_to_generate():
    model = load_model(reference_checkpoint("base").directory)
    reference = reference_checkpoint("base").model.state_dict()
    expected = {name for name in reference if name.startswith("speaker_encoder.")}
    assert set(model.speaker_encoder) == expected
    for name in expected:
        assert torch.equal(model.speaker_encoder[name], reference[name]), name
    with pytest.raises(UnsupportedModelError, match="base .*voice-cloning"):
        generate(model, _request("base", speaker=None), 4, *GREEDY)


@pytest.mark.parametrize("missing", ["config.json", "generation_config.json"])
def test_missing_json_file_is_named(tmp_path, missing):
    directory = _copy("custom_voice", tmp_path)
    (directory / missing).unlink()
    with pytest.raises(CheckpointError, match=f"{missing}: file is missing") as error:
        load_model(directory)
    assert error.value.code == "bad_checkpoint"


def test_missing_weights_are_named(tmp_path):
    directory = _copy("custom_voice", tmp_path)
    (directory / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors and no model.safetensors.index.json"):
        load_model(directory)


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match="config.json: file is missing"):
        load_model(tmp_path / "nowhere")


def test_malformed_json_is_named(tmp_path):
    directory = _copy("custom_voice", tmp_path)
    (directory / "config.json").write_text("{ not json")
    with pytest.raises(CheckpointError, match="config.json: not valid JSON"):
        load_model(directory)


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda c: c["talker_config"].pop("hidden_size"), "field talker_config.hidden_size: missing"),
        (lambda c: c.update(tts_model_type="karaoke"), "field tts_model_type: 'karaoke' is not one of"),
        (lambda c: c["talker_config"].update(num_key_value_heads=3), "num_key_value_heads: 3 does not divide"),
        (lambda c: c["talker_config"]["spk_id"].update(alice=5000), r"spk_id.alice: 5000 is not an id"),
        (lambda c: c["talker_config"]["spk_is_dialect"].update(chen="klingon"), "'klingon' is not a language"),
        (lambda c: c["talker_config"].update(use_sliding_window=True), "sliding-window attention is not supported"),
        (lambda c: c["talker_config"]["code_predictor_config"].update(hidden_size="wide"), "code_predictor_config.hidden_size: expected int"),
    ],
)
def test_malformed_config_names_the_field(tmp_path, edit, message):
    directory = _copy("custom_voice", tmp_path)
    _edit_config(directory, edit)
    with pytest.raises(CheckpointError, match=message) as error:
        load_model(directory)
    assert "config.json" in str(error.value)


def test_config_that_does_not_match_the_weights_names_file_and_tensor(tmp_path):
    directory = _copy("custom_voice", tmp_path)
    _edit_config(directory, lambda c: c["talker_config"].update(num_attention_heads=8))
    with pytest.raises(CheckpointError, match=r"model.safetensors: tensor 'talker.model.layers.0.self_attn.q_proj.weight': shape \[64, 64\] does not match the config's \[128, 64\]"):
        load_model(directory)


def test_wrong_shape_names_file_and_tensor(tmp_path):
    directory = _copy("custom_voice", tmp_path)
    _edit_weights(directory, lambda t: t.update({Q_PROJ: t[Q_PROJ][:32]}))
    with pytest.raises(CheckpointError, match=rf"model.safetensors: tensor '{Q_PROJ}': shape \[32, 64\]") as error:
        load_model(directory)
    assert error.value.tensor == Q_PROJ and error.value.file.endswith("model.safetensors")


def test_missing_tensor_is_named(tmp_path):
    directory = _copy("custom_voice", tmp_path)
    _edit_weights(directory, lambda t: t.pop("talker.code_predictor.lm_head.7.weight"))
    with pytest.raises(CheckpointError, match=r"tensor 'talker.code_predictor.lm_head.7.weight': missing"):
        load_model(directory)


def test_unexpected_tensor_is_named(tmp_path):
    directory = _copy("custom_voice", tmp_path)
    _edit_weights(directory, lambda t: t.update({"talker.model.layers.9.mlp.up_proj.weight": torch.zeros(2, 2)}))
    with pytest.raises(CheckpointError, match=r"tensor 'talker.model.layers.9.mlp.up_proj.weight': unexpected"):
        load_model(directory)


def test_wrong_speaker_encoder_shape_is_named(tmp_path):
    directory = _copy("base", tmp_path)
    name = "speaker_encoder.fc.weight"
    _edit_weights(directory, lambda t: t.update({name: t[name][:, :10].contiguous()}))
    with pytest.raises(CheckpointError, match=rf"tensor '{name}': shape"):
        load_model(directory)


def test_integer_tensor_is_refused(tmp_path):
    directory = _copy("custom_voice", tmp_path)
    _edit_weights(directory, lambda t: t.update({Q_PROJ: t[Q_PROJ].to(torch.int32)}))
    with pytest.raises(CheckpointError, match=rf"tensor '{Q_PROJ}': dtype I32 is not a floating-point type"):
        load_model(directory)


def test_truncated_weights_file_is_named(tmp_path):
    directory = _copy("custom_voice", tmp_path)
    path = directory / "model.safetensors"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="model.safetensors: not a readable safetensors file"):
        load_model(directory)


def test_index_naming_a_missing_shard_is_named(tmp_path):
    directory = _copy("sharded", tmp_path)
    shard = sorted(directory.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=rf"model.safetensors.index.json: tensor '.*': names shard '{shard.name}'"):
        load_model(directory)


def test_index_placing_a_tensor_in_the_wrong_shard_is_named(tmp_path):
    directory = _copy("sharded", tmp_path)
    index_path = directory / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shards = sorted(set(index["weight_map"].values()))
    moved = next(n for n, f in index["weight_map"].items() if f == shards[0])
    index["weight_map"][moved] = shards[1]
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=rf"{shards[1]}: tensor '{moved}': model.safetensors.index.json places"):
        load_model(directory)


@pytest.fixture(scope="module")
def custom_voice():
    return load_model(reference_checkpoint("custom_voice").directory)


@pytest.mark.parametrize(
    "kwargs,code,message",
    [
        ({"speaker": "mallory"}, "unknown_speaker", "unknown speaker 'mallory'; this model knows: alice, bob, chen"),
        ({"speaker": "alice", "language": "klingon"}, "unknown_language", "unknown language 'klingon'"),
        # Dialects are reached through their speakers, never named directly (the reference's rule).
        ({"speaker": "alice", "language": "sichuan_dialect"}, "unknown_language", "unknown language 'sichuan_dialect'"),
    ],
)
def test_bad_request_is_refused_with_its_code(custom_voice, kwargs, code, message):
    with pytest.raises(RequestError, match=message) as error:
        generate(custom_voice, _request("custom_voice", **kwargs), 4, *GREEDY)
    assert error.value.code == code


@pytest.mark.parametrize("text", ["", " "])
def test_empty_text_is_refused(custom_voice, text):
    request = _request("custom_voice", text=text.strip(), speaker="alice")
    with pytest.raises(RequestError, match="the text is empty") as error:
        generate(custom_voice, request, 4, *GREEDY)
    assert error.value.code == "empty_text"


@pytest.mark.parametrize("field", ["text_ids", "instruct_ids"])
def test_token_ids_outside_the_vocabulary_are_refused(custom_voice, field):
    request = _request("custom_voice", speaker="alice", instruct_ids=(1, 2))
    bad = replace(request, **{field: getattr(request, field) + (custom_voice.config.talker.text_vocab_size,)})
    with pytest.raises(RequestError, match="token ids outside the text vocabulary") as error:
        generate(custom_voice, bad, 4, *GREEDY)
    assert error.value.code == "bad_token_ids"


def test_voice_design_takes_no_speaker():
    model = load_model(reference_checkpoint("voice_design").directory)
    with pytest.raises(RequestError, match="a voice_design model takes no speaker"):
        generate(model, _request("voice_design", speaker="alice"), 4, *GREEDY)
