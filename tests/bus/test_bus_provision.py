"""Provisioning is one idempotent step; REQUESTS is bounded and a full queue is a typed QueueFull."""

from __future__ import annotations

import pytest
from nats.js import api

from messages import SynthesisRequest, subjects
from messages.key_limits import LIMITS_BUCKET
from messages.streams import (BUCKET, CODES_STREAM, EVENTS_STREAM, REQUESTS_STREAM, USAGE_CONSUMER, USAGE_STREAM,
                              BusConfig)
from services.bus import NotProvisioned, ProvisionConflict, PullConsumer, QueueFull, Capacity, provision, \
    submit_request
from services.bus.object_store import open_object_store
from services.bus.provision import open_bucket
from messages.voice_clone import REF_AUDIO_STORE, VOICES_STORE
from tests.support.nats_server import fresh_bus

CONFIG = BusConfig(models=("tiny", "Qwen3-TTS-0.6B"), num_partitions=2, max_queued_requests=3)


def request(n: int, model: str = "tiny") -> SynthesisRequest:
    return SynthesisRequest(id=f"req-{n}", model=model, text="Hello there.", seed=n)


async def test_provision_creates_everything_and_is_idempotent(nats_client) -> None:
    js = nats_client.jetstream()
    await fresh_bus(js, CONFIG)
    before = {s.config.name: s.config for s in await js.streams_info()}
    await provision(js, CONFIG)
    after = {s.config.name: s.config for s in await js.streams_info()}
    assert set(after) == {REQUESTS_STREAM, EVENTS_STREAM, CODES_STREAM, USAGE_STREAM, f"KV_{BUCKET}", f"KV_{LIMITS_BUCKET}",
                          f"OBJ_{REF_AUDIO_STORE}", f"OBJ_{VOICES_STORE}"}
    assert before == after
    requests = after[REQUESTS_STREAM]
    assert requests.retention == api.RetentionPolicy.WORK_QUEUE
    assert requests.discard == api.DiscardPolicy.NEW and requests.max_msgs == 3
    assert after[EVENTS_STREAM].max_age == 24 * 3600
    consumer = await js.consumer_info(REQUESTS_STREAM, "decode-qwen3-tts-0_6b")
    assert consumer.config.max_deliver == 3 and consumer.config.ack_policy == api.AckPolicy.EXPLICIT
    assert consumer.config.filter_subjects == [subjects.request("Qwen3-TTS-0.6B"),
                                               subjects.handoff_queue("Qwen3-TTS-0.6B")]
    prefill = await js.consumer_info(REQUESTS_STREAM, "prefill-qwen3-tts-0_6b")
    assert prefill.config.filter_subject == subjects.prefill_request("Qwen3-TTS-0.6B")
    await js.consumer_info(CODES_STREAM, "vocoder-p1")
    assert after[USAGE_STREAM].max_age == 35 * 24 * 3600
    usage = await js.consumer_info(EVENTS_STREAM, USAGE_CONSUMER)
    assert usage.config.filter_subject == subjects.all_terminals() and usage.config.max_deliver == -1
    await open_bucket(js)
    assert (await (await open_object_store(js, REF_AUDIO_STORE)).status()).ttl == CONFIG.ref_audio_ttl_s
    assert (await (await open_object_store(js, VOICES_STORE)).status()).ttl in (None, 0)  # voices are kept


async def test_provision_updates_limits_in_place(nats_client) -> None:
    js = nats_client.jetstream()
    await fresh_bus(js, CONFIG)
    await submit_request(js, request(1))
    await provision(js, BusConfig(models=CONFIG.models, num_partitions=2, max_queued_requests=10))
    info = await js.stream_info(REQUESTS_STREAM)
    assert info.config.max_msgs == 10 and info.state.messages == 1  # queued work survives


async def test_provision_refuses_what_cannot_change_in_place(nats_client) -> None:
    js = nats_client.jetstream()
    await fresh_bus(js, CONFIG)
    await js.delete_stream(EVENTS_STREAM)
    await js.add_stream(name=EVENTS_STREAM, subjects=[subjects.all_events()], retention=api.RetentionPolicy.INTEREST)
    with pytest.raises(ProvisionConflict, match="retention"):
        await provision(js, CONFIG)


async def test_full_queue_refuses_new_requests(nats_client) -> None:
    js = nats_client.jetstream()
    await fresh_bus(js, CONFIG)
    sequences = [await submit_request(js, request(n)) for n in range(3)]
    assert sequences == [1, 2, 3]
    with pytest.raises(QueueFull) as caught:
        await submit_request(js, request(99, model="Qwen3-TTS-0.6B"))
    assert caught.value.code == "queue_full"
    assert (await js.stream_info(REQUESTS_STREAM)).state.messages == 3
    assert await submit_request(js, request(1)) == 2  # a retried submit is deduplicated by its id, not refused


async def test_missing_pieces_are_not_provisioned_errors(nats_client) -> None:
    js = nats_client.jetstream()
    for info in await js.streams_info():
        await js.delete_stream(info.config.name)
    with pytest.raises(NotProvisioned):
        await open_bucket(js)
    with pytest.raises(NotProvisioned):
        await submit_request(js, request(1))
    consumer = PullConsumer(js, nats_client, stream=REQUESTS_STREAM, durable="decode-tiny",
                            message_type=SynthesisRequest, handler=None, capacity=Capacity(1))
    with pytest.raises(NotProvisioned):
        await consumer.bind()
