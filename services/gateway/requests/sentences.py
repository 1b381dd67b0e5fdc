"""Sentence segmentation of text that arrives in pieces (an LLM writing as the user listens).

Text is cut into segments as soon as a sentence boundary is certain, so each sentence can be synthesized while the
rest is still being written. A boundary is certain when a terminator (`.`, `!`, `?`, `…`, possibly followed by
closing quotes or brackets) is followed by whitespace and then by anything but a lower-case letter ('"Stop!" he
said' goes on), at a CJK terminator (`。！？；`, which need no space after them), or at a line break. A `.` after a
common abbreviation or a single initial ("Dr.", "J.") is not a boundary. So a boundary is decided only once the next
visible character has arrived ("3." may become "3.5"): until then the text waits for the next piece, or a flush.
"""

from __future__ import annotations

TERMINATORS = frozenset(".!?…")
CJK_TERMINATORS = frozenset("。！？；")
CLOSERS = frozenset("\"')]}»”’」』")
# Lower-cased words that end with a period without ending a sentence.
ABBREVIATIONS = frozenset({"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "e.g", "i.e", "no", "fig",
                           "approx", "inc", "ltd", "co"})


class SentenceSegmenter:
    """Buffers incremental text and hands out complete sentences.

    Every segment is stripped, holds something speakable (a letter or digit), and has at most `max_chars`
    characters: a sentence longer than that is cut at its last space before the limit.
    """

    def __init__(self, max_chars: int) -> None:
        if max_chars < 1:
            raise ValueError(f"max_chars must be >= 1, got {max_chars}")
        self.max_chars = max_chars
        self._text = ""
        self._scanned = 0  # positions before this one hold no boundary

    @property
    def pending(self) -> str:
        """Text received and not yet handed out."""
        return self._text

    def append(self, text: str) -> list[str]:
        """Add `text`; returns the segments it completed, in order."""
        self._text += text
        segments: list[str] = []
        while (end := self._next_boundary()) is not None:
            segments += self._take(end)
        while len(self._text) > self.max_chars:
            segments += self._take(self._forced_cut())
        return segments

    def flush(self) -> list[str]:
        """Everything still buffered, as segments (boundary or not)."""
        segments: list[str] = []
        while len(self._text) > self.max_chars:
            segments += self._take(self._forced_cut())
        return segments + self._take(len(self._text))

    def clear(self) -> None:
        """Drop the buffered text (the client cancelled)."""
        self._text, self._scanned = "", 0

    def _take(self, end: int) -> list[str]:
        segment, self._text, self._scanned = self._text[:end].strip(), self._text[end:], 0
        return [segment] if any(ch.isalnum() for ch in segment) else []

    def _next_boundary(self) -> int | None:
        """The end (exclusive) of the first complete sentence, or None while none is certain yet."""
        text = self._text
        for i in range(self._scanned, len(text)):
            ch = text[i]
            if ch == "\n" or ch in CJK_TERMINATORS:
                return self._after_closers(i + 1)
            if ch in TERMINATORS and not self._is_abbreviation(i):
                end = self._after_closers(self._after_run(i))
                following = len(text) - len(text[end:].lstrip())  # the next visible character
                if "\n" in text[end:following]:
                    return end
                if following == len(text):
                    self._scanned = i  # undecided: look again when more text arrives
                    return None
                if following > end and not text[following].islower():
                    return end
        self._scanned = len(text)
        return None

    def _after_run(self, i: int) -> int:
        while i < len(self._text) and self._text[i] in TERMINATORS:
            i += 1
        return i

    def _after_closers(self, i: int) -> int:
        while i < len(self._text) and self._text[i] in CLOSERS:
            i += 1
        return i

    def _is_abbreviation(self, i: int) -> bool:
        if self._text[i] != ".":
            return False
        word = self._text[:i].rsplit(maxsplit=1)[-1] if self._text[:i].strip() else ""
        word = word.lstrip("\"'([{«“‘").lower()
        return len(word) == 1 and word.isalpha() or word in ABBREVIATIONS

    def _forced_cut(self) -> int:
        """Where to cut a sentence longer than `max_chars`: after its last space before the limit, else at it."""
        space = self._text.rfind(" ", 0, self.max_chars + 1)
        return space + 1 if space > 0 else self.max_chars
