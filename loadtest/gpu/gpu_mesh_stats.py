"""Read the decode service's counters (`$SRV.STATS.voxmesh-decode`) from a running mesh, for gpu_mesh_run.sh.

Prints one JSON object: the STATS reply's endpoint data (steps, frames, max batch size, ...), plus
`mean_batch_size` = frames / steps, the engine's average rows per step over the whole run, and under `vocoder` the
first vocoder replica's codec counters and timings (`codec_calls`, `max_codec_batch`, `codec_seconds`, `codec_voices_*`; empty when it
does not answer).

    VOXMESH_NATS_USER=observer VOXMESH_NATS_PASSWORD_FILE=STATE/nats-auth/observer.password \
        python -m loadtest.gpu.gpu_mesh_stats nats://127.0.0.1:PORT

(`voxmesh up`'s server refuses a connection without a user: the observer may ask `$SRV.STATS`.)
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import nats

from messages import subjects
from services.decode.service import SERVICE_NAME as DECODE_SERVICE
from services.vocoder.service import SERVICE_NAME as VOCODER_SERVICE


VOCODER_FIELDS = ("codec_calls", "max_codec_batch", "codec_seconds", "codec_passes", "codec_row_frames",
                  "codec_padded_row_frames", "codec_voices_primed", "codec_voices_reused", "codec_voices_kept",
                  "codec_voices_kept_bytes")


async def decode_stats(url: str, timeout_s: float = 5.0) -> dict:
    """The first decode replica's STATS endpoint data, with mean_batch_size added, and the vocoder's codec fields."""
    user, password_file = os.environ.get("VOXMESH_NATS_USER"), os.environ.get("VOXMESH_NATS_PASSWORD_FILE")
    password = open(password_file, encoding="utf-8").read().strip() if password_file else None
    client = await nats.connect(url, connect_timeout=timeout_s, allow_reconnect=False, user=user, password=password)
    try:
        body = await _stats(client, DECODE_SERVICE, timeout_s)
        try:
            vocoder = await _stats(client, VOCODER_SERVICE, timeout_s)
        except (TimeoutError, nats.errors.Error):  # the decode figures stand without it
            vocoder = {}
    finally:
        await client.close()
    data = _data(body)
    steps, frames = data.get("steps"), data.get("frames")
    mean = frames / steps if isinstance(steps, int) and steps > 0 and isinstance(frames, int) else None
    codec = {name: value for name, value in _data(vocoder).items() if name in VOCODER_FIELDS}
    return {"service": body.get("name"), "id": body.get("id"), **data, "mean_batch_size": mean, "vocoder": codec}


async def _stats(client: nats.NATS, service: str, timeout_s: float) -> dict:
    reply = await client.request(subjects.micro_stats(service), b"", timeout=timeout_s)
    return json.loads(reply.data)


def _data(body: dict) -> dict:
    """The first endpoint's data of a STATS reply (every endpoint of a voxmesh service carries the same)."""
    return next((endpoint.get("data") for endpoint in body.get("endpoints", []) if endpoint.get("data")), {})


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].startswith("nats://"):
        print("usage: python -m loadtest.gpu.gpu_mesh_stats nats://HOST:PORT", file=sys.stderr)
        return 2
    try:
        print(json.dumps(asyncio.run(decode_stats(args[0]))))
    except (OSError, TimeoutError, nats.errors.Error, ValueError) as error:
        print(f"gpu_mesh_stats: no decode STATS from {args[0]}: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
