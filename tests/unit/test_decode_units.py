"""The decode service's pure parts: the chunking rule, settings, and admission against a real checkpoint's files."""

from __future__ import annotations

import time

import numpy as np
import pytest

from messages.base import ErrorInfo, Usage
from messages.errors import ErrorCode, Stage
from messages.requests import SamplingSpec
from services.decode.codes_stream import ChunkRule, CodesStream
from services.decode.request_check import RequestRefused, ServedModel, admit, predictor_sampling_params, sampling_params
from services.decode.settings import DecodeSettings
from services.engine.config import PreemptionMode
from services.model.config import GenerationDefaults, load_config
from services.model.text_tokenizer import TextTokenizer
from services.runtime.settings_schema import SettingsError, resolve
from tests.support.decode_stubs import synthesis


def frame(value: int) -> np.ndarray:
    return np.full(16, value, dtype=np.int64)


def stream(initial: int = 2, later: int = 8) -> CodesStream:
    return CodesStream("req", 1, publisher=None, rule=ChunkRule(initial, later))  # publishing is not used here


def test_chunks_ramp_from_initial_to_later_and_the_rest_goes_last():
    codes = stream()
    sizes = []
    for index in range(27):
        codes.add_frame(index, frame(index))
        sizes += [chunk.num_frames for chunk in codes.take_ready_chunks()]
    assert sizes == [2, 2, 4, 8, 8] and codes.num_pending_frames == 3
    last = codes.take_rest()
    assert [c.num_frames for c in last] == [3] and last[0].seq == 5 and last[0].first_frame == 24
    np.testing.assert_array_equal(last[0].frames()[:, 0], [24, 25, 26])
    end = codes.finished("length", Usage(output_frames=27))
    assert (end.seq, end.total_frames, end.reason, end.stop) == (6, 27, "finished", "length")


def test_only_the_first_chunk_carries_the_context_frames():
    codes = stream()
    codes.context = np.stack([frame(100), frame(101), frame(102)])
    for index in range(4):
        codes.add_frame(index, frame(index))
    first, second = codes.take_ready_chunks()
    np.testing.assert_array_equal(first.context_frames()[:, 0], [100, 101, 102])
    assert first.num_frames == 2 and second.context_frames() is None


def test_chunk_ramp_respects_odd_initial_and_small_later_sizes():
    assert [ChunkRule(3, 8).size(seq) for seq in range(5)] == [3, 3, 6, 8, 8]
    assert [ChunkRule(1, 1).size(seq) for seq in range(3)] == [1, 1, 1]
    assert [ChunkRule(4, 2).size(seq) for seq in range(3)] == [4, 4, 4]


def test_a_request_ending_before_its_first_full_chunk_sends_one_short_chunk_then_a_failure():
    codes = stream(initial=4)
    codes.add_frame(0, frame(7))
    assert codes.take_ready_chunks() == []
    (only,) = codes.take_rest()
    assert (only.seq, only.first_frame, only.num_frames) == (0, 0, 1)
    error = ErrorInfo(code=ErrorCode.PREEMPTED, stage=Stage.DECODE, message="truncated")
    end = codes.failed(error, Usage())
    assert (end.seq, end.total_frames, end.error) == (1, 1, error)


def test_frames_must_arrive_in_order():
    codes = stream()
    codes.add_frame(0, frame(0))
    with pytest.raises(ValueError, match="frame 2 arrived, expected frame 1"):
        codes.add_frame(2, frame(2))


def test_settings_come_from_flags_and_environment_and_map_to_the_engine():
    settings = resolve(DecodeSettings, None, {"VOXMESH_KV_CACHE_BLOCKS": "64", "VOXMESH_MAX_NUM_SEQS": "4",
                                              "VOXMESH_RECOMPUTE_PREEMPTION": "fail"})
    config = settings.engine_config()
    assert (config.kv_cache_blocks, config.max_num_seqs) == (64, 4)
    assert settings.preemption_mode is PreemptionMode.FAIL


@pytest.mark.parametrize("environ, message", [
    ({"VOXMESH_RECOMPUTE_PREEMPTION": "sometimes"}, "allow, fail"),
    ({"VOXMESH_CHUNK_FRAMES": "0"}, "--chunk-frames"),
    ({"VOXMESH_MAX_NUM_SEQS": "64", "VOXMESH_MAX_NUM_BATCHED_TOKENS": "8"}, "--max-num-batched-tokens"),
    ({"VOXMESH_RUNAWAY_FRAMES_PER_CHAR": "nan"}, "--runaway-frames-per-char"),
])
def test_bad_settings_name_the_flag(environ, message):
    with pytest.raises(SettingsError, match=message):
        resolve(DecodeSettings, None, environ)


def test_the_runaway_guard_grows_with_the_text_and_the_lowest_cap_wins():
    settings = DecodeSettings(runaway_min_frames=10, runaway_frames_per_char=2.0, max_new_frames=500)
    assert settings.frame_budget(5, None) == 20
    assert settings.frame_budget(5, 7) == 7
    assert settings.frame_budget(4000, None) == 500


@pytest.fixture(scope="module")
def served(tiny_checkpoint) -> ServedModel:
    config, generation = load_config(tiny_checkpoint)
    return ServedModel("tiny", config, generation, TextTokenizer.from_dir(tiny_checkpoint))


def test_admission_tokenizes_budgets_and_keeps_the_text_mode(served):
    settings = DecodeSettings(runaway_min_frames=10, runaway_frames_per_char=1.0)
    admission = admit(synthesis("a", "hello the voice", frames=1000, text_mode="streaming"), served, settings)
    assert admission.max_new_frames == 10 + len("hello the voice")
    assert admission.prompt.non_streaming is False and admission.prompt.speaker == "ryan"
    assert admission.input_tokens == len(admission.prompt.text_ids) - 8 > 0
    assert admission.params.temperature == 0.0


@pytest.mark.parametrize("fields, words", [({"speaker": "nobody"}, "nobody"), ({"language": "klingon"}, "klingon")])
def test_admission_refuses_what_the_checkpoint_does_not_know(served, fields, words):
    with pytest.raises(RequestRefused) as caught:
        admit(synthesis("a", "hello", frames=5, **fields), served, DecodeSettings())
    assert caught.value.code == ErrorCode.INVALID_REQUEST and words in caught.value.message


def test_unset_sampling_fields_come_from_the_generation_config():
    defaults = GenerationDefaults(do_sample=False, top_k=7, top_p=0.5, temperature=0.7, repetition_penalty=1.2)
    params = sampling_params(SamplingSpec(top_k=3), defaults)
    assert (params.temperature, params.top_k, params.top_p, params.repetition_penalty) == (0.0, 3, 0.5, 1.2)
    assert sampling_params(SamplingSpec(), GenerationDefaults()).temperature == 0.9


def test_a_request_past_its_deadline_is_refused_with_timeout(served):
    late = synthesis("late", "hello", frames=5, deadline=time.time() - 1.0)
    with pytest.raises(RequestRefused) as caught:
        admit(late, served, DecodeSettings())
    assert caught.value.code == ErrorCode.TIMEOUT


def test_code_predictor_sampling_follows_subtalker_defaults_and_a_greedy_talker():
    defaults = GenerationDefaults(temperature=0.9, top_k=50, subtalker_temperature=0.7, subtalker_top_k=20,
                                  subtalker_top_p=0.95)
    sampled = sampling_params(SamplingSpec(), defaults)
    predictor = predictor_sampling_params(None, sampled, defaults)
    assert (predictor.temperature, predictor.top_k, predictor.top_p, predictor.repetition_penalty) == (
        0.7, 20, 0.95, 1.0)
    greedy = predictor_sampling_params(None, sampling_params(SamplingSpec(temperature=0), defaults), defaults)
    assert greedy.temperature == 0.0
    chosen = predictor_sampling_params(SamplingSpec(temperature=1.1, top_k=5), sampled, defaults)
    assert (chosen.temperature, chosen.top_k, chosen.top_p) == (1.1, 5, 0.95)
    with pytest.raises(RequestRefused, match="subtalker sampling"):
        predictor_sampling_params(SamplingSpec(top_k=-1), sampled, defaults)


def test_gpu_memory_fraction_sizes_the_pool_instead_of_a_block_count():
    by_blocks = DecodeSettings(kv_cache_blocks=77).engine_config()
    assert (by_blocks.kv_cache_blocks, by_blocks.gpu_memory_fraction) == (77, None)
    by_fraction = DecodeSettings(device="cuda", gpu_memory_fraction=0.6, kv_cache_blocks=77).engine_config()
    assert (by_fraction.kv_cache_blocks, by_fraction.gpu_memory_fraction) == (None, 0.6)
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(SettingsError, match="gpu-memory-fraction"):
            DecodeSettings(device="cuda", gpu_memory_fraction=bad)
    with pytest.raises(SettingsError, match="needs a CUDA"):
        DecodeSettings(device="cpu", gpu_memory_fraction=0.5)
