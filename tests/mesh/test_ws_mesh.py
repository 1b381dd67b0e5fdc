"""The streaming WebSocket against the real mesh (`voxmesh up`: gateway, decode, vocoder, nats-server, the tiny
checkpoint): incremental text with flush, cancel mid-stream released in every stage, disconnect then resume, bad and
oversized messages, and `voxmesh say --stdin`. Greedy requests are deterministic, so a one-shot request of the same
text is the reference for what a segment or a resumed request must deliver."""

from __future__ import annotations

import asyncio
import json
import sys
import wave

import pytest

from messages import Failed, Finished
from messages.audio_format import SAMPLE_RATE, SAMPLES_PER_FRAME
from services.gateway.http.encoders import stream_encoder
from services.gateway.requests.response_formats import FORMATS
from tests.support.mesh import REPO, run_mesh
from tests.support.mesh_client import events_of, service_stats, terminal_count
from tests.support.ws_client import WAIT_S, ws_connect

pytestmark = pytest.mark.timeout(300)

GREEDY = {"temperature": 0, "voice": "eric"}


@pytest.fixture(scope="module")
def mesh(tiny_checkpoint, tmp_path_factory):
    """The `single` mesh with each chunk decoded alone (VOXMESH_CODEC_BATCHING=false): a resume's chunks come from a
    re-decode that may run beside the live stream, and only chunks decoded alone are the first time's bytes exactly
    (a codec call's last bit can depend on the other rows in it: the setting's help says so)."""
    with run_mesh(tiny_checkpoint, tmp_path_factory.mktemp("mesh-state"),
                  env={"VOXMESH_CODEC_BATCHING": "false"}) as running:
        yield running


async def one_shot(mesh, text: str, **settings) -> list[bytes]:
    """The binary frames of a one-shot request (an object without `type`): the reference audio."""
    async with ws_connect(mesh.gateway_url) as client:
        await client.socket.send(json.dumps({"input": text, **settings}))
        got = await client.until("audio.done", "error")
    assert got.event["type"] == "audio.done", got.event
    return got.frames


async def stage_stats(mesh, service: str, key: str) -> dict:
    """The STATS data of `service` that reports `key`, read again until `key` is 0 (each stage releases a request
    right after publishing its end, which can reach us a moment before the release)."""
    deadline = asyncio.get_running_loop().time() + 30
    while True:
        stats = next(s for s in await service_stats(mesh.nats_url, service) if key in s)
        if stats[key] == 0 or asyncio.get_running_loop().time() > deadline:
            return stats
        await asyncio.sleep(0.1)


async def test_incremental_text_is_spoken_sentence_by_sentence_as_one_shot_requests_would(mesh):
    settings = {**GREEDY, "max_new_tokens": 12}
    async with ws_connect(mesh.gateway_url) as client:
        await client.send("session.update", **settings)
        await client.send("input.text", text="Hello there. How")
        first = await client.until("audio.done", "error")  # spoken before any flush or input.done
        await client.send("input.text", text=" are you")
        await client.send("input.flush")
        second = await client.until("audio.done", "error")
        await client.send("input.done")
        done = await client.until("session.done", "error")
        closed = await client.closed()
    starts = [e for e in client.events if e["type"] == "audio.start"]
    assert [s["text"] for s in starts] == ["Hello there.", "How are you"]
    assert first.frames == await one_shot(mesh, "Hello there.", **settings)
    assert second.frames == await one_shot(mesh, "How are you", **settings)
    assert first.event["samples"] == len(first.pcm) // 2 == 12 * SAMPLES_PER_FRAME
    assert done.event["request_ids"] == [s["request_id"] for s in starts] and done.event["segments"] == 2
    assert closed.rcvd.code == 1000


async def test_cancel_mid_stream_releases_the_request_in_every_stage(mesh):
    long = {"voice": "vivian", "max_new_tokens": 400, "ignore_eos": True, "seed": 3}
    async with ws_connect(mesh.gateway_url) as client:
        await client.send("session.update", **long)
        await client.send("input.text", text="A long sentence that keeps every stage busy.\n")
        request_id = (await client.until("audio.start")).event["request_id"]
        await client.until(frames=2)
        await client.send("cancel")
        ended = await client.until("error", "audio.done")
        await client.send("session.update", max_new_tokens=6, ignore_eos=False)
        await client.send("input.text", text="Still serving.\n")
        after = await client.until("audio.done", "error")
    assert (ended.event["type"], ended.event["code"], ended.event["request_id"]) == ("error", "cancelled", request_id)
    events = await events_of(mesh.nats_url, request_id)
    assert isinstance(events[-1], Failed) and events[-1].code == "cancelled", events[-1]
    assert events[-1].frames < 400
    assert await terminal_count(mesh.nats_url, request_id) == 1
    decode = await stage_stats(mesh, "voxmesh-decode", "active_requests")
    assert decode["active_requests"] == 0 and decode["kv_blocks_in_use"] == 0, decode
    assert decode["requests_cancelled"] >= 1
    vocoder = await stage_stats(mesh, "voxmesh-vocoder", "active_streams")
    assert vocoder["active_streams"] == 0, vocoder
    assert after.event["type"] == "audio.done"


@pytest.mark.parametrize("frames, wait_for_the_end", [(40, True), (160, False)])
async def test_disconnect_then_resume_gets_exactly_the_missing_chunks(mesh, frames, wait_for_the_end):
    text = "Resume where the connection dropped."
    settings = {**GREEDY, "max_new_tokens": frames, "ignore_eos": True}
    reference = await one_shot(mesh, text, **settings)
    redecodes_before = (await service_stats(mesh.nats_url, "voxmesh-vocoder"))[0]["redecodes"]
    async with ws_connect(mesh.gateway_url) as client:
        await client.send("session.update", **settings)
        await client.send("input.text", text=text + "\n")
        start = (await client.until("audio.start")).event
        request_id = start["request_id"]
        seen = await client.until(frames=3)
    # The client is gone; the request goes on (ended meanwhile, or still running when the client comes back).
    if wait_for_the_end:
        assert isinstance((await events_of(mesh.nats_url, request_id))[-1], Finished)
    async with ws_connect(mesh.gateway_url) as client:
        # as if chunk 2 was lost in the drop
        await client.send("resume", request_id=request_id, last_seq=1, resume_token=start["resume_token"])
        resumed = await client.until("audio.done", "error")
    start = next(e for e in resumed.events if e["type"] == "audio.start")
    assert (start["request_id"], start["first_seq"], start["resumed"]) == (request_id, 2, True)
    assert seen.frames == reference[:3]
    assert resumed.frames == reference[2:], "exactly the chunks after last_seq, in order, each once"
    assert resumed.event["chunk_count"] == len(reference)
    redecodes = (await service_stats(mesh.nats_url, "voxmesh-vocoder"))[0]["redecodes"]
    assert redecodes > redecodes_before, "the missing chunks came from a re-decode of CODES"
    assert await terminal_count(mesh.nats_url, request_id) == 1


async def test_a_resume_at_another_rate_gets_the_bytes_an_unbroken_stream_would_have(mesh):
    """Resampled audio depends on all the audio before it: a resume (the request still running) is replayed from its
    first chunk through the resampler, so the frames after last_seq are those of a stream that never broke."""
    text = "Resume at sixteen kilohertz."
    settings = {**GREEDY, "max_new_tokens": 120, "ignore_eos": True}
    encoder = stream_encoder(FORMATS["pcm"], SAMPLE_RATE, 16000)
    reference = [encoder.feed(frame) for frame in await one_shot(mesh, text, **settings)] + [encoder.finish()]
    async with ws_connect(mesh.gateway_url) as client:
        await client.send("session.update", **settings, sample_rate=16000)
        await client.send("input.text", text=text + "\n")
        start = (await client.until("audio.start")).event
        seen = await client.until(frames=3)
    async with ws_connect(mesh.gateway_url) as client:
        await client.send("session.update", sample_rate=16000)
        await client.send("resume", request_id=start["request_id"], last_seq=1, resume_token=start["resume_token"])
        resumed = await client.until("audio.done", "error")
    again = next(e for e in resumed.events if e["type"] == "audio.start")
    assert (start["sample_rate"], again["sample_rate"], again["first_seq"]) == (16000, 16000, 2)
    assert seen.frames == reference[:3]
    assert resumed.frames == reference[2:], "chunks 2.. and the filter's tail, as an unbroken stream sends them"
    assert resumed.event["chunk_count"] == len(reference) - 1


async def test_bad_and_oversized_messages_on_the_real_mesh(mesh):
    async with ws_connect(mesh.gateway_url) as client:
        await client.socket.send('{"type": "input.text", "txt": "typo"}')
        typo = (await client.until("error")).event
        await client.send("session.update", voice="ryan", language="klingon")
        language = (await client.until("error")).event
        await client.send("resume", request_id="req_nobody", last_seq=0)
        unknown = (await client.until("error")).event
        await client.send("input.text", text="y" * 4000)  # within limits: buffered, no sentence end yet
        await client.socket.send(json.dumps({"type": "input.text", "text": "z" * 4000}) * 20)  # 80 kB
        closed = await client.closed()
    assert (typo["code"], typo["param"]) == ("unknown_field", "txt")
    assert (language["code"], language["param"]) == ("unknown_language", "language")
    assert unknown["code"] == "not_resumable" and unknown["request_id"] == "req_nobody"
    assert closed.rcvd.code == 1009


async def test_say_stdin_speaks_each_line_as_it_is_typed(mesh, tmp_path):
    out = tmp_path / "said.wav"
    say = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.cli", "say", "--stdin", "-o", str(out), "--url", mesh.gateway_url,
        "--voice", "ryan", cwd=REPO, stdin=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    say.stdin.write(b"Hello there.\n")
    await say.stdin.drain()
    lines = [await asyncio.wait_for(say.stderr.readline(), WAIT_S) for _ in range(2)]
    assert lines[0].startswith(b"segment 0 ") and b"audio.done" in lines[1], lines  # before the input ended
    say.stdin.write("Ça va? Très bien.\n".encode())
    say.stdin.close()
    rest = (await asyncio.wait_for(say.stderr.read(), WAIT_S)).decode().splitlines()
    assert await say.wait() == 0, rest
    assert any(line.startswith("session.done: 3 segments") for line in rest), rest
    seconds = sum(float(line.split()[1]) for line in [lines[1].decode()] + rest if "audio.done" in line)
    with wave.open(str(out)) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (SAMPLE_RATE, 1, 2)
        assert wav.getnframes() == round(seconds * SAMPLE_RATE)
