"""Typed errors of the codec decoder, each with a machine-readable `code`."""

from __future__ import annotations


class CodecError(Exception):
    """Base class: `code` is stable and machine-readable, the message is for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class CodecConfigError(CodecError):
    """`speech_tokenizer/config.json` is missing, unreadable, or has an invalid field."""


class CodecCheckpointError(CodecError):
    """A weight file is missing, unreadable, or lacks a tensor / has one of the wrong shape."""


class CodecInputError(CodecError):
    """Codes passed to a decode call have the wrong type, shape or range, or a state is misused."""
