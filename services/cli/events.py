"""`voxmesh events [--request ID]`: tail lifecycle events as the EVENTS stream stores them.

Without --request it prints events as they happen until Ctrl-C. With --request it prints
that request's whole history from the EVENTS stream and exits after its terminal event.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

import msgspec
from nats.js.api import DeliverPolicy

from messages import LifecycleEvent, decode, subjects
from messages.errors import DecodeError
from messages.streams import EVENTS_STREAM


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nats-url", default="nats://127.0.0.1:4222", help="NATS server URL")
    parser.add_argument("--request", default=None, help="one request's history, ending at its terminal event")
    parser.add_argument("--json", action="store_true", help="print each event as one JSON object")


def format_event(subject: str, data: bytes, as_json: bool) -> str:
    try:
        event = decode(data, LifecycleEvent)
    except DecodeError as error:
        return f"{subject}: undecodable event ({error})"
    fields = msgspec.to_builtins(event)
    if as_json:
        return json.dumps({"subject": subject, **fields}, sort_keys=True)
    detail = " ".join(f"{k}={v}" for k, v in fields.items() if k not in ("type", "schema", "request_id", "at"))
    return f"{event.at:.3f} {event.request_id} {fields['type']} {detail}".rstrip()


async def _tail(args: argparse.Namespace) -> int:
    from services.runtime.observer import connect_observer

    nc = await connect_observer(args.nats_url, "voxmesh-events")
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, done.set)
    loop.add_signal_handler(signal.SIGTERM, done.set)

    async def on_message(msg) -> None:
        print(format_event(msg.subject, msg.data, args.json), flush=True)
        if args.request and msg.subject == subjects.terminal(args.request):
            done.set()

    # Ordered, ephemeral JetStream consumers, never a core subscription: only what the stream stored is printed (a
    # second terminal the guard refused is not), and a reconnect resumes where it left off.
    if args.request:  # the request's full history, then live events
        sub = await nc.jetstream().subscribe(subjects.events_of(args.request), stream=EVENTS_STREAM,
                                             ordered_consumer=True, cb=on_message)
    else:  # events from now on
        sub = await nc.jetstream().subscribe(subjects.all_events(), stream=EVENTS_STREAM, ordered_consumer=True,
                                             deliver_policy=DeliverPolicy.NEW, cb=on_message)
    await done.wait()
    await sub.unsubscribe()
    await nc.drain()
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        if args.request:
            subjects.token(args.request)
        return asyncio.run(_tail(args))
    except ValueError as error:
        print(f"voxmesh events: {error}", file=sys.stderr)
        return 2
