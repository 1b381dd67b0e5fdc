"""Sentence segmentation of incremental text (services/gateway/requests/sentences.py)."""

from __future__ import annotations

import pytest

from services.gateway.requests.sentences import SentenceSegmenter


def pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def test_a_sentence_is_handed_out_once_its_end_is_certain():
    segmenter = SentenceSegmenter(4096)
    assert segmenter.append("Hello there.") == []  # "there.5"? not yet certain
    assert segmenter.append(" How") == ["Hello there."]
    assert segmenter.append(" are you? I am") == ["How are you?"]
    assert segmenter.pending == " I am"
    assert segmenter.flush() == ["I am"]
    assert segmenter.pending == ""
    assert segmenter.append("Done. ") == []  # the next visible character decides: "Done. and" goes on
    assert segmenter.append("and over.\n") == ["Done. and over."]  # a line break decides at once


@pytest.mark.parametrize("size", [1, 2, 3, 7, 100])
def test_the_same_segments_whatever_the_pieces(size):
    text = 'She said "Stop!" and left. Dr. Smith paid 3.50 dollars… Then: 你好。再见！Done?\nNew line'
    segmenter = SentenceSegmenter(4096)
    segments = [s for piece in pieces(text, size) for s in segmenter.append(piece)] + segmenter.flush()
    assert segments == ['She said "Stop!" and left.', "Dr. Smith paid 3.50 dollars…", "Then: 你好。", "再见！",
                        "Done?", "New line"]


def test_closing_quotes_and_runs_of_terminators_stay_with_their_sentence():
    segmenter = SentenceSegmenter(4096)
    assert segmenter.append('"Really?!" she asked. (Yes.) Next') == ['"Really?!" she asked.', "(Yes.)"]


def test_abbreviations_and_initials_do_not_end_a_sentence():
    segmenter = SentenceSegmenter(4096)
    assert segmenter.append("Mr. J. Doe met Prof. X today. Then") == ["Mr. J. Doe met Prof. X today."]


def test_nothing_speakable_is_dropped():
    segmenter = SentenceSegmenter(4096)
    assert segmenter.append("... !! \n \n") == []
    assert segmenter.flush() == []


def test_a_sentence_over_the_limit_is_cut_at_a_space():
    segmenter = SentenceSegmenter(20)
    segments = segmenter.append("one two three four five six seven eight nine")
    assert segments == ["one two three four", "five six seven eight"]
    assert all(len(s) <= 20 for s in segments)
    assert segmenter.flush() == ["nine"]
    assert SentenceSegmenter(5).append("abcdefghijkl") == ["abcde", "fghij"]


def test_clear_drops_the_buffer():
    segmenter = SentenceSegmenter(4096)
    segmenter.append("half a sent")
    segmenter.clear()
    assert segmenter.flush() == []


def test_a_limit_below_one_is_refused():
    with pytest.raises(ValueError, match="max_chars"):
        SentenceSegmenter(0)
