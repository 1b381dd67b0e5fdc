"""`voxmesh health`: the container healthcheck. Healthy when every service this container runs answers its own
`$SRV.PING` on the bus.

The services record their micro service instance ids in $VOXMESH_HEALTH_DIR while they serve
(services/runtime/health_record.py); this asks `$SRV.PING.<name>.<id>` for each, so the answer comes from this
container's process and proves it is connected to NATS and its event loop is turning. Exit 0: healthy; 1: not (yet);
2: misconfigured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from services.runtime import settings_schema as settings_lib
from services.runtime.common_settings import CommonSettings
from services.runtime.health_record import HealthRecord, read_records

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_USAGE = 2


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for each answer (default 3)")


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_lib.resolve(CommonSettings)
    except settings_lib.SettingsError as error:
        print(f"voxmesh health: {error}", file=sys.stderr)
        return EXIT_USAGE
    if settings.health_dir is None:
        print("voxmesh health: VOXMESH_HEALTH_DIR is not set: the services record nothing to ask", file=sys.stderr)
        return EXIT_USAGE
    records = read_records(settings.health_dir)
    if not records:
        print(f"voxmesh health: no service serves here yet ({settings.health_dir} is empty)", file=sys.stderr)
        return EXIT_UNHEALTHY
    silent = asyncio.run(_unanswered(settings, records, args.timeout))
    for record in records:
        state = "no answer" if record in silent else "ok"
        print(f"{record.name} {record.instance_id} ({record.replica}): {state}")
    return EXIT_UNHEALTHY if silent else EXIT_HEALTHY


async def _unanswered(settings: CommonSettings, records: list[HealthRecord], timeout_s: float) -> list[HealthRecord]:
    """The records whose instance did not answer its own ping."""
    import nats.errors

    from messages import subjects
    from services.runtime.nats_connect import connect_service

    try:
        nc = await asyncio.wait_for(connect_service(settings, "voxmesh-health"), timeout_s)
    except (OSError, asyncio.TimeoutError, nats.errors.Error) as error:
        print(f"voxmesh health: cannot reach NATS at {settings.nats_url}: {error!r}", file=sys.stderr)
        return list(records)
    try:
        silent = []
        for record in records:
            try:
                reply = await nc.request(subjects.micro_ping_instance(record.name, record.instance_id), b"",
                                         timeout=timeout_s)
                if json.loads(reply.data).get("id") != record.instance_id:
                    silent.append(record)
            except (asyncio.TimeoutError, nats.errors.Error):
                silent.append(record)
        return silent
    finally:
        await nc.close()
