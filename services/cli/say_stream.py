"""`voxmesh say --stdin`: text in as it is typed (or piped from a program that writes as it thinks), audio out as it
is made, through the gateway's streaming WebSocket.

Standard input is read as it arrives and sent as `input.text`; the gateway speaks each sentence as soon as it ends;
end of input sends `input.done`. The PCM goes to a WAV file (its header completed at the end) or to standard output
(raw s16le 24 kHz mono by default, ready for `aplay -f S16_LE -r 24000 -c 1`); `--format ulaw` / `alaw` asks the
socket for G.711 bytes (`pcm_mulaw` / `pcm_alaw`) and writes them raw. `--sample-rate` goes into the session's
`sample_rate`; the WAV header carries the rate `audio.start` says the audio is in. Progress goes to standard error.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import os
import sys
import threading
from pathlib import Path
from typing import BinaryIO

import websockets

from services.cli.reference_fields import reference_fields
from services.cli.say_formats import STREAM_FORMATS, bytes_per_sample, default_rate, format_for_output, given_options
from services.gateway.http.wav import wav_header

STREAM_PATH = "/v1/audio/speech/stream"
READ_BYTES = 4096  # at most 4096 characters per input.text message
MAX_WAV_SAMPLES = (2**32 - 1 - 36) // 2  # a WAV header for a stream of unknown length


class RateMismatch(ValueError):
    """The socket sent audio at a rate other than the one asked (or than an earlier segment's)."""


class AudioSink:
    """Where the audio goes: a WAV file (header fixed on close), or stdout as raw bytes or an open-ended WAV.

    A WAV header is written when the first `audio.start` says the rate (`start`), so that even a header that can
    never be rewritten (stdout) carries the rate the audio is in.
    """

    def __init__(self, output: Path | None, audio_format: str, sample_rate: int | None = None) -> None:
        self.num_samples = 0
        self.sample_rate = sample_rate
        self._asked_rate = sample_rate
        self._is_wav = audio_format == "wav"
        self._sample_bytes = bytes_per_sample(audio_format)
        self._file: BinaryIO = sys.stdout.buffer if output is None else open(output, "wb")  # noqa: SIM115
        self._seekable = output is not None
        self.default_rate = default_rate(audio_format)
        self._header_written = False

    def start(self, sample_rate: int) -> None:
        """A segment's audio begins at `sample_rate`; RateMismatch if it is not the rate asked or kept so far."""
        if self.sample_rate is not None and sample_rate != self.sample_rate:
            asked = "asked" if self.sample_rate == self._asked_rate else "of the earlier segments"
            raise RateMismatch(f"the gateway sent {sample_rate} Hz audio, not the {self.sample_rate} Hz {asked}")
        self.sample_rate = sample_rate
        if self._is_wav and not self._header_written:
            self._file.write(wav_header(0 if self._seekable else MAX_WAV_SAMPLES, sample_rate))
            self._header_written = True

    def write(self, audio: bytes) -> None:
        self._file.write(audio)
        self._file.flush()  # a player reading stdout hears it now
        self.num_samples += len(audio) // self._sample_bytes

    @property
    def seconds(self) -> float:
        return self.num_samples / (self.sample_rate or self.default_rate)

    def close(self) -> None:
        rate = self.sample_rate or self.default_rate
        if self._is_wav and self._seekable:
            self._file.seek(0)
            self._file.write(wav_header(self.num_samples, rate))
        elif self._is_wav and not self._header_written:  # standard output, and no audio came: an empty WAV
            self._file.write(wav_header(0, rate))
        if self._file is not sys.stdout.buffer:
            self._file.close()


def stream_url(url: str) -> str:
    """The WebSocket URL of the gateway at `url` (http[s]://host:port)."""
    base = url.rstrip("/").replace("https://", "wss://", 1).replace("http://", "ws://", 1)
    return base + STREAM_PATH


def session_update(args, audio_format: str) -> dict:
    """The session's settings from the command line; `audio_format` is what is written (wav, pcm, ulaw, alaw)."""
    return {"type": "session.update", "format": STREAM_FORMATS[audio_format], **given_options(args),
            **reference_fields(args)}


def read_stdin_into(queue: asyncio.Queue[str | None], loop: asyncio.AbstractEventLoop) -> None:
    """Read standard input as it arrives (a thread: reads block); None at the end."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while data := os.read(sys.stdin.fileno(), READ_BYTES):
        text = decoder.decode(data)
        if text:
            loop.call_soon_threadsafe(queue.put_nowait, text)
    if tail := decoder.decode(b"", final=True):
        loop.call_soon_threadsafe(queue.put_nowait, tail)
    loop.call_soon_threadsafe(queue.put_nowait, None)


async def send_input(socket, queue: asyncio.Queue[str | None]) -> None:
    """Forward standard input as `input.text` messages, then `input.done`."""
    while (text := await queue.get()) is not None:
        await socket.send(json.dumps({"type": "input.text", "text": text}))
    await socket.send(json.dumps({"type": "input.done"}))


async def receive_audio(socket, sink: AudioSink) -> int:
    """Write the audio, report progress on stderr; 0 once `session.done` arrived with no error, else 1."""
    failed = False
    async for message in socket:
        if isinstance(message, bytes):
            sink.write(message)
            continue
        event = json.loads(message)
        kind = event["type"]
        if kind == "audio.start":
            try:
                sink.start(int(event.get("sample_rate") or sink.default_rate))
            except RateMismatch as error:
                print(f"voxmesh say: {error}", file=sys.stderr, flush=True)
                return 1
            print(f"segment {event['segment']} {event['request_id']}: {event['text']!r}", file=sys.stderr, flush=True)
        elif kind == "audio.done":
            print(f"  audio.done {event['duration_s']:.2f} s", file=sys.stderr, flush=True)
        elif kind == "error":
            failed = True
            print(f"voxmesh say: {event['code']}: {event['message']}", file=sys.stderr, flush=True)
        elif kind == "session.done":
            print(f"session.done: {event['segments']} segments, {event['duration_s']:.2f} s", file=sys.stderr,
                  flush=True)
            return 1 if failed else 0
    print("voxmesh say: the gateway closed the connection before session.done", file=sys.stderr)
    return 1


async def stream_stdin(args) -> int:
    """Run one streaming session from stdin to `args.output` (None: stdout)."""
    output = None if str(args.output) == "-" else args.output
    audio_format = args.format or format_for_output(output)
    if audio_format not in STREAM_FORMATS:
        print(f"voxmesh say: --stdin streams {', '.join(STREAM_FORMATS)}, not {audio_format} (a whole file in "
              f"{audio_format}: give the text as an argument)", file=sys.stderr)
        return 2
    headers = {}
    if args.api_key_file is not None:
        headers["Authorization"] = "Bearer " + args.api_key_file.read_text(encoding="utf-8").strip()
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    # A daemon thread: a read blocked on a terminal must not keep the process alive after the session ends.
    threading.Thread(target=read_stdin_into, args=(queue, asyncio.get_running_loop()), daemon=True).start()
    sink = AudioSink(output, audio_format, args.sample_rate)
    try:
        async with websockets.connect(stream_url(args.url), additional_headers=headers, max_size=None,
                                      open_timeout=args.timeout) as socket:
            await socket.send(json.dumps(session_update(args, audio_format)))
            sender = asyncio.create_task(send_input(socket, queue))
            try:
                code = await receive_audio(socket, sink)
            finally:
                sender.cancel()
    except (OSError, websockets.WebSocketException) as error:
        print(f"voxmesh say: cannot stream through {args.url}: {error}", file=sys.stderr)
        return 1
    finally:
        sink.close()
    if output is not None:
        print(f"wrote {sink.seconds:.2f} s of audio at {sink.sample_rate or '?'} Hz to {output}", file=sys.stderr)
    return code
