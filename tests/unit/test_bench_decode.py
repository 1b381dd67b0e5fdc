"""The bench's decoding of answers in formats other than raw PCM (loadtest/bench/audio_decode.py, stream_framing.py,
decoded_scanner.py): every format, cut into pieces of any size, gives back the audio's samples at its rate, the
first audible one where it is, as the pieces arrive; and the flags that ask for a format and a rate."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from loadtest.bench.audible import AUDIBLE_THRESHOLD
from loadtest.bench.audio_decode import G711_TABLES, AudioDecodeError, decoder_for
from loadtest.bench.client import StreamRecorder
from loadtest.bench.decoded_scanner import DecodedScanner
from loadtest.bench.http_speech import _BodyRecorder, _header_refusal, speech_body, streamed_fields
from loadtest.bench.stream_framing import FlacFrames, crc16
from loadtest.bench.workload import PayloadError, RequestShape
from services.cli import bench as bench_cli
from services.gateway.requests.g711 import compand
from tests.support import encoded_audio
from tests.support.encoded_audio import SILENT_S, TONE_S

RATE = 16000


def signal(rate: int = RATE) -> np.ndarray:
    return encoded_audio.signal(rate)


def encode(response_format: str, pcm: np.ndarray, rate: int = RATE) -> bytes:
    return encoded_audio.encode(response_format, pcm, rate)


def scan(scanner: DecodedScanner, data: bytes, piece: int) -> list[int]:
    """Feed `data` in pieces of `piece` bytes, 'arriving' at their byte offset; the samples each piece released."""
    counts = [scanner.feed(data[at:at + piece], float(at)) for at in range(0, len(data), piece)]
    return counts + [scanner.finish(float(len(data)))]


# (format, samples counted per second of audio, tolerance in samples: codecs add their priming and padding)
CASES = [("wav", RATE, 0), ("ulaw", RATE, 0), ("alaw", RATE, 0), ("flac", RATE, 0), ("mp3", RATE, 1600),
         ("aac", RATE, 2100), ("opus", 48000, 1000)]


@pytest.mark.parametrize(("response_format", "counted_rate", "slack"), CASES)
@pytest.mark.parametrize("piece", [1, 997, 1 << 20])
def test_every_format_gives_back_its_samples_as_the_pieces_arrive(response_format, counted_rate, slack, piece):
    if piece == 1 and response_format in ("mp3", "aac", "opus"):
        piece = 7  # byte by byte is slow through FFmpeg's parsers and proves nothing more than 7 bytes at a time
    pcm = signal()
    data = encode(response_format, pcm)
    scanner = DecodedScanner(response_format)
    counts = scan(scanner, data, piece)
    expected = len(pcm) * counted_rate // RATE
    assert abs(sum(counts) - expected) <= slack and scanner.num_samples == sum(counts)
    assert scanner.decode_rate == (None if response_format in G711_TABLES else counted_rate)
    assert scanner.declared_rate == (None if response_format in G711_TABLES else RATE)
    audible = scanner.first_audible
    silent = int(SILENT_S * counted_rate)
    assert silent - slack <= audible.index <= silent + slack + counted_rate // 50, audible
    if piece < len(data) and response_format != "opus":
        assert audible.at < len(data) / 2, "the first audible sample is released by the piece that carries it"
    assert not scanner.has_partial_sample and scanner.first_byte_at == 0.0


def test_g711_tables_invert_the_gateways_companding():
    pcm = np.arange(-32768, 32768, 7, dtype=np.int16)
    for law, table in G711_TABLES.items():
        restored = table[np.frombuffer(compand(pcm, law), dtype=np.uint8)].astype(np.int32)
        assert np.all(np.abs(restored - pcm) <= np.maximum(16, np.abs(pcm.astype(np.int32)) // 16)), law
        assert np.array_equal(table[np.frombuffer(compand(table, law), dtype=np.uint8)], table), law


def test_a_flac_frame_is_released_when_it_is_whole_not_a_frame_later():
    data = encode("flac", signal())
    framer = FlacFrames()
    first_frames = framer.feed(data[:200])
    assert first_frames == [] and framer.streaminfo is not None
    # Feed up to the end of the first frame exactly: its CRC-16 says it is whole.
    rest = data[data.index(b"\xff\xf8", 42):]
    end = next(at for at in range(16, len(rest)) if crc16(rest[:at]) == 0 and rest[at:at + 2] == b"\xff\xf8")
    header_bytes = len(data) - len(rest)
    assert framer.feed(data[200:header_bytes + end]) == [rest[:end]]


@pytest.mark.parametrize(("response_format", "garbage"), [("wav", b"RIFX...."), ("opus", b"NotOgg" * 10),
                                                          ("flac", b"fLaX" * 10), ("mp3", bytes(range(256)) * 4)])
def test_bytes_of_another_format_are_an_undecodable_answer(response_format, garbage):
    decoder = decoder_for(response_format)
    with pytest.raises(AudioDecodeError) as refused:
        decoder.decode(garbage)
        decoder.finish()
        if response_format == "mp3":  # FFmpeg's mp3 parser skips what is not a frame: nothing decodes
            raise AudioDecodeError("no audio")
    assert refused.value.code == "undecodable_audio"


def headers(**values: str) -> dict:
    return {key.replace("_", "-"): value for key, value in values.items()}


def test_the_answer_must_be_the_format_and_rate_asked():
    recorder = _BodyRecorder(0, "p", 0.0, "mp3", 16000)
    assert _header_refusal(headers(content_type="audio/mpeg", x_sample_rate="16000"), recorder) is None
    assert recorder.served_rate == 16000
    refused = _header_refusal(headers(content_type="audio/mpeg", x_sample_rate="24000"), recorder)
    assert refused.code == "rate_mismatch"
    assert _header_refusal(headers(content_type="audio/pcm", x_sample_rate="16000"), recorder).code == \
        "protocol_error"
    pcm = _BodyRecorder(0, "p", 0.0)
    assert _header_refusal(headers(content_type="audio/pcm"), pcm) is None and pcm.served_rate == 24000


def test_a_stream_whose_own_header_says_another_rate_fails():
    recorder = _BodyRecorder(0, "p", 0.0, "wav", None)
    recorder.served_rate = 16000
    recorder.feed(encode("wav", signal(24000), 24000), 1.0)
    recorder.finish(2.0)
    record = recorder.record()
    assert record.error.code == "protocol_error" and "24000" in record.error.message
    ok = _BodyRecorder(0, "p", 0.0, "opus", 16000)
    ok.served_rate = 16000
    ok.feed(encode("opus", signal()), 1.0)
    ok.finish(2.0)
    record = ok.record()
    assert record.error is None and record.sample_rate == 48000, "opus is counted at the rate it decodes to"
    assert sum(chunk.num_samples for chunk in record.chunks) / 48000 == pytest.approx(SILENT_S + TONE_S, abs=0.03)


def test_the_websocket_recorder_reads_g711_frames_at_the_rate_audio_start_says():
    pcm = signal(8000)
    frames = [compand(pcm[at:at + 800], "ulaw") for at in range(0, len(pcm), 800)]
    recorder = StreamRecorder(0, "p", 0.0)
    recorder.on_message('{"type": "audio.start", "request_id": "r", "format": "pcm_mulaw", "sample_rate": 8000}', 0.1)
    for number, frame in enumerate(frames):
        recorder.on_message(frame, 0.2 + number / 10)
    announced_at_24k = len(pcm) * 3 - 24  # G.711's audio.done counts the model's 24 kHz samples
    assert recorder.on_message(f'{{"type": "audio.done", "samples": {announced_at_24k}}}', 5.0)
    record = recorder.record()
    assert record.error is None and record.sample_rate == 8000
    assert sum(chunk.num_samples for chunk in record.chunks) == len(pcm)
    silent = int(SILENT_S * 8000)  # the tone's first sample is 0: its second is the first audible one
    assert record.first_audible.index == silent + 1 and record.first_audible.at == pytest.approx(0.4)
    short = StreamRecorder(0, "p", 0.0)
    short.on_message('{"type": "audio.start", "format": "pcm_alaw", "sample_rate": 8000}', 0.1)
    short.on_message(frames[0], 0.2)
    short.on_message(f'{{"type": "audio.done", "samples": {announced_at_24k}}}', 5.0)
    assert short.record().error.code == "incomplete_audio"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_cli.configure(parser)
    return parser.parse_args(list(argv))


def test_the_bench_flags_ask_for_a_format_and_rate_and_record_them():
    config = bench_cli.build_config(parse("--transport", "http", "--response-format", "mp3", "--sample-rate",
                                          "16000"))
    shape = config.shape
    assert shape.payload("Hi.", 2)["sample_rate"] == 16000 and "response_format" not in shape.payload("Hi.", 2)
    assert shape.to_dict()["response_format"] == "mp3" and shape.to_dict()["sample_rate"] == 16000
    assert speech_body({"input": "x"}, "mp3") == {"input": "x", **streamed_fields("mp3")}
    assert streamed_fields("mp3")["response_format"] == "mp3" and streamed_fields()["response_format"] == "pcm"
    assert "sample_rate" not in bench_cli.build_config(parse()).shape.payload("Hi.", 0)
    assert bench_cli.build_config(parse("--response-format", "ulaw")).shape.response_format == "ulaw"
    with pytest.raises(PayloadError):
        bench_cli.build_config(parse("--response-format", "mp3"))  # the WebSocket sends PCM and G.711 only
    with pytest.raises(PayloadError):
        RequestShape(sample_rate=0)
    with pytest.raises(SystemExit):
        parse("--response-format", "vorbis")


def test_a_loud_sample_is_audible_whatever_format_carried_it():
    pcm = np.zeros(1000, dtype=np.int16)
    pcm[400] = AUDIBLE_THRESHOLD * 4
    scanner = DecodedScanner("wav")
    scanner.feed(encode("wav", pcm), 1.0)
    assert scanner.first_audible.index == 400
