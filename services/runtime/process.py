"""One service per process: parse its settings, set up logging and torch, run until a signal.

Every service package `services/<name>/` exposes, in `services/<name>/service.py`:
  SETTINGS: its settings dataclass (extends CommonSettings)
  async def serve(settings, stop: asyncio.Event) -> None: runs until `stop` is set, then drains
    (built on `services.runtime.lifecycle.run_service`).
SIGTERM and SIGINT set `stop`; a second signal exits at once. Spans are exported only when the OTEL_* variables ask
(services/runtime/tracing.py). A service that stopped because one of its tasks died
exits with status 1, so `voxmesh up`'s restart policy (or the orchestrator's) takes over.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from services.runtime import settings_schema as settings_lib
from services.runtime import device_trace, heap
from services.runtime.lifecycle import ServiceFailed

if TYPE_CHECKING:
    from services.runtime.common_settings import CommonSettings

SERVICES = ("gateway", "decode", "vocoder", "prefill", "mtp")
COMPOSITES = ("colocated",)
"""Processes that run several services' lifecycles together (their settings are one service's: see each module)."""
SIGNALS = (signal.SIGTERM, signal.SIGINT)
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_SECOND_SIGNAL = 130

log = logging.getLogger(__name__)


def build_parser(service: str) -> argparse.ArgumentParser:
    module = importlib.import_module(f"services.{service}.service")
    parser = argparse.ArgumentParser(prog=f"voxmesh serve {service}", description=module.__doc__)
    settings_lib.add_arguments(parser, module.SETTINGS)
    return parser


def main(service: str, argv: list[str] | None = None) -> int:
    """Entry of `python -m services.<service>` and `voxmesh serve <service>`."""
    if service not in SERVICES + COMPOSITES:
        print(f"unknown service {service!r}; choose one of {', '.join(SERVICES + COMPOSITES)}", file=sys.stderr)
        return EXIT_USAGE
    module = importlib.import_module(f"services.{service}.service")
    args = build_parser(service).parse_args(argv)
    from services.bus.tls import TlsConfigError
    from services.runtime.common_settings import check_common
    from services.runtime.model_source import with_model_resolved
    from services.runtime.nats_connect import nats_tls

    try:
        settings = settings_lib.resolve(module.SETTINGS, args)
        check_common(settings)
        nats_tls(settings)  # unreadable or half-given TLS files: said now, not as a traceback at the first connect
        # Once, here: every service of the process serves the same folder under the same name. From the hub's cache
        # only: the steps before the services download (several replicas must not race for one download).
        settings, model = with_model_resolved(settings, download=False)
    except (settings_lib.SettingsError, TlsConfigError) as error:
        print(f"voxmesh {service}: {error}", file=sys.stderr)
        return EXIT_USAGE
    from services.bus.logs import configure_logging

    configure_logging(service, settings.log_level)
    logging.getLogger(__name__).info("%s serves %s", service, model.describe())
    logging.getLogger(__name__).info("%s settings: %s", service, settings_lib.describe(settings))
    from services.runtime.tracing import TracingConfigError, configure_tracing

    try:
        stop_tracing = configure_tracing(service)
    except TracingConfigError as error:
        print(f"voxmesh {service}: {error}", file=sys.stderr)
        return EXIT_USAGE
    import torch

    torch.set_num_threads(settings.torch_threads)
    heap.enable_freezing()
    sys.setswitchinterval(settings.switch_interval_ms / 1000)
    try:
        with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
            return runner.run(run_until_signal(module.serve, settings, service))
    finally:
        stop_tracing()  # the spans still batched go out before the process ends


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop a service runs on (`--event-loop`); None: asyncio's own (also where uvloop is not installed:
    it has no Windows build)."""
    if name != "uvloop":
        return None
    try:
        import uvloop
    except ImportError:
        log.warning("--event-loop uvloop: uvloop is not installed here; running on asyncio's event loop")
        return None
    return uvloop.new_event_loop


async def run_until_signal(serve: Callable[[Any, asyncio.Event], Awaitable[None]], settings: CommonSettings,
                           service: str = "service") -> int:
    """Run `serve(settings, stop)` with SIGTERM/SIGINT setting `stop`; the process's exit status. SIGUSR1 records
    a device trace where the `device_trace_dir` setting asks for one (services/runtime/device_trace.py)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    signalled = False

    def on_signal() -> None:
        nonlocal signalled
        if signalled:  # a second signal: the operator wants out now
            os._exit(EXIT_SECOND_SIGNAL)
        signalled = True  # (not `stop.is_set()`: a task that died sets it too, and a first signal still drains)
        stop.set()

    for sig in SIGNALS:
        loop.add_signal_handler(sig, on_signal)
    device_trace.install(service, settings.device_trace_dir, settings.device_trace_s)
    try:
        await serve(settings, stop)
    except ServiceFailed as failure:  # each task's traceback was logged when it died
        log.error("%s", failure)
        return EXIT_FAILED
    finally:
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)
    return 0
