"""The reference-audio work in a child process (what decode does on CUDA, forced here on the CPU): the same prompts
as the cloner in this process, its refusals with their codes, and a child that dies failing only the prompt it was
computing, with the next prompt served by a new child."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
import torch

from services.decode.voice_work import ProcessPromptMaker, VoiceWorkLost, uses_process
from services.model.loader import load_model
from services.model.text_tokenizer import TextTokenizer
from services.model.voice.cloner import VoiceCloner
from services.model.voice.errors import ReferenceAudioError
from tests.support.reference_audio_files import tone

pytestmark = pytest.mark.timeout(180)

REF_TEXT = "This is how I sound."


@pytest.fixture
async def maker(tiny_base_checkpoint: Path):
    made = ProcessPromptMaker(tiny_base_checkpoint, torch.float32, "cpu", TextTokenizer.from_dir(tiny_base_checkpoint))
    try:
        await made.ready()
        yield made
    finally:
        made.close()


async def test_the_child_makes_the_prompts_this_process_would(maker, tiny_base_checkpoint):
    cloner = VoiceCloner.load(load_model(tiny_base_checkpoint), TextTokenizer.from_dir(tiny_base_checkpoint))
    samples = tone(2.0, 16000)[:, 0]
    for ref_text, x_vector_only in ((REF_TEXT, False), (None, True)):
        got = await maker.make_prompt(samples, 16000, ref_text, x_vector_only)
        expected = cloner.make_prompt(samples, 16000, ref_text, x_vector_only)
        assert torch.equal(got.speaker_embedding, expected.speaker_embedding)
        assert (got.ref_codes is None) == x_vector_only == (expected.ref_codes is None)
        if not x_vector_only:
            assert torch.equal(got.ref_codes, expected.ref_codes) and got.ref_text_ids == expected.ref_text_ids


async def test_a_refusal_in_the_child_arrives_with_its_code(maker):
    with pytest.raises(ReferenceAudioError) as refused:
        await maker.make_prompt(tone(0.2, 24000)[:, 0], 24000, REF_TEXT, False)
    assert refused.value.code == "ref_audio_too_short" and "too short" in refused.value.message


async def test_a_dead_child_fails_one_prompt_and_the_next_gets_a_new_child(maker):
    samples = tone(2.0, 24000)[:, 0]
    [child] = maker.process_ids
    os.kill(child, signal.SIGKILL)
    with pytest.raises(VoiceWorkLost, match="retry"):
        await maker.make_prompt(samples, 24000, None, True)
    prompt = await maker.make_prompt(samples, 24000, None, True)
    assert prompt.speaker_embedding.shape[0] > 0
    assert maker.process_ids and child not in maker.process_ids


async def test_two_children_are_loaded_before_ready_returns_and_serve_prompts_at_once(tiny_base_checkpoint):
    maker = ProcessPromptMaker(tiny_base_checkpoint, torch.float32, "cpu", TextTokenizer.from_dir(tiny_base_checkpoint),
                               workers=2)
    try:
        await maker.ready()
        children = maker.process_ids
        assert len(children) == 2, "both children started and loaded before the first voice"
        samples = [tone(2.0, 16000, seed=n)[:, 0] for n in range(4)]
        prompts = await asyncio.gather(*(maker.make_prompt(s, 16000, REF_TEXT, False) for s in samples))
        cloner = VoiceCloner.load(load_model(tiny_base_checkpoint), TextTokenizer.from_dir(tiny_base_checkpoint))
        for got, heard in zip(prompts, samples):
            expected = cloner.make_prompt(heard, 16000, REF_TEXT, False)
            assert torch.equal(got.speaker_embedding, expected.speaker_embedding)
            assert torch.equal(got.ref_codes, expected.ref_codes)
        assert sorted(maker.process_ids) == sorted(children)
    finally:
        maker.close()


def test_auto_means_a_process_on_cuda_only():
    assert uses_process("auto", "cuda:0") and not uses_process("auto", "cpu")
    assert uses_process("process", "cpu") and not uses_process("thread", "cuda")
