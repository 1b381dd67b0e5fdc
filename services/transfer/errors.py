"""The one error a KV transfer raises, with a machine-readable code (`messages.errors.TransferCode`)."""

from __future__ import annotations

from messages.errors import TransferCode


class TransferFailed(Exception):
    """A fetch (or a descriptor) failed; `code` says why, the message what to do.

    Attributes:
        code: `stalled` (the watchdog fired), `unknown` (the peer no longer holds the offer), `unreachable` (no peer
            answers, or UCX lost it), `mismatch` (sizes disagree), `malformed` (a descriptor that does not decode).
        out_released: whether the caller's buffer is free to reuse or free. True unless a receive had already
            started landing and UCX did not settle its cancellation in time; then the agent keeps the buffer
            referenced (fenced) until the receive settles or the agent closes, and the caller must not reuse it.
    """

    def __init__(self, code: TransferCode, message: str, *, out_released: bool = True) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.out_released = out_released
