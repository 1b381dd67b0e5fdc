"""EngineConfig / StageConfig validation, and the block manager's bookkeeping."""

from __future__ import annotations

import pytest

from services.engine.block_manager import BlockManager
from services.engine.config import EngineConfig, PreemptionMode, StageConfig, StageKind
from services.engine.errors import BlockPoolError, ConfigError


def test_engine_config_defaults_and_limits() -> None:
    config = EngineConfig(kv_cache_blocks=64)
    assert config.block_size == 16 and config.max_num_seqs == 64
    with pytest.raises(AttributeError):
        config.block_size = 8  # frozen


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({}, "exactly one of kv_cache_blocks"),
        ({"kv_cache_blocks": 8, "gpu_memory_fraction": 0.5}, "exactly one of kv_cache_blocks"),
        ({"kv_cache_blocks": 0}, "kv_cache_blocks"),
        ({"gpu_memory_fraction": 1.5}, "gpu_memory_fraction"),
        ({"kv_cache_blocks": 8, "block_size": 0}, "block_size"),
        ({"kv_cache_blocks": 8, "max_num_seqs": True}, "max_num_seqs"),
        ({"kv_cache_blocks": 8, "max_num_seqs": 8, "max_num_batched_tokens": 4}, "max_num_batched_tokens"),
        ({"kv_cache_blocks": 8, "max_model_len": -1}, "max_model_len"),
    ],
)
def test_engine_config_rejects_bad_values(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment) as info:
        EngineConfig(**kwargs)
    assert info.value.code == "invalid_config"


def test_talker_stage_defaults_to_allow_and_accepts_strings() -> None:
    assert StageConfig(StageKind.TALKER).preemption_mode is PreemptionMode.ALLOW
    declared = StageConfig("talker", recompute_preemption="fail")
    assert declared.kind is StageKind.TALKER and declared.preemption_mode is PreemptionMode.FAIL


@pytest.mark.parametrize("kind", ["code_predictor", "vocoder", "prefill"])
def test_preemption_declared_on_a_non_autoregressive_stage_is_rejected(kind: str) -> None:
    with pytest.raises(ConfigError, match="not autoregressive"):
        StageConfig(kind, recompute_preemption="allow")
    assert StageConfig(kind).recompute_preemption is None
    with pytest.raises(ConfigError, match="no preemption mode"):
        StageConfig(kind).preemption_mode


def test_stage_config_rejects_unknown_values() -> None:
    with pytest.raises(ConfigError, match="'allow' or 'fail'"):
        StageConfig("talker", recompute_preemption="sometimes")
    with pytest.raises(ConfigError, match="kind must be one of"):
        StageConfig("mixer")


def test_blocks_are_counted_shared_and_returned() -> None:
    manager = BlockManager(num_blocks=4, block_size=2)
    table: list[int] = []
    assert manager.append(table, 3) and len(table) == 2 and manager.num_free_blocks == 2
    assert manager.append(table, 4) and len(table) == 2  # still fits in two blocks
    other = manager.share(table)
    assert [manager.ref_count(b) for b in table] == [2, 2]
    manager.free(other)
    assert manager.num_free_blocks == 2 and other == []
    manager.free(table)
    assert manager.num_free_blocks == 4 and table == []
    with pytest.raises(BlockPoolError, match="freed twice"):
        manager.free([0])


def test_append_is_all_or_nothing() -> None:
    manager = BlockManager(num_blocks=3, block_size=4)
    first: list[int] = []
    assert manager.append(first, 8)
    second: list[int] = []
    assert not manager.can_append(second, 9)
    assert not manager.append(second, 9)
    assert second == [] and manager.num_free_blocks == 1
    with pytest.raises(BlockPoolError, match="only 1 free"):
        manager.allocate(2)
    with pytest.raises(BlockPoolError, match="it is free"):
        manager.share([2])
