"""A decode replica whose codes appends fail (a bus blip, then a bus that stays away) on a real nats-server.

The faults are injected by a wrapper around the JetStream context the codes publisher is given: its publishes of
one request's CodesEnd raise a NATS timeout while the fault lasts; everything else goes to the real server. With a
takeover, the first failing publish first claims the request for another replica in the real bucket (what the mesh
does once the cut-off replica's lease has lapsed).
"""

from __future__ import annotations

import asyncio

import nats.errors
import pytest

from messages import decode, subjects
from messages.errors import ErrorCode, Stage
from messages.events import Failed, TerminalEvent
from messages.frames import CodesChunk, CodesEnd
from messages.streams import EVENTS_STREAM
from services.bus.claims import claim_request, read_owner
from services.bus.codes_publisher import CodesPublisher
from services.bus.fencing import MSG_ID
from services.bus.provision import open_bucket
from services.decode import intake
from tests.support.decode_stubs import WAIT_S, running_decode, synthesis


OTHER_REPLICA = "decode-elsewhere"


class CodesEndFaults:
    """Fails the first `failures` publishes of a request's CodesEnd (None: every one)."""

    def __init__(self, request_id: str, failures: int | None) -> None:
        self.request_id, self.failures, self.num_failed = request_id, failures, 0

    def should_fail(self, headers: dict[str, str] | None) -> bool:
        msg_id = (headers or {}).get(MSG_ID, "")
        if not msg_id.startswith(f"{self.request_id}:end:"):
            return False
        if self.failures is not None and self.num_failed >= self.failures:
            return False
        self.num_failed += 1
        return True


class FlakyJetStream:
    """The real JetStream context, except that the faults' publishes raise a NATS timeout (after another replica's
    claim of the request, the first time, when `takeover`)."""

    def __init__(self, js, faults: CodesEndFaults, takeover: bool) -> None:
        self._js, self._faults, self._takeover = js, faults, takeover

    def __getattr__(self, name: str):
        return getattr(self._js, name)

    async def publish(self, subject: str, payload: bytes = b"", **options):
        if self._faults.should_fail(options.get("headers")):
            if self._takeover:
                self._takeover = False
                kv = await open_bucket(self._js)
                current = await read_owner(kv, self._faults.request_id)
                await claim_request(kv, self._faults.request_id, OTHER_REPLICA, current=current)
            raise nats.errors.TimeoutError
        return await self._js.publish(subject, payload, **options)


@pytest.fixture
def codes_end_faults(monkeypatch):
    """Install faults for one request: the decode intake's codes publishers write through a FlakyJetStream."""
    installed: list[tuple[CodesEndFaults, bool]] = []

    class FlakyCodesPublisher(CodesPublisher):
        @classmethod
        async def take_over(cls, js, **fields):
            return await super().take_over(FlakyJetStream(js, *installed[0]), **fields)

    def install(request_id: str, failures: int | None, takeover: bool = False) -> CodesEndFaults:
        installed.append((CodesEndFaults(request_id, failures), takeover))
        monkeypatch.setattr(intake, "CodesPublisher", FlakyCodesPublisher)
        return installed[0][0]

    return install


async def next_terminal(js, request_id: str) -> TerminalEvent:
    subscription = await js.subscribe(subjects.terminal(request_id), ordered_consumer=True)
    try:
        return decode((await subscription.next_msg(timeout=WAIT_S)).data, TerminalEvent)
    finally:
        await subscription.unsubscribe()


async def terminal_count(js, request_id: str) -> int:
    subject = subjects.terminal(request_id)
    info = await js.stream_info(EVENTS_STREAM, subjects_filter=subject)
    return (info.state.subjects or {}).get(subject, 0)


async def test_a_codes_end_lost_in_a_bus_blip_is_retried_and_lands_once(nats_server, tiny_checkpoint,
                                                                       codes_end_faults):
    request = synthesis("blip", "hello the voice", frames=12)
    faults = codes_end_faults(request.id, failures=4)  # more than one append's own lost-ack retries (3)
    async with running_decode(nats_server.url, tiny_checkpoint) as decode_replica:
        await decode_replica.submit(request)
        end = await decode_replica.log.end(request.id)
        stats = await decode_replica.idle_stats()
    assert faults.num_failed == 4
    assert end.reason == "finished" and end.total_frames == 12
    assert [type(m) for m in decode_replica.log.codes[request.id]].count(CodesEnd) == 1
    assert stats["requests_finished"] == 1 and stats["requests_failed"] == 0


async def test_a_codes_end_that_never_lands_fails_the_request_with_one_terminal(nats_server, tiny_checkpoint,
                                                                               codes_end_faults):
    request, after = synthesis("lost-end", "hello the voice", frames=12), synthesis("after", "the hello", frames=6)
    faults = codes_end_faults(request.id, failures=None)
    async with running_decode(nats_server.url, tiny_checkpoint) as decode_replica:
        terminal = asyncio.ensure_future(next_terminal(decode_replica.js, request.id))
        await decode_replica.submit(request)
        failed = await terminal
        await decode_replica.submit(after)  # the replica serves on
        assert (await decode_replica.log.end(after.id)).reason == "finished"
        count = await terminal_count(decode_replica.js, request.id)
        stats = await decode_replica.idle_stats()
    chunks = [m for m in decode_replica.log.codes[request.id] if isinstance(m, CodesChunk)]
    assert not any(isinstance(m, CodesEnd) for m in decode_replica.log.codes[request.id])
    assert isinstance(failed, Failed) and count == 1 and faults.num_failed > 4
    assert (failed.code, failed.stage) == (ErrorCode.INTERNAL, Stage.DECODE)
    assert (failed.chunk_count, failed.frames) == (len(chunks), sum(c.num_frames for c in chunks)) and chunks
    assert "retry the request" in failed.reason
    assert stats["requests_failed"] == 1 and stats["kv_blocks_in_use"] == 0 and stats["active_sequences"] == 0


async def test_a_request_taken_over_while_its_appends_fail_is_left_to_its_new_owner(nats_server, tiny_checkpoint,
                                                                                   codes_end_faults):
    """Cut off long enough for its lease to lapse, a replica whose appends fail through every retry finds another
    replica's later claim on the request: it stands down without a terminal (a `failed` from it would end the
    request under the new owner's audio)."""
    request, after = synthesis("taken-over", "hello the voice", frames=12), synthesis("after", "the hello", frames=6)
    faults = codes_end_faults(request.id, failures=None, takeover=True)
    async with running_decode(nats_server.url, tiny_checkpoint) as decode_replica:
        await decode_replica.submit(request)
        stats = await decode_replica.settled_stats(lambda s: s["requests_stood_down"] == 1)
        await decode_replica.submit(after)  # the replica serves on
        assert (await decode_replica.log.end(after.id)).reason == "finished"
        count = await terminal_count(decode_replica.js, request.id)
        owner = await read_owner(decode_replica.kv, request.id)
    assert faults.num_failed > 4 and owner.record.replica == OTHER_REPLICA
    assert stats["requests_stood_down"] == 1 and stats["requests_failed"] == 0, stats
    assert count == 0, "the stood-down replica published a terminal for a request it no longer owns"
