"""Only the client that started a request may resume it: `audio.start` carries a resume token (an HMAC of the
request id under the gateways' shared secret) and a `resume` must present it."""

from __future__ import annotations

import pytest

from services.gateway.ws.resume import ResumeRefused
from services.gateway.ws.resume_token import ResumeTokens
from tests.support.gateway_fixtures import *  # noqa: F403  (fixtures: gateway_bus, standin, served_gateway...)
from tests.support.gateway_standin import Plan
from tests.bus.test_ws_standin import finish, url
from tests.support.ws_client import ws_connect

pytestmark = pytest.mark.timeout(60)  # a hang is a failure, reported fast


def test_a_token_verifies_under_the_same_secret_only_and_for_its_own_request():
    secret = b"0123456789abcdef-shared"
    token = ResumeTokens(secret).issue("req_a")
    ResumeTokens(secret).check("req_a", token)  # any gateway with the secret
    for tokens, request_id, offered in [(ResumeTokens(secret), "req_b", token),
                                        (ResumeTokens(b"another-secret-0123456789"), "req_a", token),
                                        (ResumeTokens(secret), "req_a", None)]:
        with pytest.raises(ResumeRefused):
            tokens.check(request_id, offered)


async def test_a_resume_with_another_sessions_token_is_refused_and_its_own_token_resumes(
        standin, served_gateway, gateway_bus):
    standin.plan = Plan(num_chunks=6, hang_after=2)
    standin.start_consumer()
    async with served_gateway(resume_window_s=30.0) as port:
        starts = []
        for text in ("Mine.\n", "Someone else's.\n"):
            async with ws_connect(url(port)) as client:
                await client.send("session.update", voice="ryan")
                await client.send("input.text", text=text)
                starts.append((await client.until("audio.start")).event)
                await client.until(frames=2)
        mine, theirs = starts
        await finish(gateway_bus, mine["request_id"], chunk_count=6)
        async with ws_connect(url(port)) as stranger:
            await stranger.send("resume", request_id=mine["request_id"], last_seq=1,
                                resume_token=theirs["resume_token"])
            refused = (await stranger.until("error", "audio.start")).event
            await stranger.send("resume", request_id=mine["request_id"], last_seq=1)
            tokenless = (await stranger.until("error", "audio.start")).event
        async with ws_connect(url(port)) as owner:  # the refusals left it parked for its own client
            await owner.send("resume", request_id=mine["request_id"], last_seq=1, resume_token=mine["resume_token"])
            resumed = await owner.until("audio.done", "error")
    assert mine["resume_token"] != theirs["resume_token"]
    for error in (refused, tokenless):
        assert (error["type"], error["code"], error["param"]) == ("error", "not_resumable", "resume_token"), error
    assert resumed.event["type"] == "audio.done" and resumed.event["chunk_count"] == 6
