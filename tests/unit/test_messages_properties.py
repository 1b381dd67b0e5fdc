"""Property tests of the bus decoders (hypothesis): any bytes either decode to a valid message of the type asked for
or raise the message layer's DecodeError, never anything else; and every valid message survives a round trip."""

from __future__ import annotations

import msgspec
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from messages import (SCHEMA_VERSION, AudioChunk, CodesChunk, CodesEnd, CodesMessage, DecodeError, ErrorCode,
                      ErrorInfo, Failed, Finished, LifecycleEvent, SamplingSpec, Stage, SynthesisRequest,
                      TakeoverMarker, TerminalEvent, Usage, decode, encode)
from messages.events import Accepted, Started
from messages.mtp import StepReply, StepRequest
from messages.records import CancelRecord, Lease, OwnerRecord, PartitionOwner
from messages.requests import RedecodeReply, RedecodeRequest

BOUNDED = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

DECODED_TYPES = [SynthesisRequest, CodesMessage, TerminalEvent, LifecycleEvent, AudioChunk, RedecodeRequest,
                 RedecodeReply, OwnerRecord, Lease, PartitionOwner, CancelRecord, StepRequest, StepReply]
TAGS = ["synthesis_request", "codes", "codes_end", "takeover", "audio", "accepted", "finished", "failed", "owner",
        "lease", "cancel", "mtp_step", "mtp_reply", "redecode_request"]

ids = st.from_regex(r"\A[A-Za-z0-9_-]{1,40}\Z")
counts = st.integers(0, 2**31)
times = st.floats(0, 4e9, allow_nan=False)
words = st.text(max_size=30)
msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=40) | st.sampled_from(TAGS),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=12) | st.sampled_from(
        ["type", "schema", "id", "request_id", "text", "model", "seq", "codes", "dtype"]), children, max_size=6),
    max_leaves=30)


def _decodes_or_refuses(data: bytes, expected) -> None:
    try:
        message = decode(data, expected)
    except DecodeError as refused:
        assert refused.code in (ErrorCode.BAD_MESSAGE, ErrorCode.UNSUPPORTED_VERSION)
        return
    assert message.schema == SCHEMA_VERSION
    assert decode(encode(message), expected) == message  # what was accepted is a valid message


@BOUNDED
@given(data=st.binary(max_size=200), expected=st.sampled_from(DECODED_TYPES))
def test_any_bytes_decode_or_raise_decode_error(data, expected):
    _decodes_or_refuses(data, expected)


@BOUNDED
@given(value=msgpack_values, expected=st.sampled_from(DECODED_TYPES))
def test_any_msgpack_value_decodes_or_raises_decode_error(value, expected):
    _decodes_or_refuses(msgspec.msgpack.encode(value), expected)


@BOUNDED
@given(value=st.lists(msgpack_values, max_size=8), tag=st.sampled_from(TAGS), expected=st.sampled_from(DECODED_TYPES))
def test_a_known_tag_with_any_fields_decodes_or_raises_decode_error(value, tag, expected):
    _decodes_or_refuses(msgspec.msgpack.encode([tag, *value]), expected)
    fields = {f"f{i}": item for i, item in enumerate(value)}
    _decodes_or_refuses(msgspec.msgpack.encode({"type": tag, **fields}), expected)


sampling = st.builds(SamplingSpec, temperature=st.none() | st.floats(0, 5), top_k=st.none() | st.integers(0, 100),
                     top_p=st.none() | st.floats(0.01, 1), repetition_penalty=st.none() | st.floats(0.1, 3))
synthesis_requests = st.builds(
    SynthesisRequest, id=ids, model=words, text=st.text(min_size=1, max_size=200), speaker=st.none() | words,
    language=words, instruct=st.none() | words, text_mode=st.sampled_from(["non-streaming", "streaming"]),
    seed=st.integers(0, 2**63 - 1), sampling=sampling, subtalker_sampling=st.none() | sampling,
    max_new_tokens=st.none() | st.integers(1, 10_000), ignore_eos=st.booleans(),
    initial_chunk_frames=st.none() | st.integers(1, 64), deadline=st.none() | times, created_at=times,
    min_new_tokens=st.none() | st.integers(0, 100))
codes_chunks = st.builds(
    lambda request_id, seq, first, epoch, frames: CodesChunk.from_frames(
        request_id=request_id, seq=seq, first_frame=first, epoch=epoch, frames=np.array(frames).reshape(-1, 16)),
    ids, counts, counts, counts,
    st.integers(1, 4).flatmap(lambda n: st.lists(st.integers(-2**31, 2**31 - 1), min_size=16 * n,
                                                 max_size=16 * n)))
errors = st.builds(ErrorInfo, code=st.sampled_from(ErrorCode), stage=st.sampled_from(Stage), message=words)
usages = st.builds(Usage, input_chars=counts, input_tokens=counts, prompt_tokens=counts, output_frames=counts)
codes_ends = st.one_of(
    st.builds(CodesEnd, request_id=ids, seq=counts, epoch=counts, reason=st.just("finished"), total_frames=counts,
              stop=st.sampled_from(["eos", "length", None]), usage=usages),
    st.builds(CodesEnd, request_id=ids, seq=counts, epoch=counts, reason=st.just("failed"), total_frames=counts,
              error=errors, usage=usages))
takeovers = st.builds(TakeoverMarker, request_id=ids, epoch=counts, replica=ids, resume_frame=counts, next_seq=counts)
audio_chunks = st.builds(AudioChunk, request_id=ids, seq=counts, first_sample=counts,
                         sample_rate=st.integers(1, 96_000), pcm=st.binary(max_size=64).map(lambda b: b[:len(b) // 2 * 2]))
terminals = st.one_of(
    st.builds(Finished, request_id=ids, at=times, frames=counts, audio_seconds=times, chunk_count=counts,
              stop=st.sampled_from(["eos", "length"]), usage=usages),
    st.builds(Failed, request_id=ids, at=times, stage=st.sampled_from(Stage), code=st.sampled_from(ErrorCode),
              reason=words, frames=counts, chunk_count=counts))
lifecycle = st.one_of(
    terminals,
    st.builds(Accepted, request_id=ids, at=times, model=words, seed=st.integers(0, 2**63 - 1), text_chars=counts),
    st.builds(Started, request_id=ids, at=times, replica=ids, epoch=counts, queued_s=times))

ROUND_TRIPS = [(synthesis_requests, SynthesisRequest), (codes_chunks, CodesMessage), (codes_ends, CodesMessage),
               (takeovers, CodesMessage), (audio_chunks, AudioChunk), (terminals, TerminalEvent),
               (lifecycle, LifecycleEvent)]


@BOUNDED
@given(data=st.data(), case=st.sampled_from(ROUND_TRIPS))
def test_every_valid_message_survives_a_round_trip(data, case):
    strategy, expected = case
    message = data.draw(strategy)
    assert decode(encode(message), expected) == message
