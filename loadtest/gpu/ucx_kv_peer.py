"""One side of the KV hand-off: a process with its own KV pool and its own UCX worker (ucxx, tag messages).

The two peers never listen: each prints its worker address on stdout ("ADDR <hex>") and reads the other's
from stdin, both relayed by the orchestrator (`ucx_kv_handoff`). Every repetition of a trial is one hand-off:

    receiver: poison its destination blocks, post the receives, send READY
    sender:   on READY start the clock, send the blocks, stop it when DONE arrives
    receiver: when every block has landed (and, staged, been scattered into its pool), sync, send DONE;
              then check the blocks bit for bit against the expected contents (outside the clock)

Modes: `per_block` sends each block from the sender's pool straight into the receiver's pool block (one
message per block, no copies); `staged` gathers the blocks into one buffer, sends one message, and the
receiver scatters it into its pool (the copies are inside the clock). `ping` times an 8-byte round trip.
The result is printed as one line "RESULT <json>".

    python -m loadtest.gpu.ucx_kv_peer --role sender|receiver --plan '<json>'
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

import numpy as np
import torch

from loadtest.gpu.ucx_kv_blocks import HandoffSpec, as_bytes, block_contents, block_ids, new_pool, same_bits

READY, DONE, DATA, PING, FINISH = 1, 2, 3, 4, 5
FINISH_TRIAL = 0xFFFF


def tag(trial: int, rep: int, kind: int, index: int = 0) -> int:
    """A tag unique to (trial, repetition, message kind, block index)."""
    return (trial << 40) | (rep << 20) | (kind << 16) | index


def buffer(tensor: torch.Tensor) -> object:
    """What ucxx sends from / receives into: the tensor itself on CUDA, a numpy view of it on the CPU."""
    flat = as_bytes(tensor)
    return flat if flat.is_cuda else flat.numpy()


def sync(spec: HandoffSpec) -> None:
    if spec.device.startswith("cuda"):
        torch.cuda.synchronize()


class Peer:
    def __init__(self, ucxx, spec: HandoffSpec, endpoint) -> None:
        self.ucxx, self.spec, self.endpoint = ucxx, spec, endpoint
        self.pool = new_pool(spec)
        self.pool.fill_(float("nan"))
        self.control = np.zeros(1, dtype=np.int64)

    async def send_control(self, value: int) -> None:
        await self.endpoint.send(np.full(1, value, dtype=np.int64), tag=value, force_tag=True)

    async def recv_control(self, value: int) -> None:
        await self.ucxx.recv(self.control, tag=value)

    async def sender_trial(self, trial: dict) -> dict:
        spec, tokens, seed = self.spec, trial["tokens"], trial["seed"]
        times = []
        if trial["mode"] != "ping":
            source = block_ids(spec, tokens, seed, "sender")
            self.pool[source] = block_contents(spec, tokens, seed)
            sync(spec)
        for rep in range(trial["warmup"] + trial["reps"]):
            if trial["mode"] != "ping":
                await self.recv_control(tag(trial["id"], rep, READY))
            start = time.perf_counter()
            if trial["mode"] == "ping":
                await self.send_control(tag(trial["id"], rep, PING))
            elif trial["mode"] == "per_block":
                await asyncio.gather(*(
                    self.endpoint.send(buffer(self.pool[int(block)]), tag=tag(trial["id"], rep, DATA, index),
                                       force_tag=True)
                    for index, block in enumerate(source.tolist())))
            else:
                staging = self.pool.index_select(0, source)
                sync(spec)
                await self.endpoint.send(buffer(staging), tag=tag(trial["id"], rep, DATA), force_tag=True)
            await self.recv_control(tag(trial["id"], rep, DONE))
            times.append(1000 * (time.perf_counter() - start))
        timed = times[trial["warmup"]:]
        return {**trial, "median_ms": statistics.median(timed), "min_ms": min(timed), "max_ms": max(timed)}

    async def receiver_trial(self, trial: dict) -> dict:
        spec, tokens, seed = self.spec, trial["tokens"], trial["seed"]
        checks = []
        if trial["mode"] != "ping":
            target = block_ids(spec, tokens, seed, "receiver")
            expected = block_contents(spec, tokens, seed)
            staging = torch.empty_like(expected)
        for rep in range(trial["warmup"] + trial["reps"]):
            if trial["mode"] == "ping":
                await self.recv_control(tag(trial["id"], rep, PING))
                await self.send_control(tag(trial["id"], rep, DONE))
                continue
            self.pool[target] = float("nan")
            sync(spec)
            if trial["mode"] == "per_block":
                receives = [self.ucxx.recv(buffer(self.pool[int(block)]), tag=tag(trial["id"], rep, DATA, index))
                            for index, block in enumerate(target.tolist())]
            else:
                receives = [self.ucxx.recv(buffer(staging), tag=tag(trial["id"], rep, DATA))]
            pending = asyncio.gather(*receives)
            await self.send_control(tag(trial["id"], rep, READY))
            await pending
            if trial["mode"] == "staged":
                self.pool.index_copy_(0, target, staging)
            sync(spec)
            await self.send_control(tag(trial["id"], rep, DONE))
            checks.append(same_bits(self.pool[target], expected))
        return {"id": trial["id"], "checked": len(checks), "all_equal": all(checks)}


async def run(role: str, plan: dict) -> dict:
    spec = HandoffSpec(**plan["spec"])
    if spec.device.startswith("cuda"):
        torch.cuda.init()
    import ucxx  # after CUDA is up: UCX's CUDA transports attach to the current context

    address = ucxx.get_worker_address()
    print(f"ADDR {address.tobytes().hex()}", flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    if not line.startswith("ADDR "):
        raise RuntimeError(f"expected the peer's 'ADDR <hex>' on stdin, got {line.strip()[:80]!r}")
    remote = ucxx.get_ucx_address_from_buffer(bytes.fromhex(line.split()[1]))
    endpoint = await ucxx.create_endpoint_from_worker_address(remote)
    peer = Peer(ucxx, spec, endpoint)
    trial_runner = peer.sender_trial if role == "sender" else peer.receiver_trial
    results = [await trial_runner(trial) for trial in plan["trials"]]
    # The sender says FINISH only after the last DONE arrived, so neither side exits with a message in flight.
    if role == "sender":
        await peer.send_control(tag(FINISH_TRIAL, 0, FINISH))
    else:
        await peer.recv_control(tag(FINISH_TRIAL, 0, FINISH))
    transports = sorted(ucxx.get_active_transports())
    await endpoint.close()
    return {"role": role, "trials": results, "active_transports": transports}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=("sender", "receiver"), required=True)
    parser.add_argument("--plan", required=True, help="JSON: {spec: HandoffSpec fields, trials: [...]}")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args.role, json.loads(args.plan)))
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
