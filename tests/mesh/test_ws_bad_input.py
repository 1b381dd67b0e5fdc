"""The WebSocket's bad-input catalog on the real mesh (`voxmesh up`: gateway, decode, vocoder, nats-server, the tiny
checkpoint): each bad message gets its specific code, and a healthy stream running beside it on the same mesh, whose
request is on the mesh while the bad message is handled, delivers exactly the audio of an undisturbed run with the
same seed."""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import AsyncIterator

import pytest

from tests.support.mesh import run_mesh
from tests.support.ws_client import WsClient, ws_connect

pytestmark = pytest.mark.timeout(300)

HEALTHY_TEXT = "Undisturbed, please."
HEALTHY = {"voice": "eric", "seed": 11, "max_new_tokens": 32, "ignore_eos": True}
DEEP = 30_000  # levels of nesting: past msgspec's depth guard, inside the 64 KiB message limit
_reference: dict[str, list[bytes]] = {}


@pytest.fixture(scope="module")
def mesh(tiny_checkpoint, tmp_path_factory):
    # Audio is compared bit for bit: the codec decodes each chunk alone, since a batched convolution may differ in
    # the last bit with the batch's size (--codec-batching), which is no disturbance of the gateway's making.
    with run_mesh(tiny_checkpoint, tmp_path_factory.mktemp("ws-bad-input"),
                  env={"VOXMESH_CODEC_BATCHING": "off"}) as running:
        yield running


async def healthy_session(client: WsClient) -> None:
    await client.send("session.update", **HEALTHY)
    await client.send("input.text", text=HEALTHY_TEXT)
    await client.send("input.done")


async def undisturbed(mesh) -> list[bytes]:
    """The healthy stream's audio frames with nothing else on the mesh (run once, by the first test)."""
    if "frames" not in _reference:
        async with ws_connect(mesh.gateway_url) as client:
            await healthy_session(client)
            got = await client.until("session.done", "error")
        assert got.event["type"] == "session.done" and got.frames, got.event
        _reference["frames"] = got.frames
    return _reference["frames"]


@contextlib.asynccontextmanager
async def healthy_stream_beside(mesh) -> AsyncIterator[None]:
    """Around a bad input: a healthy stream whose request is on the mesh (its `audio.start` came) while the body
    runs; afterwards its audio must equal the undisturbed run's."""
    reference = await undisturbed(mesh)
    async with ws_connect(mesh.gateway_url) as client:
        await healthy_session(client)
        await client.until("audio.start")
        yield
        got = await client.until("session.done", "error")
    assert got.event["type"] == "session.done", got.event
    assert got.frames == reference, "the healthy stream beside the bad input was disturbed"


async def still_serving(client: WsClient) -> None:
    """The socket that got the error stays open and answers the next message."""
    await client.send("session.update", seed=5)
    assert (await client.until("session.updated", "error")).event["type"] == "session.updated"


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


ONE_MESSAGE = [
    # (id, the message as sent, code, param)
    ("binary-frame", b'{"type": "input.flush"}', "binary_frame", None),
    ("malformed-json", '{"type": "input.text", "text": "unterminated', "invalid_json", None),
    ("trailing-garbage", '{"type": "input.flush"} and more', "invalid_json", None),
    ("nested-in-a-field", '{"type": "input.text", "text": ' + nested(DEEP) + "}", "invalid_json", None),
    ("nested-in-a-one-shot", '{"input": "Hi.", "voice": ' + nested(DEEP) + "}", "invalid_json", None),
    ("nested-in-an-unknown-field", '{"type": "input.flush", "extra": ' + nested(DEEP) + "}", "invalid_json", None),
    ("nested-whole-message", nested(DEEP), "invalid_type", None),
    ("wrong-type", json.dumps({"type": "input.text", "text": 3}), "invalid_type", "text"),
    ("unknown-voice", json.dumps({"type": "session.update", "voice": "nobody"}), "unknown_voice", "voice"),
    ("unknown-format", json.dumps({"type": "session.update", "format": "mp3"}), "unsupported_format", "format"),
    ("unknown-model", json.dumps({"type": "session.update", "model": "big"}), "unknown_model", "model"),
    ("unknown-language", json.dumps({"type": "session.update", "language": "klingon"}), "unknown_language",
     "language"),
    ("one-shot-unknown-voice", json.dumps({"input": "Hi.", "voice": "nobody"}), "unknown_voice", "voice"),
    ("one-shot-unknown-model", json.dumps({"input": "Hi.", "model": "big"}), "unknown_model", "model"),
    ("one-shot-unknown-language", json.dumps({"input": "Hi.", "language": "klingon"}), "unknown_language",
     "language"),
    ("resume-foreign-request", json.dumps({"type": "resume", "request_id": "req_" + secrets.token_urlsafe(16),
                                           "last_seq": 0, "resume_token": "forged"}), "not_resumable",
     "resume_token"),
    ("resume-negative-last-seq", json.dumps({"type": "resume", "request_id": "req_x", "last_seq": -1}),
     "out_of_range", "last_seq"),
    ("resume-wrong-type-last-seq", json.dumps({"type": "resume", "request_id": "req_x", "last_seq": "3"}),
     "invalid_type", "last_seq"),
]


@pytest.mark.parametrize("raw, code, param", [case[1:] for case in ONE_MESSAGE], ids=[c[0] for c in ONE_MESSAGE])
async def test_a_bad_message_gets_its_code_and_the_stream_beside_is_undisturbed(mesh, raw, code, param):
    async with healthy_stream_beside(mesh), ws_connect(mesh.gateway_url) as client:
        await client.socket.send(raw)
        error = (await client.until("error", "audio.start", "session.updated")).event
        await still_serving(client)
    assert (error["type"], error["code"], error["param"]) == ("error", code, param), error
    assert error["message"]


async def test_an_oversized_message_gets_message_too_big_then_close_1009(mesh):
    async with healthy_stream_beside(mesh), ws_connect(mesh.gateway_url) as client:
        await client.send("input.text", text="x" * 70_000)
        error = (await client.until("error")).event
        closed = await client.closed()
    assert error["code"] == "message_too_big" and "65536-byte limit" in error["message"], error
    assert closed.rcvd.code == 1009


async def test_messages_after_input_done_get_input_closed_and_the_session_still_ends_well(mesh):
    late = [{"type": "input.text", "text": "Too late."}, {"type": "input.flush"}, {"input": "A one-shot."},
            {"type": "resume", "request_id": "req_x", "last_seq": 0}]
    async with healthy_stream_beside(mesh), ws_connect(mesh.gateway_url) as client:
        await client.send("session.update", voice="ryan", max_new_tokens=6)
        await client.send("input.text", text="One more thing.\n")
        await client.send("input.done")
        errors = []
        for message in late:
            await client.socket.send(json.dumps(message))
            errors.append((await client.until("error")).event)
        done = await client.until("session.done", "error")
    assert [e["code"] for e in errors] == ["input_closed"] * len(late), errors
    assert all("input.done was sent" in e["message"] for e in errors)
    assert done.event["type"] == "session.done" and done.event["segments"] == 1


async def test_resume_with_a_future_last_seq_is_out_of_range_and_the_request_stays_resumable(mesh):
    settings = {"voice": "vivian", "seed": 4, "max_new_tokens": 80, "ignore_eos": True}
    async with healthy_stream_beside(mesh):
        async with ws_connect(mesh.gateway_url) as client:
            await client.send("session.update", **settings)
            await client.send("input.text", text="Park me for a moment.\n")
            start = (await client.until("audio.start")).event
            request_id, token = start["request_id"], start["resume_token"]
            await client.until(frames=2)
        async with ws_connect(mesh.gateway_url) as client:
            await client.send("resume", request_id=request_id, last_seq=1000, resume_token=token)
            future = (await client.until("error", "audio.start")).event
            await client.send("resume", request_id=request_id, last_seq=1, resume_token=token)
            resumed = await client.until("audio.done", "error")
    assert (future["type"], future["code"], future["param"]) == ("error", "out_of_range", "last_seq"), future
    assert "last_seq 1000 was never sent" in future["message"]
    start = next(e for e in resumed.events if e["type"] == "audio.start")
    assert (start["request_id"], start["first_seq"], resumed.event["type"]) == (request_id, 2, "audio.done")


async def test_resume_of_a_request_delivered_in_full_is_not_resumable(mesh):
    async with ws_connect(mesh.gateway_url) as client:
        await client.send("session.update", voice="ryan", max_new_tokens=4)
        await client.send("input.text", text="Done already.\n")
        token = (await client.until("audio.start")).event["resume_token"]
        request_id = (await client.until("audio.done")).event["request_id"]
    async with healthy_stream_beside(mesh), ws_connect(mesh.gateway_url) as client:
        await client.send("resume", request_id=request_id, last_seq=0, resume_token=token)
        refused = (await client.until("error", "audio.start")).event
        await still_serving(client)
    assert (refused["code"], refused["request_id"]) == ("not_resumable", request_id), refused
    assert "delivered in full" in refused["message"]
