"""Kills that the `single` and `replicas` fault tests both do to a running `voxmesh up` mesh."""

from __future__ import annotations

import asyncio
import os
import signal

from tests.support.mesh import Mesh
from messages import Finished
from tests.support.mesh_client import (FAULT_BODIES, WAIT_S, LiveStream, assert_as_undisturbed, events_of, follow,
                               start_streams)


async def kill_the_gateway_then_resume(mesh: Mesh) -> list[LiveStream]:
    """Stream FAULT_BODIES, kill -9 the gateway once all play, check that each socket closed once with no end event,
    then resume each request on the restarted gateway from the last frame it got; returns each request's whole
    stream (the frames before the kill and the resumed rest)."""
    lives, tasks = await start_streams(mesh.gateway_url, FAULT_BODIES)
    restarted = mesh.expect_restart("gateway")
    since = len(mesh.log)
    os.kill(mesh.pids["gateway"], signal.SIGKILL)
    cut = list(await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S))
    assert all(live.closed and not live.end for live in cut), "each socket closed once, with no end event"
    assert await asyncio.to_thread(restarted.wait, 60)
    await asyncio.to_thread(mesh.wait_for_line, r"Uvicorn running on", since)  # the restarted gateway listens
    resumed = []
    for live in cut:
        rest = await follow(mesh.gateway_url, {"type": "resume", "request_id": live.request_id,
                                               "last_seq": len(live.frames) - 1,
                                               "resume_token": live.start["resume_token"]}, LiveStream())
        assert rest.start["first_seq"] == len(live.frames) and rest.start["resumed"], rest.start
        resumed.append(LiveStream(start=live.start, frames=live.frames + rest.frames, end=rest.end))
    return resumed


async def assert_a_killed_gateway_s_streams_resume_whole(mesh: Mesh, undisturbed) -> None:
    """`kill_the_gateway_then_resume`, then: every request's whole stream equals the undisturbed run's and ended
    `finished`, once."""
    resumed = await kill_the_gateway_then_resume(mesh)
    await assert_as_undisturbed(mesh.nats_url, resumed, undisturbed)
    for live in resumed:
        assert isinstance((await events_of(mesh.nats_url, live.request_id))[-1], Finished)
