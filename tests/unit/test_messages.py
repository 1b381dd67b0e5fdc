"""Every message round-trips through msgpack; anything else is a typed DecodeError."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

import messages as m
from messages.audio_format import SAMPLE_RATE, SAMPLES_PER_FRAME
from messages.base import HotMessage

ERR = m.ErrorInfo(code=m.ErrorCode.CAPACITY, stage=m.Stage.DECODE, message="KV pool too small: raise --kv-blocks")
FRAMES = np.arange(48, dtype=np.int64).reshape(3, 16) * 40

SAMPLES = [
    m.SynthesisRequest(id="req-1", model="Qwen3-TTS-0.6B", text="Hello.", speaker="vivian", language="english",
                       instruct="calm", text_mode="streaming", seed=2**63 - 1,
                       sampling=m.SamplingSpec(temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05),
                       subtalker_sampling=m.SamplingSpec(temperature=0.0), max_new_tokens=300, ignore_eos=True,
                       initial_chunk_frames=2, deadline=1e9 + 30, created_at=1e9),
    m.RedecodeRequest(request_id="req-1", from_seq=4),
    m.RedecodeReply(request_id="req-1", accepted=False, reason="unknown request"),
    m.CodesChunk.from_frames(request_id="req-1", seq=2, first_frame=3, epoch=1, frames=FRAMES),
    m.CodesEnd(request_id="req-1", seq=3, epoch=1, reason="finished", total_frames=9, stop="length",
               usage=m.Usage(input_chars=6, input_tokens=2, prompt_tokens=12, output_frames=9)),
    m.CodesEnd(request_id="req-1", seq=3, epoch=2, reason="failed", total_frames=9, error=ERR),
    m.TakeoverMarker(request_id="req-1", epoch=2, replica="decode-b", resume_frame=9, next_seq=3),
    m.AudioChunk.from_float(request_id="req-1", seq=0, first_sample=0, sample_rate=SAMPLE_RATE,
                            samples=np.linspace(-1.2, 1.2, SAMPLES_PER_FRAME)),
    m.Accepted(request_id="req-1", at=1.5, model="tiny", seed=7, text_chars=6),
    m.Started(request_id="req-1", at=1.5, replica="decode-a", epoch=1, queued_s=0.25),
    m.FirstFrame(request_id="req-1", at=1.5, replica="decode-a"),
    m.FirstAudio(request_id="req-1", at=1.5, replica="vocoder-a"),
    m.Preempted(request_id="req-1", at=1.5, replica="decode-a", frames_done=4, cause="drain"),
    m.Resumed(request_id="req-1", at=1.5, replica="decode-a", frames_done=4),
    m.Migrated(request_id="req-1", at=1.5, from_replica="decode-a", to_replica="decode-b", epoch=2, frames_done=4),
    m.Finished(request_id="req-1", at=1.5, frames=9, audio_seconds=0.72, chunk_count=3, stop="eos",
               usage=m.Usage(output_frames=9)),
    m.Failed(request_id="req-1", at=1.5, stage=m.Stage.VOCODER, code=m.ErrorCode.REPLICA_LOST,
             reason="vocoder vocoder-a died", frames=4, chunk_count=1),
    m.OwnerRecord(request_id="req-1", replica="decode-a", epoch=1, claimed_at=1.5),
    m.Lease(replica="decode-a", service="decode", renewed_at=1.5, ttl_s=3.0),
    m.PartitionOwner(partition=3, replica="vocoder-a", epoch=1, claimed_at=1.5),
    m.CancelRecord(request_id="req-1", code=m.ErrorCode.TIMEOUT, reason="resume window passed", at=1.5),
    m.StepRequest(fingerprint="abc123", step_id=9, num_rows=2, hidden_size=4, hidden_dtype="bfloat16",
                  hidden=bytes(16), c0=[1, 2], seeds=[5, 6], frames=[0, 7], temperature=[0.0, 0.9], top_k=[0, 50],
                  top_p=[1.0, 0.8]),
    m.StepReply(step_id=9, replica="mtp-a", queued_steps=2, queued_rows=5, codes=np.arange(30, dtype="<i2").tobytes()),
    m.StepReply(step_id=None, replica="mtp-a", error=ERR),
    m.PrefillHandoff(request=m.SynthesisRequest(id="req-1", model="tiny", text="x"), fingerprint="abc123",
                     prefill_replica="prefill-a", prompt_tokens=12, transfer=b"\x01\x02", first_frame=list(range(16))),
]


@pytest.mark.parametrize("message", SAMPLES, ids=lambda msg: type(msg).__name__)
def test_round_trip_is_exact(message: m.Message) -> None:
    data = m.encode(message)
    assert m.decode(data, type(message)) == message
    raw = msgspec.msgpack.decode(data)
    if isinstance(message, HotMessage):
        assert isinstance(raw, list) and raw[0] == type(message).__struct_config__.tag
    else:
        assert raw["type"] == type(message).__struct_config__.tag and raw["schema"] == m.SCHEMA_VERSION


def test_unions_dispatch_on_the_tag() -> None:
    on_codes = [s for s in SAMPLES if isinstance(s, m.CodesChunk | m.CodesEnd | m.TakeoverMarker)]
    for message in on_codes:
        assert m.decode(m.encode(message), m.CodesMessage) == message
    events = [s for s in SAMPLES if isinstance(s, m.events.Event)]
    for event in events:
        assert m.decode(m.encode(event), m.LifecycleEvent) == event
    assert isinstance(m.decode(m.encode(SAMPLES[15]), m.TerminalEvent), m.Finished)


def test_codes_and_audio_payload_helpers() -> None:
    chunk = m.CodesChunk.from_frames(request_id="r", seq=0, first_frame=0, epoch=1, frames=FRAMES)
    assert chunk.dtype == "int16" and chunk.num_frames == 3
    np.testing.assert_array_equal(chunk.frames(), FRAMES)
    wide = m.CodesChunk.from_frames(request_id="r", seq=0, first_frame=0, epoch=1, frames=FRAMES * 1000)
    assert wide.dtype == "int32"
    np.testing.assert_array_equal(wide.frames(), FRAMES * 1000)
    primed = m.CodesChunk.from_frames(request_id="r", seq=0, first_frame=0, epoch=1, frames=FRAMES,
                                      context=FRAMES[:2] * 1000)
    assert primed.dtype == "int32" and primed.num_frames == 3 and chunk.context_frames() is None
    np.testing.assert_array_equal(m.decode(m.encode(primed), m.CodesChunk).context_frames(), FRAMES[:2] * 1000)
    with pytest.raises(m.InvalidMessage, match="only chunk 0"):
        m.CodesChunk.from_frames(request_id="r", seq=1, first_frame=3, epoch=1, frames=FRAMES, context=FRAMES)
    audio = SAMPLES[7]
    assert audio.num_samples == SAMPLES_PER_FRAME and audio.samples()[0] == -32767 and audio.samples()[-1] == 32767
    assert m.decode(m.encode(SAMPLES[22]), m.StepReply).rows().shape == (2, 15)


MALFORMED = [
    b"",
    b"\xc1",
    b"\x93\xa5codes",  # truncated array
    msgspec.msgpack.encode(["nope", 1, "r", 0, 0, 1, "int16", bytes(32)]),  # unknown tag
    msgspec.msgpack.encode(["codes", 1, "r.x", 0, 0, 1, "int16", bytes(32)]),  # id with a dot
    msgspec.msgpack.encode(["codes", 1, "r", -1, 0, 1, "int16", bytes(32)]),  # negative seq
    msgspec.msgpack.encode(["codes", 1, "r", 0, 0, 1, "int16", bytes(31)]),  # not whole frames
    msgspec.msgpack.encode(["codes", 1, "r", 0, 0, 1, "int8", bytes(32)]),  # unknown dtype
    msgspec.msgpack.encode(["codes_end", 1, "r", 0, 1, "failed", 0]),  # failed without error
    msgspec.msgpack.encode({"type": "synthesis_request", "schema": 1, "id": "r", "model": "x", "text": ""}),
    msgspec.msgpack.encode({"type": "synthesis_request", "id": "r", "model": "x", "text": "a", "seed": -1}),
]


@pytest.mark.parametrize("data", MALFORMED)
def test_malformed_bytes_raise_decode_error(data: bytes) -> None:
    with pytest.raises(m.DecodeError) as caught:
        m.decode(data, m.SynthesisRequest if b"synthesis_request" in data else m.CodesMessage)
    assert caught.value.code == m.ErrorCode.BAD_MESSAGE


@pytest.mark.parametrize("data, expected, code, request_id", [
    # Another schema version is named as such, whether or not the rest would decode.
    (msgspec.msgpack.encode(["codes", 2, "req_1", 0, 0, 1, "int16", bytes(32)]), m.CodesMessage,
     m.ErrorCode.UNSUPPORTED_VERSION, "req_1"),
    (msgspec.msgpack.encode({"type": "synthesis_request", "schema": 9, "id": "req_2", "voice_v9": {}}),
     m.SynthesisRequest, m.ErrorCode.UNSUPPORTED_VERSION, "req_2"),
    # A readable envelope with a bad body: bad_message, and the request it names.
    (msgspec.msgpack.encode({"type": "synthesis_request", "schema": 1, "id": "req_3", "model": "x", "text": ""}),
     m.SynthesisRequest, m.ErrorCode.BAD_MESSAGE, "req_3"),
    (msgspec.msgpack.encode(["codes", 1, "req_4", 0, 0, 1, "int16", bytes(31)]), m.CodesMessage,
     m.ErrorCode.BAD_MESSAGE, "req_4"),
    # No readable id: an id that cannot be one, or no envelope at all.
    (msgspec.msgpack.encode(["codes", 1, "r.x", 0, 0, 1, "int16", bytes(32)]), m.CodesMessage,
     m.ErrorCode.BAD_MESSAGE, None),
    (b"\x93\xa5codes", m.CodesMessage, m.ErrorCode.BAD_MESSAGE, None),
])
def test_a_refusal_says_what_the_envelope_still_tells(data, expected, code, request_id) -> None:
    with pytest.raises(m.DecodeError) as caught:
        m.decode(data, expected)
    assert (caught.value.code, caught.value.request_id) == (code, request_id)


def test_text_over_the_limit_is_refused() -> None:
    data = msgspec.msgpack.encode({"type": "synthesis_request", "id": "r", "model": "x", "text": "a" * 4097})
    with pytest.raises(m.DecodeError, match="4096"):
        m.decode(data, m.SynthesisRequest)


def test_a_request_is_not_a_codes_message() -> None:
    with pytest.raises(m.DecodeError):
        m.decode(m.encode(SAMPLES[0]), m.CodesMessage)


def test_inconsistent_construction_is_refused() -> None:
    with pytest.raises(m.InvalidMessage):
        m.CodesChunk.from_frames(request_id="r", seq=0, first_frame=0, epoch=1, frames=np.zeros((2, 15)))
    with pytest.raises(m.InvalidMessage):
        m.CodesEnd(request_id="r", seq=0, epoch=1, reason="finished", total_frames=0, error=ERR)
    with pytest.raises(m.InvalidMessage):
        m.StepRequest(fingerprint="f", step_id=0, num_rows=2, hidden_size=4, hidden_dtype="float32",
                      hidden=bytes(32), c0=[1], seeds=[1, 2], frames=[0, 0], temperature=[0, 0], top_k=[0, 0],
                      top_p=[1, 1])
