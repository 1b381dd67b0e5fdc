"""An offering replica in its own process, for the KV transfer tests: it offers `sample_tensors()` and prints their
descriptors, then obeys stdin (`count`: print how many offers it holds; `drained`: print DRAINED once it holds none;
`quit`: close and exit).

    python -m tests.support.kv_transfer_peer --nats URL --replica NAME [--attempt N] [--ttl S] [--silent-as NAME] [--big]

`--silent-as NAME` answers fetch requests on NAME's transfer subject with "the send has started" and never sends;
the descriptors it prints name NAME, so a fetcher posts its receive and waits for data that never comes.
`--big` also offers `big_tensor()`.
Lines on stdout: `OFFER <name> <descriptor hex>` per tensor, then `READY`; `COUNT <n>`; `DRAINED`; `CLOSED`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import msgspec
import nats
import torch

from messages import subjects
from messages.codec import encode
from messages.kv_transfer import FetchReply
from services.transfer.agent import KvTransferAgent
from services.transfer.descriptor import describe


def sample_tensors() -> dict[str, torch.Tensor]:
    """The offered tensors, the same in every process: bfloat16 and float32 of a few hundred KiB, and two whose
    sizes are not a multiple of 8 bytes (one small enough for UCX's eager protocol)."""
    generator = torch.Generator().manual_seed(7)
    return {
        "bf16": torch.randn(4, 300, 128, generator=generator).to(torch.bfloat16),  # 300 KiB
        "f32": torch.randn(2, 256, 128, generator=generator),  # 256 KiB
        "odd_u8": torch.randint(0, 256, (100_003,), generator=generator, dtype=torch.uint8),
        "odd_bf16": torch.randn(3, 333, generator=generator).to(torch.bfloat16),  # 1998 bytes
    }


def _say(line: str) -> None:
    print(line, flush=True)


def big_tensor() -> torch.Tensor:
    """64 MiB: over loopback TCP it takes tens of milliseconds, time for a stop to land mid-transfer."""
    return torch.randint(0, 256, (64 * 2**20,), generator=torch.Generator().manual_seed(8), dtype=torch.uint8)


async def _answer_without_sending(msg) -> None:
    await msg.respond(encode(FetchReply()))


async def run(args: argparse.Namespace) -> None:
    nc = await nats.connect(args.nats)
    agent = await KvTransferAgent.start(nc, args.replica, offers=True)
    if args.silent_as:
        await nc.subscribe(subjects.kv_transfer(args.silent_as), cb=_answer_without_sending)
        await nc.flush()
    offered = sample_tensors() | ({"big": big_tensor()} if args.big else {})
    for name, tensor in offered.items():
        descriptor = agent.offer(f"req-{name}", args.attempt, tensor, ttl_s=args.ttl)
        if args.silent_as:
            descriptor = encode(msgspec.structs.replace(describe(descriptor), replica=args.silent_as))
        _say(f"OFFER {name} {descriptor.hex()}")
    _say("READY")
    loop = asyncio.get_running_loop()
    while (command := (await loop.run_in_executor(None, sys.stdin.readline)).strip()) not in ("quit", ""):
        if command == "count":
            _say(f"COUNT {agent.num_offers}")
        elif command == "drained":
            await agent.drained()
            _say("DRAINED")
    await agent.close()
    await nc.close()
    _say("CLOSED")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nats", required=True)
    parser.add_argument("--replica", required=True)
    parser.add_argument("--attempt", type=int, default=0)
    parser.add_argument("--ttl", type=float, default=120.0)
    parser.add_argument("--silent-as", default="")
    parser.add_argument("--big", action="store_true")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
