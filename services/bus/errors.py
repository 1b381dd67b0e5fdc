"""Typed errors of the bus runtime; each carries a machine-readable `code`."""

from __future__ import annotations

from messages.errors import ErrorCode, FaultCode

# JetStream API error codes the runtime interprets (nats-server's errors.json).
JS_WRONG_LAST_SEQUENCE = 10071
JS_WRONG_LAST_SEQUENCE_CONSTANT = 10164  # the same refusal when the expectation was 0
JS_MAX_MESSAGES_EXCEEDED = 10077  # "maximum messages exceeded" on a discard-new stream
# Deleting a message that is gone (e.g. acked off a work queue) is refused with these, not with a NotFoundError:
JS_NO_MESSAGE_FOUND = 10057  # file storage (code 500)
JS_SEQUENCE_NOT_FOUND = 10043  # memory storage (code 400)
MESSAGE_GONE_CODES = (JS_NO_MESSAGE_FOUND, JS_SEQUENCE_NOT_FOUND)
WRONG_LAST_SEQUENCE_CODES = (JS_WRONG_LAST_SEQUENCE, JS_WRONG_LAST_SEQUENCE_CONSTANT)


class BusError(Exception):
    """Base of bus runtime errors."""

    code: ErrorCode | FaultCode = FaultCode.BUS_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(message)


class QueueFull(BusError):
    """REQUESTS is at its bound (discard new): the gateway answers 429 with Retry-After."""

    code = ErrorCode.QUEUE_FULL


class StaleOwner(BusError):
    """The server refused a codes publish: another owner appended since (a takeover). Stand down."""

    code = FaultCode.STALE_OWNER

    def __init__(self, message: str, *, subject: str, expected_sequence: int) -> None:
        super().__init__(message)
        self.subject = subject
        self.expected_sequence = expected_sequence


class OwnershipConflict(BusError):
    """A compare-and-set claim lost: someone else wrote the key first."""

    code = FaultCode.OWNERSHIP_CONFLICT


class NotProvisioned(BusError):
    """A stream, consumer or the bucket does not exist: run `voxmesh provision` (or `voxmesh up`)."""

    code = FaultCode.NOT_PROVISIONED


class ProvisionConflict(BusError):
    """An existing stream differs in a way the server cannot update (e.g. retention); fix or delete it by hand."""

    code = FaultCode.PROVISION_CONFLICT


class NatsServerError(BusError):
    """The embedded nats-server could not be found, did not start, or did not stop."""

    code = FaultCode.NATS_SERVER
