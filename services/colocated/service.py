"""voxmesh colocated: the decode service and the vocoder service in one process, each with its own lifecycle.

Two processes on one GPU mean two CUDA contexts, and the card time-slices between contexts: the vocoder's codec
graphs then wait for decode's steps and the other way round. Here both services share one context; the codec runs
on its own CUDA stream,
so codec and talker work can overlap. The bus contract is unchanged: decode publishes codes to CODES, the vocoder
half consumes its partitions, every request still ends with exactly one terminal event.

Flags and environment are decode's; the vocoder half reads its own environment variables (VOXMESH_PARTITIONS,
VOXMESH_MAX_STREAMS, VOXMESH_VOCODER_METRICS_PORT, ...) and takes the settings every service shares from decode's.
A failure of either half stops both, so the restart policy restarts the pair.
"""

from __future__ import annotations

import asyncio
import dataclasses

from services.decode import service as decode_service
from services.decode.settings import DecodeSettings
from services.runtime.common_settings import CommonSettings
from services.runtime.lifecycle import ServiceFailed
from services.runtime.settings_schema import resolve
from services.vocoder import service as vocoder_service
from services.vocoder.service import VocoderSettings

SETTINGS = DecodeSettings


def vocoder_settings(decode: DecodeSettings) -> VocoderSettings:
    """The vocoder half's settings: its own from the environment, the shared ones (NATS, model, device, dtype...)
    as decode has them. An explicit replica name gets a `-vocoder` suffix, so the halves hold separate leases."""
    shared = {field.name: getattr(decode, field.name) for field in dataclasses.fields(CommonSettings)}
    shared["replica"] = f"{decode.replica}-vocoder" if decode.replica else None
    return dataclasses.replace(resolve(VocoderSettings), **shared)


async def serve(settings: DecodeSettings, stop: asyncio.Event) -> None:
    """Run both halves until `stop` is set (or one of them fails, which sets it for both), then drain both.

    The codec is loaded and its graphs captured before decode loads its engine: no CUDA work of one half runs while
    the other captures (a capture synchronises the device, which another thread's capture in flight forbids)."""
    codec_settings = vocoder_settings(settings)
    codec = await vocoder_service.load_codec(codec_settings, codec_settings.max_decode_batch)
    halves = [asyncio.create_task(decode_service.serve(settings, stop), name="decode"),
              asyncio.create_task(vocoder_service.serve(codec_settings, stop, codec), name="vocoder")]
    results = await asyncio.gather(*halves, return_exceptions=True)
    failures = [result for result in results if isinstance(result, BaseException)]
    if not failures:
        return
    stop.set()
    failed = [failure for failure in failures if isinstance(failure, ServiceFailed)]
    if len(failed) == len(failures):
        raise ServiceFailed("colocated", settings.replica or "-", [str(failure) for failure in failed])
    raise failures[0]
