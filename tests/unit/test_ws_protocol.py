"""The streaming WebSocket's typed messages (services/gateway/ws/protocol.py) and the resume registry's rules
(services/gateway/ws/resume.py), without a socket."""

from __future__ import annotations

import asyncio
import json
import time

import msgspec
import pytest

from services.gateway.errors import AdmissionError
from services.gateway.requests.body import SynthesisFields
from services.gateway.requests.resume_window import ResumeWindow
from services.gateway.ws.protocol import (AudioStart, Cancel, InputDone, InputText, Resume, SessionConfig,
                                          SessionUpdate, encode_event, parse_client_message)
from services.gateway.ws.resume import ParkedRequest, ResumeRefused, ResumeRegistry


def parse(message: dict) -> object:
    return parse_client_message(json.dumps(message))


def test_each_message_type_decodes_to_its_struct():
    assert parse({"type": "input.text", "text": "Hi."}) == InputText(text="Hi.")
    assert parse({"type": "input.done"}) == InputDone()
    assert parse({"type": "cancel"}) == Cancel(request_id=None)
    assert parse({"type": "resume", "request_id": "req_1", "last_seq": 4}) == Resume(request_id="req_1", last_seq=4)
    one_shot = parse({"input": "Hello.", "voice": "ryan"})
    assert isinstance(one_shot, SynthesisFields) and one_shot.input == "Hello."


def test_session_update_takes_every_speech_field_but_input_and_the_format_and_rate():
    speech = {info.name for info in msgspec.structs.fields(SynthesisFields)} - {"input"}
    assert {info.name for info in msgspec.structs.fields(SessionUpdate)} == speech | {"format", "sample_rate"}


def test_session_update_sets_the_rate_each_format_is_served_at():
    config = SessionConfig().updated(parse({"type": "session.update", "format": "pcm_mulaw"}))
    assert (config.sample_rate, config.served_rate()) == (None, 8000)  # G.711's own
    config = config.updated(parse({"type": "session.update", "sample_rate": 16000}))
    assert config.served_rate() == 16000
    config = config.updated(parse({"type": "session.update", "format": "pcm_s16le"}))
    assert config.served_rate() == 16000  # the rate stays across a format change
    assert config.updated(parse({"type": "session.update", "sample_rate": None})).served_rate() == 24000
    with pytest.raises(AdmissionError) as refused:
        config.updated(parse({"type": "session.update", "sample_rate": 12000}))
    assert (refused.value.code, refused.value.param) == ("unsupported_value", "sample_rate")
    assert "format 'pcm_s16le'" in refused.value.message and "44100" in refused.value.message


def test_session_update_changes_only_the_fields_it_names():
    config = SessionConfig().updated(parse({"type": "session.update", "voice": "ryan", "seed": 3}))
    config = config.updated(parse({"type": "session.update", "seed": 4, "format": "pcm_s16le_base64"}))
    assert config.speech == {"voice": "ryan", "seed": 4} and config.format == "pcm_s16le_base64"
    fields = config.fields_for("Hello.")
    assert (fields.input, fields.voice, fields.seed, fields.language) == ("Hello.", "ryan", 4, "auto")


@pytest.mark.parametrize("raw, code, param, words", [
    ("{not json", "invalid_json", None, "not valid JSON"),
    ("[1, 2]", "invalid_type", None, "send a JSON object"),
    ('{"type": "speak"}', "invalid_value", "type", "unknown message type 'speak'"),
    ('{"type": "input.text"}', "missing_field", "text", "missing required field"),
    ('{"type": "input.text", "text": 5}', "invalid_type", "text", "Expected `str`"),
    ('{"type": "session.update", "seed": -1}', "out_of_range", "seed", ">= 0"),
    ('{"type": "session.update", "format": "mp3"}', "unsupported_format", "format",
     "use one of pcm_s16le, pcm_s16le_base64"),
    ('{"type": "session.update", "temprature": 1}', "unknown_field", "temprature", "unknown field"),
    ('{"type": "resume", "request_id": "r", "last_seq": -2}', "out_of_range", "last_seq", ">= 0"),
    ('{"type": "input.text", "text": "' + "x" * 4097 + '"}', "out_of_range", "text", "length <= 4096"),
])
def test_a_bad_message_is_refused_naming_the_field(raw, code, param, words):
    with pytest.raises(AdmissionError) as refused:
        parse_client_message(raw)
    assert (refused.value.code, refused.value.param) == (code, param)
    assert words in refused.value.message


def test_server_events_carry_their_type_tag():
    event = json.loads(encode_event(AudioStart(request_id="req_1", first_seq=3, resumed=True)))
    assert event["type"] == "audio.start" and event["first_seq"] == 3 and event["format"] == "pcm_s16le"


def parked(request_id: str = "req_1", sent: int = 3, left_at: float = 100.0) -> ParkedRequest:
    return ParkedRequest(request_id, partition=0, sent=sent, received=sent, left_at=left_at)


def test_a_parked_request_is_taken_once_within_the_window():
    registry = ResumeRegistry(ResumeWindow(10.0))
    registry.park(parked())
    assert registry.take("req_1", 2, now=105.0).sent == 3
    with pytest.raises(ResumeRefused, match="still streaming on another connection"):
        registry.take("req_1", 2, now=105.0)


def test_after_the_window_the_refusal_says_so():
    registry = ResumeRegistry(ResumeWindow(10.0))
    registry.park(parked())
    with pytest.raises(ResumeRefused) as refused:
        registry.take("req_1", 2, now=110.5)
    assert refused.value.code == "cancelled" and "past the 10s resume window" in refused.value.message


def test_the_window_closes_at_its_length_after_the_client_left():
    window = ResumeWindow(10.0)
    assert window.is_open(100.0, 109.9) and not window.is_open(100.0, 110.0) and window.closes_at(100.0) == 110.0
    with pytest.raises(ValueError, match="must be > 0"):
        ResumeWindow(0.0)


def test_unknown_ids_and_unsent_chunks_are_refused():
    registry = ResumeRegistry(ResumeWindow(10.0))
    registry.park(parked(sent=3))
    with pytest.raises(ResumeRefused, match="not resumable on this gateway"):
        registry.take("req_2", None, now=101.0)
    with pytest.raises(ResumeRefused, match="last_seq 3 was never sent") as refused:
        registry.take("req_1", 3, now=101.0)
    assert refused.value.param == "last_seq"


async def test_a_resume_waits_for_the_old_socket_to_let_go():
    registry = ResumeRegistry(ResumeWindow(10.0))
    registry.attach("req_1")
    # The old socket parks the request only after the claim started (without the wait: "still streaming").
    asyncio.get_running_loop().call_soon(registry.park, parked(left_at=time.time()))
    assert (await registry.claim("req_1", 0)).request_id == "req_1"
