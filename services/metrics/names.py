"""Metric names and buckets every service uses, so one dashboard reads the gateway, decode and vocoder alike.

Counters get prometheus_client's `_total` suffix on the wire (`voxmesh_requests_total`).
"""

from __future__ import annotations

REQUESTS = "voxmesh_requests"
"""Requests ended, by `outcome` (finished, failed, refused, abandoned, stood_down) and error `code` ("none" when
there is none)."""
FIRST_PACKET = "voxmesh_first_packet_seconds"
"""Seconds from admission to the first audio chunk the gateway handed to the client (observed when the request
ends)."""
RTF = "voxmesh_rtf"
"""Real-time factor of finished requests: seconds from admission to the last audio, over seconds of audio."""
QUEUE_DEPTH = "voxmesh_queue_depth"
"""Requests waiting: on REQUESTS (gateway), in the engine's waiting queue (decode)."""
ACTIVE_STREAMS = "voxmesh_active_streams"
"""Requests in flight here: client streams (gateway), owned requests (decode), codec states (vocoder)."""
LIVE_REQUESTS = "voxmesh_live_requests"
"""Requests the gateway holds anything for (queued, generating, streaming, awaiting a resume); the admission limit
`--max-live-requests` bounds it, and it returns to 0 when the gateway is idle."""
PREEMPTIONS = "voxmesh_preemptions"
"""Capacity preemptions of running requests (decode)."""
KV_BLOCKS_IN_USE = "voxmesh_kv_blocks_in_use"
"""KV blocks held by requests (decode); `voxmesh_kv_blocks_capacity` is the pool's size."""
KV_BLOCKS_CAPACITY = "voxmesh_kv_blocks_capacity"
CODEC = "voxmesh_codec_seconds"
"""Seconds of a vocoder's codec, by `part`: `call` (one batched call on the codec thread) and `chunk` (one chunk from
its hand-over to its audio: the call in progress and its own)."""
STEP = "voxmesh_step_seconds"
"""Seconds of a decode replica's engine steps, by `part`: `device_decode` and `device_mixed` (a step on the card,
without and with a prompt's prefill chunk), `idle` (the card's stream waiting for the next step: the host was late)
and `launch` (the host building and queueing a step); see services/engine/step_timeline.py."""
VOICE_PROMPT = "voxmesh_voice_prompt_seconds"
"""Seconds a cloned voice's prompt took on a decode or prefill replica, by `part`: `audio_read` (the reference from
its object store) and `compute` (the audio work as the replica waits for it, the worker's queue included)."""

NO_CODE = "none"

# First packet on the CPU tiny model is ~0.1-1 s, on a GPU tens of milliseconds; long tails matter under load.
LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
# RTF < 1 is faster than real time; the interesting band is 0.05..2.
RTF_BUCKETS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
