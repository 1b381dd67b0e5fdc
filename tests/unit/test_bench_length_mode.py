"""The realistic length mode: frames from the prompt's words, sent as min = max new tokens, labelled."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.bench.length_mode import FRAMES_PER_WORD, realistic_frames, realistic_seconds
from loadtest.bench.workload import PayloadError, RequestShape, load_prompts
from services.cli import bench as bench_cli

SHARED_PROMPTS = Path("/work/shared/data/prompts_en.tsv")


def test_frames_follow_the_word_count():
    assert FRAMES_PER_WORD == 6.35
    assert realistic_frames("One.") == 6
    assert realistic_frames("Four words in   this.") == round(4 * 6.35)
    assert realistic_frames("") == 1, "never an empty request"
    texts = ["a " * words for words in range(1, 14)]
    assert [realistic_frames(text) for text in texts] == sorted(realistic_frames(text) for text in texts)


@pytest.mark.skipif(not SHARED_PROMPTS.exists(), reason=f"{SHARED_PROMPTS} is not on this machine")
def test_the_shared_prompts_average_four_and_a_half_seconds():
    seconds = [realistic_seconds(prompt.text) for prompt in load_prompts(SHARED_PROMPTS)]
    assert sum(seconds) / len(seconds) == pytest.approx(4.5, abs=0.05)


def test_the_request_carries_min_and_max_new_tokens_and_no_ignore_eos():
    shape = RequestShape(realistic_length=True)
    body = shape.payload("Seven words make a sentence this long.", 3)
    assert body["min_new_tokens"] == body["max_new_tokens"] == round(7 * 6.35)
    assert "ignore_eos" not in body
    assert shape.length_mode == "realistic" and "6.35 frames" in shape.describe_length()
    assert shape.to_dict()["length_mode"] == "realistic"
    with pytest.raises(PayloadError, match="one length mode"):
        RequestShape(realistic_length=True, fixed_frames=10)


def _parse(*argv: str):
    import argparse

    parser = argparse.ArgumentParser()
    bench_cli.configure(parser)
    return parser.parse_args(list(argv))


def test_the_cli_picks_the_length_mode():
    assert bench_cli.build_config(_parse("--length-mode", "realistic")).shape.length_mode == "realistic"
    assert bench_cli.build_config(_parse("--fixed-frames", "9")).shape.length_mode == "fixed"
    assert bench_cli.build_config(_parse()).shape.length_mode == "natural"
    for argv in (("--length-mode", "fixed"), ("--length-mode", "realistic", "--fixed-frames", "9")):
        with pytest.raises(PayloadError):
            bench_cli.build_config(_parse(*argv))
