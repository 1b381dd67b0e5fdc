"""What the HTTP API tests share: the official `openai` client pointed at a gateway, and readers of what comes back
(WAV, FLAC/MP3/Opus through libsndfile, server-sent events, Prometheus text)."""

from __future__ import annotations

import base64
import io
import json
import wave

import numpy as np
import openai
import soundfile
from nats.js.kv import KeyValue
from prometheus_client.parser import text_string_to_metric_families

from messages import decode, subjects
from messages.records import CancelRecord


def openai_client(base_url: str, api_key: str = "unused") -> openai.AsyncOpenAI:
    """The official client, no retries (a test must see the first answer)."""
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=60.0)


def read_wav(data: bytes) -> tuple[int, int, int, bytes]:
    """(rate, channels, sample width, frames) of a WAV file, read with the standard library."""
    with wave.open(io.BytesIO(data)) as reader:
        return reader.getframerate(), reader.getnchannels(), reader.getsampwidth(), reader.readframes(10**9)


def decode_audio(data: bytes) -> tuple[int, np.ndarray]:
    """(sample rate, s16 samples) of a FLAC, MP3 or Ogg Opus file, decoded by libsndfile."""
    samples, rate = soundfile.read(io.BytesIO(data), dtype="int16")
    return rate, samples


def parse_sse(text: str) -> list[dict]:
    """The JSON payloads of a `text/event-stream` body; every event must be `data:` lines and a blank line."""
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        assert all(line.startswith("data: ") for line in lines), block
        events.append(json.loads("".join(line[len("data: "):] for line in lines)))
    return events


def sse_audio(events: list[dict]) -> bytes:
    """The bytes carried by the `speech.audio.delta` events, in order."""
    return b"".join(base64.b64decode(event["audio"]) for event in events if event["type"] == "speech.audio.delta")


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text format -> {(sample name, sorted labels): value}."""
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def sample(values: dict, name: str, **labels: str) -> float:
    """One sample's value; 0 when the series does not exist yet."""
    return values.get((name, tuple(sorted(labels.items()))), 0.0)


async def next_cancel(kv: KeyValue, request_id: str) -> CancelRecord:
    """The request's cancel record, awaited on a KV watch (no polling)."""
    watcher = await kv.watch(subjects.cancel_key(request_id))
    try:
        async for entry in watcher:
            if entry is not None and entry.value:
                return decode(entry.value, CancelRecord)
    finally:
        await watcher.stop()
    raise AssertionError("the watch ended without a cancel record")
