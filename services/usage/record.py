"""One request's usage record, made from its terminal event and its `accepted` event.

The terminal event says what the client received (a finished request's audio; a failed one's audio sent before the
failure, `frames` of it, and one error); the `accepted` event, which the admitting gateway publishes, says who asked
(tenant), for which model, and how many characters.
"""

from __future__ import annotations

from messages.audio_format import FRAMES_PER_SECOND
from messages.events import Accepted, Failed, Finished, TerminalEvent
from messages.usage import UsageRecord


def usage_record(terminal: TerminalEvent, accepted: Accepted | None) -> UsageRecord:
    """The record of the request `terminal` ended. Without its `accepted` event the tenant and model are unknown
    (""), and the characters are what decode counted (a finished request's usage), else 0."""
    if isinstance(terminal, Finished):
        audio_seconds, outcome, code = terminal.audio_seconds, "finished", None
    else:
        audio_seconds, outcome, code = _audio_sent(terminal), "failed", terminal.code.value
    if accepted is not None:
        tenant, model, characters = accepted.tenant, accepted.model, accepted.text_chars
    else:
        characters = terminal.usage.input_chars if isinstance(terminal, Finished) else 0
        tenant, model = "", ""
    return UsageRecord(request_id=terminal.request_id, at=terminal.at, tenant=tenant, model=model,
                       characters=characters, audio_seconds=audio_seconds, outcome=outcome, code=code)


def _audio_sent(failed: Failed) -> float:
    """Seconds of audio a failed request's chunks held: the frames voiced before the failure."""
    return failed.frames / FRAMES_PER_SECOND
