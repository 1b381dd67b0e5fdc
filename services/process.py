"""One service per process: parse its settings, set up logging and torch, run until a signal.

Every service package `services/<name>/` exposes, in `services/<name>/service.py`:
  SETTINGS: its settings dataclass (extends CommonSettings)
  async def serve(settings, stop: asyncio.Event) -> None: runs until `stop` is set, then drains.
SIGTERM and SIGINT set `stop`; a second signal exits at once.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import signal
import socket
import sys

from services import settings as settings_lib

SERVICES = ("gateway", "decode", "vocoder")


def default_replica(service: str) -> str:
    """A replica name unique per process and usable as a subject token."""
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname())[:40]
    return f"{service}-{host}-{os.getpid()}"


def build_parser(service: str) -> argparse.ArgumentParser:
    module = importlib.import_module(f"services.{service}.service")
    parser = argparse.ArgumentParser(prog=f"voxmesh serve {service}", description=module.__doc__)
    settings_lib.add_arguments(parser, module.SETTINGS)
    return parser


def main(service: str, argv: list[str] | None = None) -> int:
    """Entry of `python -m services.<service>` and `voxmesh serve <service>`."""
    if service not in SERVICES:
        print(f"unknown service {service!r}; choose one of {', '.join(SERVICES)}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"services.{service}.service")
    args = build_parser(service).parse_args(argv)
    try:
        settings = settings_lib.resolve(module.SETTINGS, args)
    except settings_lib.SettingsError as error:
        print(f"voxmesh {service}: {error}", file=sys.stderr)
        return 2
    from services.bus.logs import configure_logging

    configure_logging(service, settings.log_level)
    import torch

    torch.set_num_threads(settings.torch_threads)
    return asyncio.run(_run_until_signal(module.serve, settings))


async def _run_until_signal(serve, settings) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():  # a second signal: the operator wants out now
            os._exit(130)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    await serve(settings, stop)
    return 0
