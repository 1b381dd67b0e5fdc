"""Claim conflicts resolved by the owner's lease, on a real nats-server: a fresh claim, this replica's own earlier
claim, a live other owner (left alone), a dead owner (taken over by compare-and-set on the recorded revision, epoch + 1,
or kept when the caller declines), a takeover that loses a race; and the per-start incarnation in replica names."""

from __future__ import annotations

import subprocess
import sys

import pytest

from messages.streams import BusConfig
from services.bus.claims import ClaimKind, claim_request, read_owner, resolve_request_claim
from services.bus.leases import LeaseKeeper
from services.runtime.replica_name import INCARNATION, default_replica
from tests.support.nats_server import fresh_bus

CONFIG = BusConfig(models=("tiny",), num_partitions=1, storage="memory")


@pytest.fixture
async def kv(nats_client):
    return await fresh_bus(nats_client.jetstream(), CONFIG)


async def live(kv, replica: str) -> None:
    await LeaseKeeper(kv, replica, "decode", interval_s=1.0, ttl_s=60.0).renew()


async def test_an_unclaimed_request_is_claimed_at_epoch_one(kv):
    resolved = await resolve_request_claim(kv, "fresh", "decode-me")
    assert resolved.kind is ClaimKind.NEW and resolved.is_ours
    assert (resolved.claim.record.replica, resolved.claim.record.epoch) == ("decode-me", 1)


async def test_this_replicas_own_claim_is_continued_unchanged(kv):
    mine = await claim_request(kv, "mine", "decode-me")
    resolved = await resolve_request_claim(kv, "mine", "decode-me")
    assert resolved.kind is ClaimKind.OURS and resolved.claim.revision == mine.revision


async def test_a_live_other_owner_is_left_alone(kv):
    await live(kv, "decode-other")
    theirs = await claim_request(kv, "theirs", "decode-other")
    resolved = await resolve_request_claim(kv, "theirs", "decode-me")
    assert resolved.kind is ClaimKind.LIVE_OWNER and not resolved.is_ours
    assert (await read_owner(kv, "theirs")).revision == theirs.revision  # untouched


async def test_a_dead_owners_request_is_taken_over_with_the_next_epoch(kv):
    dead = await claim_request(kv, "orphan", "decode-dead")  # no lease: dead
    resolved = await resolve_request_claim(kv, "orphan", "decode-me")
    assert resolved.kind is ClaimKind.TAKEN_OVER and resolved.previous.revision == dead.revision
    assert (resolved.claim.record.replica, resolved.claim.record.epoch) == ("decode-me", 2)
    assert (await read_owner(kv, "orphan")).revision == resolved.claim.revision


async def test_a_dead_owners_request_is_kept_when_the_caller_declines(kv):
    dead = await claim_request(kv, "emitted", "decode-dead")

    async def decline(claim) -> bool:
        assert claim.revision == dead.revision
        return False

    resolved = await resolve_request_claim(kv, "emitted", "decode-me", may_take_over=decline)
    assert resolved.kind is ClaimKind.DEAD_OWNER_KEPT and not resolved.is_ours
    assert (await read_owner(kv, "emitted")).revision == dead.revision


async def test_a_takeover_that_loses_the_race_reads_again_and_leaves_the_winner_alone(kv):
    await claim_request(kv, "raced", "decode-dead")

    async def a_rival_takes_it_first(claim) -> bool:
        await live(kv, "decode-rival")
        await claim_request(kv, "raced", "decode-rival", current=claim)  # lands between our read and our write
        return True

    resolved = await resolve_request_claim(kv, "raced", "decode-me", may_take_over=a_rival_takes_it_first)
    assert resolved.kind is ClaimKind.LIVE_OWNER
    assert (resolved.claim.record.replica, resolved.claim.record.epoch) == ("decode-rival", 2)


async def test_a_restarted_process_with_the_same_host_and_pid_is_another_replica(kv):
    code = "from services.runtime.replica_name import INCARNATION; print(INCARNATION)"
    starts = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
              for _ in range(2)}
    assert len(starts) == 2 and INCARNATION not in starts  # each start draws its own
    assert default_replica("decode").endswith(f"-{INCARNATION}")
    # The predecessor's name differs only by its incarnation: its claim is a dead owner's, taken over, not "ours".
    predecessor = default_replica("decode").removesuffix(INCARNATION) + "0" * len(INCARNATION)
    await claim_request(kv, "before-restart", predecessor)
    resolved = await resolve_request_claim(kv, "before-restart", default_replica("decode"))
    assert resolved.kind is ClaimKind.TAKEN_OVER and resolved.claim.record.epoch == 2
