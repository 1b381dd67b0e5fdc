"""`voxmesh provision`: the one administrative step that creates streams, consumers and the KV bucket.

Services run with least privilege and create nothing; this step (run by `voxmesh up`, or
once per cluster) is idempotent. With --create-model-if-missing it also writes the tiny
checkpoint at the model dir when none is there (the compose default's first run); a hub id
(--model-dir ORG/NAME) missing from the hub's cache is downloaded here, before any service starts.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from messages.errors import InvalidConfig
from messages.streams import DAY_S, BusConfig
from services.runtime import settings_schema as settings_lib
from services.runtime.model_source import hub_id_of, with_model_resolved
from services.runtime.provision_settings import ProvisionSettings


def configure(parser: argparse.ArgumentParser) -> None:
    settings_lib.add_arguments(parser, ProvisionSettings)
    parser.add_argument("--create-model-if-missing", action="store_true",
                        help="write the tiny checkpoint at --model-dir if it has no config.json")
    parser.add_argument("--write-nats-auth", type=Path, default=None, metavar="DIR",
                        help="only write DIR/auth.conf (the nats-server `authorization` block: one user per service, "
                             "its subjects only) and DIR/<user>.password for each user, then exit; include auth.conf "
                             "in the server's configuration and give each service its VOXMESH_NATS_USER and "
                             "VOXMESH_NATS_PASSWORD_FILE")
    parser.add_argument("--write-nats-config", type=Path, default=None, metavar="DIR",
                        help="only write a nats-server's whole configuration into DIR, then exit: DIR/nats.conf (load "
                             "it with -c), the users' auth.conf and password files (a user's existing password is "
                             "kept) and the key that encrypts its store at rest (store.key, made once); the compose "
                             "files' nats-config step")


def run(args: argparse.Namespace) -> int:
    if args.write_nats_config is not None:
        from services.bus.server_config import write_cluster_config

        print(f"wrote {write_cluster_config(args.write_nats_config)} and the users' password files beside it")
        return 0
    if args.write_nats_auth is not None:
        from services.bus.nats_auth import users, write_auth

        auth = write_auth(args.write_nats_auth)
        print(f"wrote {auth.config_file} and a password file for each of {', '.join(users())}")
        return 0
    try:
        settings = settings_lib.resolve(ProvisionSettings, args)
        if args.create_model_if_missing and settings.model_dir and hub_id_of(settings.model_dir) is None:
            _create_model(Path(settings.model_dir))
        # The step before the services: a hub id missing from the cache is downloaded here, never by them.
        settings, model = with_model_resolved(settings, download=True)
        config = BusConfig(models=(settings.model_name,), num_partitions=settings.num_partitions,
                           max_queued_requests=settings.max_queued_requests, storage=settings.storage,
                           stream_replicas=settings.stream_replicas,
                           usage_max_age_s=settings.usage_retention_days * DAY_S)
    except (settings_lib.SettingsError, InvalidConfig) as error:
        print(f"voxmesh provision: {error}", file=sys.stderr)
        return 2
    asyncio.run(_provision(settings, config))
    print(f"provisioned {settings.nats_url}: {model.describe()}, {settings.num_partitions} partitions, "
          f"{settings.stream_replicas} replica(s)")
    return 0


def _create_model(model_dir: Path) -> None:
    if (model_dir / "config.json").is_file():
        return
    from services.random_checkpoint.checkpoint_writer import write_checkpoint

    write_checkpoint(model_dir, "tiny", seed=0)


async def _provision(settings: ProvisionSettings, config: BusConfig) -> None:
    from services.bus.provision import provision
    from services.runtime.nats_connect import connect_service

    nc = await connect_service(settings, "voxmesh-provision")
    try:
        await provision(nc.jetstream(), config)
    finally:
        await nc.drain()
