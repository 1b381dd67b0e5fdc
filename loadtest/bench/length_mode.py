"""The realistic length mode: each request's audio length from its text, for random-weight checkpoints, which never
stop by themselves.

A request of `w` words asks for `round(FRAMES_PER_WORD * w)` codec frames (at least one), sent as `min_new_tokens` =
`max_new_tokens` = that count: the end of speech is held back until then and the frame budget ends it there, so a
random checkpoint makes exactly that length and a trained one is cut to it. Unlike the fixed mode (one length for
every request), lengths then vary with the prompts the way real speech does.

FRAMES_PER_WORD is chosen so the shared prompts (../shared/data/prompts_en.tsv: 593 sentences, 8.87 words on average,
1 to 13) average 4.5 s of audio, the middle of the public method's 4.2-4.6 s per Seed-TTS English prompt:
4.5 s x 12.5 frames/s = 56.25 frames, / 8.87 words = 6.35 frames a word (0.51 s, about 118 words a minute). The
mean over that file comes out at 4.50 s (0.48 s to 6.64 s).
"""

from __future__ import annotations

from messages.audio_format import FRAMES_PER_SECOND

FRAMES_PER_WORD = 6.35
LENGTH_MODES = ("natural", "fixed", "realistic")


def word_count(text: str) -> int:
    """Words as whitespace separates them."""
    return len(text.split())


def realistic_frames(text: str) -> int:
    """The frames a request saying `text` asks for in the realistic mode."""
    return max(1, round(FRAMES_PER_WORD * word_count(text)))


def realistic_seconds(text: str) -> float:
    return realistic_frames(text) / FRAMES_PER_SECOND


def describe_realistic() -> str:
    return (f"realistic length: min_new_tokens = max_new_tokens = round({FRAMES_PER_WORD:g} frames x words) "
            f"({FRAMES_PER_WORD / FRAMES_PER_SECOND * 1000:.0f} ms of audio a word)")
