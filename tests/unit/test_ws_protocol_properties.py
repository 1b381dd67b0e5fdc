"""Property tests of the WebSocket client-message parser (hypothesis): any text, and any JSON value, either parses
to a client message or is refused with an AdmissionError carrying a specific code (never `internal`), never with
any other exception; so the session answers every bad message with an `error` event and keeps the socket open."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from messages.errors import ErrorCode
from services.gateway.errors import AdmissionError
from services.gateway.requests.body import SynthesisFields
from services.gateway.ws.protocol import MESSAGE_KINDS, MESSAGE_TYPES, parse_client_message

BOUNDED = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SPECIFIC_CODES = {ErrorCode.INVALID_JSON, ErrorCode.INVALID_TYPE, ErrorCode.OUT_OF_RANGE, ErrorCode.INVALID_VALUE,
                  ErrorCode.UNKNOWN_FIELD, ErrorCode.MISSING_FIELD, ErrorCode.UNSUPPORTED_FORMAT}
FIELD_NAMES = ["type", "text", "request_id", "last_seq", "input", "voice", "seed", "format", "language",
               "temperature", "top_p", "max_new_tokens", "text_mode", "model", "id"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20) | st.sampled_from(MESSAGE_TYPES),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.sampled_from(FIELD_NAMES) | st.text(max_size=10), children, max_size=6),
    max_leaves=25)
messages = st.builds(lambda kind, fields: {**fields, "type": kind}, st.sampled_from(MESSAGE_TYPES) | st.none(),
                     st.dictionaries(st.sampled_from(FIELD_NAMES), json_values, max_size=5))


def _parses_or_refuses(raw: str) -> None:
    try:
        message = parse_client_message(raw)
    except AdmissionError as refused:
        assert refused.code in SPECIFIC_CODES, (refused.code, refused.message)
        assert refused.message
        return
    assert isinstance(message, (SynthesisFields, *MESSAGE_KINDS.values()))


@BOUNDED
@given(raw=st.text(max_size=200))
def test_any_text_parses_or_is_refused_with_a_specific_code(raw):
    _parses_or_refuses(raw)


@BOUNDED
@given(value=json_values)
def test_any_json_value_parses_or_is_refused_with_a_specific_code(value):
    _parses_or_refuses(json.dumps(value))


@BOUNDED
@given(message=messages)
def test_any_typed_message_parses_or_is_refused_with_a_specific_code(message):
    _parses_or_refuses(json.dumps({key: value for key, value in message.items() if value is not None
                                   or key != "type"}))


@settings(max_examples=60, deadline=None)
@given(message=messages, field=st.sampled_from(FIELD_NAMES), depth=st.integers(1, 30_000),
       opener=st.sampled_from(['[', '{"a":']))
def test_any_nesting_depth_in_any_field_is_refused_with_a_specific_code(message, field, depth, opener):
    # Deep enough for msgspec's depth guard (a RecursionError) and still inside the socket's 64 KiB limit.
    closer = "]" if opener == "[" else "}"
    nested = opener * depth + "0" + closer * depth
    head = json.dumps({key: value for key, value in message.items() if key != field and value is not None})
    _parses_or_refuses(head[:-1] + ("," if head != "{}" else "") + f'"{field}": {nested}}}')
