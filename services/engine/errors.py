"""Typed errors of the decode engine, each with a machine-readable code."""

from __future__ import annotations


class EngineError(Exception):
    """Base of the engine's errors; `code` is machine-readable."""

    code = "engine_error"


class ConfigError(EngineError, ValueError):
    """An engine or stage configuration value is invalid; the message names the field."""

    code = "invalid_config"


class InvalidRequestError(EngineError, ValueError):
    """A request's engine-level fields are unusable (empty id, frame budget below 1, bad seed, a prompt KV that does
    not fit); the message names the field."""

    code = "invalid_request"


class DuplicateRequestError(EngineError, ValueError):
    """A request id is already known to the engine."""

    code = "duplicate_request"


class BlockPoolError(EngineError, RuntimeError):
    """The block manager was asked for something its state forbids (e.g. freeing a free block)."""

    code = "block_pool"


class RemoteStageFailed(EngineError, RuntimeError):
    """A stage outside this process (the remote code predictor) gave no answer for a step: no request's fault, so
    the step's requests end at once instead of being re-run to find a culprit."""

    code = "remote_stage_failed"
