"""Typed errors of the vocoder service; each carries a machine-readable `code`."""

from __future__ import annotations

from messages.errors import ErrorCode


class VocoderError(Exception):
    """Base of the vocoder's errors."""

    code: ErrorCode = ErrorCode.INTERNAL


class UndecodableCodes(VocoderError):
    """A CodesChunk that parsed but cannot be decoded (wrong shape, codes outside the codebook): termed."""

    code = ErrorCode.BAD_MESSAGE


class MissingCodes(VocoderError):
    """CODES lacks chunks a request needs (expired past the stream's max age, or never published)."""

    code = ErrorCode.INTERNAL



class CodecFailure(VocoderError):
    """The codec raised while decoding (a model error, e.g. out of device memory): the request fails."""

    code = ErrorCode.MODEL_ERROR
