"""`voxmesh say --response-format --sample-rate`: the body and the session it sends, the format a file's name implies,
and the WAV it writes carrying the rate the gateway says the audio is in."""

from __future__ import annotations

import argparse
import wave
from pathlib import Path

import httpx
import pytest

from services.cli import say
from services.cli.say_formats import format_for_output, playback_hint
from services.cli.say_stream import AudioSink, RateMismatch, session_update


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    say.configure(parser)
    return parser.parse_args(list(argv))


def test_the_one_shot_body_asks_for_the_format_and_the_rate():
    args = parse("Hello.", "-o", "out.mp3", "--sample-rate", "16000", "--voice", "ryan")
    body = say.speech_body(args, format_for_output(args.output))
    assert body == {"input": "Hello.", "response_format": "mp3", "sample_rate": 16000, "voice": "ryan"}, (
        "no model named: the gateway's own serves (a hub id is served under the id)")
    assert say.speech_body(parse("Hi.", "-o", "x.wav", "--model", "acme/tts"), "wav")["model"] == "acme/tts"
    plain = say.speech_body(parse("Hello.", "-o", "out.wav"), "wav")
    assert "sample_rate" not in plain and plain["response_format"] == "wav"
    assert parse("Hi.", "-o", "x.bin", "--format", "flac").format == "flac", "--format is --response-format"


@pytest.mark.parametrize(("name", "expected"), [("a.wav", "wav"), ("a.MP3", "mp3"), ("a.ogg", "opus"),
                                                ("a.aac", "aac"), ("a.ulaw", "ulaw"), ("a.pcm", "pcm"),
                                                ("a.flac", "flac"), ("a.out", "wav"), (None, "pcm")])
def test_the_output_name_implies_the_format(name, expected):
    assert format_for_output(None if name is None else Path(name)) == expected


def test_the_served_rate_is_the_answers_header_else_the_formats_own():
    assert say.served_rate(httpx.Headers({"X-Sample-Rate": "16000"}), "wav") == 16000
    assert say.served_rate(httpx.Headers(), "ulaw") == 8000
    assert say.served_rate(httpx.Headers(), "mp3") == 24000
    assert playback_hint("pcm", 16000) == "aplay -f S16_LE -r 16000 -c 1"
    assert playback_hint("alaw", 8000) == "aplay -f A_LAW -r 8000 -c 1"


def test_the_stream_session_asks_for_the_socket_format_and_rate():
    args = parse("--stdin", "-o", "-", "--sample-rate", "16000", "--seed", "3")
    assert session_update(args, "pcm") == {"type": "session.update", "format": "pcm_s16le", "seed": 3,
                                           "sample_rate": 16000}
    assert session_update(parse("--stdin", "-o", "a.ulaw"), "ulaw")["format"] == "pcm_mulaw"
    assert "sample_rate" not in session_update(parse("--stdin", "-o", "a.wav"), "wav")


def test_a_streamed_wav_carries_the_rate_audio_start_said(tmp_path):
    out = tmp_path / "said.wav"
    sink = AudioSink(out, "wav", 16000)
    sink.start(16000)
    sink.write(b"\x01\x00" * 1600)
    sink.start(16000)  # a second segment at the same rate
    sink.write(b"\x02\x00" * 400)
    with pytest.raises(RateMismatch):
        sink.start(24000)
    sink.close()
    with wave.open(str(out)) as wav:
        assert (wav.getframerate(), wav.getnframes(), wav.getsampwidth()) == (16000, 2000, 2)
    assert sink.seconds == pytest.approx(0.125)


def test_g711_is_written_raw_one_byte_a_sample(tmp_path):
    out = tmp_path / "said.ulaw"
    sink = AudioSink(out, "ulaw")
    sink.start(8000)
    sink.write(b"\xff" * 800)
    sink.close()
    assert out.read_bytes() == b"\xff" * 800 and sink.seconds == pytest.approx(0.1)


def test_a_rate_the_gateway_did_not_ask_for_is_refused_even_unasked(tmp_path):
    sink = AudioSink(tmp_path / "a.wav", "wav")  # no rate asked: the first segment's rate is kept
    sink.start(24000)
    with pytest.raises(RateMismatch):
        sink.start(16000)
    sink.close()
