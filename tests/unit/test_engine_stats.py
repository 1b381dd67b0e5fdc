"""The engine answers questions about itself (request counts, KV usage, drain state, room), so the decode service
never reads its scheduler or block manager."""

from __future__ import annotations

import pytest

from services.model.sampling import SamplingParams
from services.engine.engine_request import EngineRequest
from tests.support.engine_helpers import TEXTS, load_tiny, make_request, new_engine

NUM_BLOCKS = 64
MAX_STEPS = 100


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load_tiny(tiny_checkpoint)


def test_the_engine_reports_its_requests_kv_usage_and_drain_state(tiny) -> None:
    model, tokenizer = tiny
    engine = new_engine(model, blocks=NUM_BLOCKS, max_num_seqs=3)
    idle = engine.stats()
    assert (idle.num_waiting, idle.num_running, idle.num_kv_blocks, idle.num_free_kv_blocks) == (0, 0, NUM_BLOCKS,
                                                                                                NUM_BLOCKS)
    assert idle.kv_usage == 0.0 and not idle.is_draining and engine.has_room()

    for request_id, text in zip("ab", TEXTS):
        engine.add_request(EngineRequest(request_id, make_request(tokenizer, text), 5, SamplingParams(), 4))
    queued = engine.stats()
    assert (queued.num_waiting, queued.num_running, queued.num_unfinished) == (2, 0, 2)
    # Below max_num_seqs there is room although two wait: admitted beside a step, they all join the next one.
    assert engine.has_room()
    engine.add_request(EngineRequest("c", make_request(tokenizer, TEXTS[0]), 6, SamplingParams(), 4))
    assert not engine.has_room() and engine.stats().num_unfinished == 3  # max_num_seqs held
    engine.abort_request("c")
    assert engine.num_prompt_tokens("a") > 0 and engine.num_prompt_tokens("unknown") is None

    engine.step()
    running = engine.stats()
    assert (running.num_waiting, running.num_running) == (0, 2) and engine.running_ids() == ["a", "b"]
    assert running.num_used_kv_blocks > 0 and 0.0 < running.kv_usage < 1.0
    assert running.num_used_kv_blocks + running.num_free_kv_blocks == NUM_BLOCKS

    with engine.drain():
        assert engine.is_draining and engine.stats().is_draining and not engine.has_room()
        assert engine.running_ids() == [] and engine.stats().num_waiting == 2  # queued for a faithful replay
    assert not engine.is_draining

    for _ in range(MAX_STEPS):
        if not engine.has_unfinished():
            break
        engine.step()
    done = engine.stats()
    assert (done.num_unfinished, done.num_free_kv_blocks) == (0, NUM_BLOCKS) and engine.has_room()
