"""The decode-side client when mtp replicas fail: a replica killed (SIGKILL) mid-request, one paused (SIGSTOP) past the
step timeout, and every replica gone. The step is resent with the same step_id to another replica and its codes are
still the local predictor's; a late reply to a resent step is ignored; with no replica left the client raises a typed
error naming the replicas it tried, within attempts x timeout."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
import torch

from services.model.checkpoint_summary import checkpoint_fingerprint
from services.mtp.errors import RemoteStepFailed
from tests.support.mtp_stubs import kill, load_local, local_codes, make_rows, predictor_client, provision_bus, replicas, until

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return load_local(tiny_checkpoint)


async def test_a_replica_killed_mid_request_has_its_step_resent_to_the_other(nats_server, tiny_checkpoint, model):
    await provision_bus(nats_server.url)
    rows = make_rows(model, 5, seed=40, sampled=True)
    with replicas(nats_server.url, tiny_checkpoint, "mtp-a", "mtp-b", via_cli=("mtp-b",)) as started:
        async with predictor_client(nats_server.url, checkpoint_fingerprint(tiny_checkpoint), timeout_s=2.0,
                                    attempts=3) as client:
            started["mtp-a"].send_signal(signal.SIGSTOP)  # it takes the step and holds it
            pending = await asyncio.to_thread(client.submit, *rows.args())
            await client.nc.flush()  # the step is with mtp-a (idle and tied, a before b)
            kill(started["mtp-a"])
            codes = await asyncio.to_thread(pending.result)
            after = await asyncio.to_thread(client.predict_rest, *rows.args())
            stats = client.stats()["replicas"]
    assert torch.equal(codes, local_codes(model, rows)) and torch.equal(after, codes)
    assert (stats["mtp-a"]["sent"], stats["mtp-a"]["failed"], stats["mtp-a"]["answered"]) == (1, 1, 0)
    assert (stats["mtp-b"]["sent"], stats["mtp-b"]["answered"]) == (2, 2), "the next step skips the dead replica"


async def test_a_paused_replica_times_out_the_step_goes_to_the_other_and_its_late_reply_is_ignored(
        nats_server, tiny_checkpoint, model):
    await provision_bus(nats_server.url)
    rows = make_rows(model, 4, seed=50, sampled=True)
    timeout_s = 1.0
    with replicas(nats_server.url, tiny_checkpoint, "mtp-a", "mtp-b") as started:
        async with predictor_client(nats_server.url, checkpoint_fingerprint(tiny_checkpoint), timeout_s=timeout_s,
                                    attempts=2) as client:
            started["mtp-a"].send_signal(signal.SIGSTOP)
            began = time.monotonic()
            codes = await asyncio.to_thread(client.predict_rest, *rows.args())
            waited = time.monotonic() - began
            started["mtp-a"].send_signal(signal.SIGCONT)
            await until(nats_server.url, lambda: client.num_late_replies == 1)  # mtp-a answers the old step
            await client.wait_for_replicas(2)  # mtp-a renewed its lease after the timeout: a candidate again
            again = await asyncio.to_thread(client.predict_rest, *rows.args())
            stats = client.stats()["replicas"]
    expected = local_codes(model, rows)
    assert torch.equal(codes, expected) and torch.equal(again, expected)
    assert waited >= timeout_s
    assert (stats["mtp-a"]["sent"], stats["mtp-a"]["failed"]) == (2, 1), "resumed, mtp-a takes the next step"
    assert stats["mtp-b"]["sent"] == 1 and stats["mtp-a"]["in_flight_steps"] == stats["mtp-b"]["in_flight_steps"] == 0


async def test_with_every_replica_gone_the_client_fails_promptly_naming_them(nats_server, tiny_checkpoint, model):
    await provision_bus(nats_server.url)
    rows = make_rows(model, 2, seed=60, sampled=False)
    timeout_s, attempts = 1.0, 3
    with replicas(nats_server.url, tiny_checkpoint, "mtp-a", "mtp-b") as started:
        async with predictor_client(nats_server.url, checkpoint_fingerprint(tiny_checkpoint), timeout_s=timeout_s,
                                    attempts=attempts) as client:
            for process in started.values():
                kill(process)
            began = time.monotonic()
            with pytest.raises(RemoteStepFailed) as failed:
                await asyncio.to_thread(client.predict_rest, *rows.args())
            first = time.monotonic() - began
            began = time.monotonic()
            with pytest.raises(RemoteStepFailed) as again:  # both are known dead now: nothing is tried
                await asyncio.to_thread(client.predict_rest, *rows.args())
            second = time.monotonic() - began
    # Each replica is tried once: no responders (the server knows it is gone) or its timeout, whichever comes first.
    assert failed.value.replicas == ("mtp-a", "mtp-b") and first < attempts * timeout_s + 1.0
    assert "mtp-a" in str(failed.value) and "mtp-b" in str(failed.value)
    assert again.value.replicas == () and "no live mtp replica" in str(again.value) and second < timeout_s
