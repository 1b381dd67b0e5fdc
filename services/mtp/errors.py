"""Typed errors of the mtp service and its client; each carries a machine-readable `code`."""

from __future__ import annotations

from collections.abc import Sequence

from messages.errors import ErrorCode


class StepRefused(ValueError):
    """A replica refuses a step (it names the problem); the replica keeps serving.

    `code`: bad_message (unreadable), invalid_request (rows the model cannot take), fingerprint_mismatch (made for
    other weights or another dtype), queue_full (the replica's queue is at its bound), model_error."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class MtpClientError(RuntimeError):
    """Base of the client's errors."""

    code: ErrorCode = ErrorCode.INTERNAL


class NoMtpReplicas(MtpClientError):
    """No live mtp replica appeared within the wait."""

    code = ErrorCode.REPLICA_LOST


class RemoteStepFailed(MtpClientError):
    """Every attempt of a step failed: each replica tried (in order) with why it failed.

    Attributes:
        step_id: the step.
        tried: (replica, reason) per attempt; empty when no live replica was left to try.
    """

    code = ErrorCode.REPLICA_LOST

    def __init__(self, step_id: int, tried: Sequence[tuple[str, str]], why: str) -> None:
        attempts = "; ".join(f"{replica}: {reason}" for replica, reason in tried) or "no replica tried"
        super().__init__(f"mtp step {step_id} failed: {why} (tried {attempts})")
        self.step_id = step_id
        self.tried = tuple(tried)

    @property
    def replicas(self) -> tuple[str, ...]:
        return tuple(replica for replica, _ in self.tried)


class StepRejected(MtpClientError):
    """A replica refused the step itself (unreadable, or rows the model cannot take): resending cannot help.

    Attributes:
        replica: who refused it.
        refusal: the replica's code.
    """

    def __init__(self, step_id: int, replica: str, refusal: ErrorCode, message: str) -> None:
        super().__init__(f"mtp step {step_id} refused by {replica} ({refusal}): {message}")
        self.code = refusal
        self.replica = replica
        self.refusal = refusal
