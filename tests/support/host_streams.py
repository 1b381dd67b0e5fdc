"""Requests streamed through the spread mesh's gateways while a fault happens, and how a member catches up."""

from __future__ import annotations

import asyncio

import httpx

from tests.support.mesh_client import WAIT_S, LiveStream, follow
from tests.support.host_cluster import ELECTION_TIMEOUT_S, MONITOR_PORT


async def start_through(urls_and_bodies: list[tuple[str, dict]]) -> tuple[list[LiveStream], list[asyncio.Task]]:
    """One request per (gateway URL, body), all at once; returns once every one plays (has audio)."""
    lives = [LiveStream() for _ in urls_and_bodies]
    tasks = [asyncio.create_task(follow(url, body, live)) for (url, body), live in zip(urls_and_bodies, lives)]
    for live, task in zip(lives, tasks):
        first = asyncio.ensure_future(live.first_audio.wait())
        await asyncio.wait([first, task], timeout=WAIT_S, return_when=asyncio.FIRST_COMPLETED)
        first.cancel()
        if not live.first_audio.is_set():
            raise AssertionError(f"a request never played: {task.result() if task.done() else 'no audio in time'}")
    return lives, tasks


async def finish(tasks: list[asyncio.Task]) -> list[LiveStream]:
    return list(await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S))


def member_streams(address: str) -> dict[str, dict]:
    """Each stream's state as one member stores it (its own monitoring `/jsz`, not the leader's answer)."""
    reply = httpx.get(f"http://{address}:{MONITOR_PORT}/jsz", params={"streams": "true"}, timeout=10)
    reply.raise_for_status()
    found = {}
    for account in reply.json().get("account_details") or []:
        for stream in account.get("stream_detail") or []:
            found[stream["name"]] = stream.get("state") or {}
    return found


async def caught_up(address: str, reference: str, streams: tuple[str, ...]) -> dict[str, dict]:
    """Once the member at `address` stores, for each of `streams`, what the member at `reference` stores (the same
    last sequence); its states then. Asked each 0.2s (nothing announces a follower's progress), bounded."""
    async def equal() -> dict[str, dict]:
        while True:
            try:
                mine, theirs = await asyncio.gather(asyncio.to_thread(member_streams, address),
                                                    asyncio.to_thread(member_streams, reference))
                if all(name in mine and mine[name].get("last_seq") == theirs.get(name, {}).get("last_seq")
                       for name in streams):
                    return mine
            except httpx.HTTPError:
                pass  # restarting: monitoring not up yet
            await asyncio.sleep(0.2)

    return await asyncio.wait_for(equal(), ELECTION_TIMEOUT_S)
