"""Typed errors of the model package: each carries a machine-readable code and a message a person can act on."""

from __future__ import annotations

from pathlib import Path


class ModelError(Exception):
    """Base of every error the model package raises on purpose."""

    code = "model_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class CheckpointError(ModelError):
    """A checkpoint file is missing, unreadable, malformed, or does not match its config.

    `file` names the file at fault and `tensor` the tensor, where there is one.
    """

    code = "bad_checkpoint"

    def __init__(self, file: str | Path, message: str, tensor: str | None = None) -> None:
        self.file = str(file)
        self.tensor = tensor
        where = f"{self.file}: tensor {tensor!r}" if tensor else self.file
        super().__init__(f"{where}: {message}")


class UnsupportedModelError(ModelError):
    """The checkpoint is valid but asks for something this implementation does not do (yet)."""

    code = "unsupported_model"


class RequestError(ModelError):
    """A synthesis request the model cannot serve as asked: unknown speaker or language, empty text."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
