"""Two code-predictor replicas (`python -m services.mtp`, the tiny checkpoint) behind the decode-side client: the
codes equal the local `predict_rest` for greedy and seeded sampled rows, the least-loaded replica gets the next step,
and a malformed step or one for other weights is answered with an error while the replica keeps serving."""

from __future__ import annotations

import asyncio
import dataclasses
import signal

import nats
import pytest
import torch

from messages import ErrorCode, StepReply, decode, encode, subjects
from services.model.checkpoint_summary import checkpoint_fingerprint
from services.mtp.errors import RemoteStepFailed, StepRejected
from services.mtp.step_rows import pack_step
from tests.support.mtp_stubs import (STEP_S, load_local, local_codes, make_rows, predictor_client, provision_bus,
                               replica_stats, replicas)

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def running(nats_server, tiny_checkpoint):
    """Replicas mtp-a and mtp-b on a provisioned bus, shared by this module's tests (each leaves them running)."""
    asyncio.run(provision_bus(nats_server.url))
    with replicas(nats_server.url, tiny_checkpoint, "mtp-a", "mtp-b") as started:
        yield started


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return load_local(tiny_checkpoint)


async def test_codes_from_two_replicas_equal_the_local_predictor(running, nats_server, tiny_checkpoint, model):
    greedy = make_rows(model, 6, seed=1, sampled=False)
    sampled = make_rows(model, 6, seed=1, sampled=True)  # the same hidden states, drawn with mixed sampling
    expected_greedy, expected_sampled = local_codes(model, greedy), local_codes(model, sampled)
    assert not torch.equal(expected_greedy, expected_sampled), "sampling must change some codes for this to test it"
    async with predictor_client(nats_server.url, checkpoint_fingerprint(tiny_checkpoint), timeout_s=STEP_S,
                                attempts=2) as client:
        before = await replica_stats(nats_server.url, 2)
        # idle replicas share the steps in a fixed order: greedy to a then b, sampled to a then b
        got = [await asyncio.to_thread(client.predict_rest, *rows.args())
               for rows in (greedy, greedy, sampled, sampled)]
        sent = {name: stats["sent"] for name, stats in client.stats()["replicas"].items()}
    after = await replica_stats(nats_server.url, 2)
    for codes, expected in zip(got, (expected_greedy, expected_greedy, expected_sampled, expected_sampled)):
        assert codes.dtype == torch.int64 and codes.shape == (6, 15)
        assert torch.equal(codes, expected)
    assert sent == {"mtp-a": 2, "mtp-b": 2}
    assert {name: after[name]["steps_served"] - before[name]["steps_served"] for name in after} == sent
    assert all(after[name]["rows_served"] - before[name]["rows_served"] == 12 for name in after)


async def test_the_next_step_goes_to_the_less_loaded_replica(running, nats_server, tiny_checkpoint, model):
    """mtp-a holds a step it cannot answer yet (paused): while it is in flight, every further step goes to mtp-b,
    although mtp-a has been sent fewer steps; the held step completes once mtp-a runs again."""
    rows = [make_rows(model, 4, seed=10 + k, sampled=True) for k in range(4)]
    fingerprint = checkpoint_fingerprint(tiny_checkpoint)
    async with predictor_client(nats_server.url, fingerprint, timeout_s=STEP_S, attempts=1) as client:
        before = await replica_stats(nats_server.url, 2)
        requests = [pack_step(fingerprint, 100 + k, *r.args()) for k, r in enumerate(rows)]
        running["mtp-a"].send_signal(signal.SIGSTOP)
        try:
            held = asyncio.ensure_future(client.step(requests[0]))  # idle, tied: mtp-a by name
            others = []
            for request in requests[1:]:  # one at a time: mtp-a has a step in flight, mtp-b none
                others.append(await asyncio.ensure_future(client.step(request)))
            assert client.stats()["replicas"]["mtp-a"]["in_flight_steps"] == 1
        finally:
            running["mtp-a"].send_signal(signal.SIGCONT)
        first = await held
    after = await replica_stats(nats_server.url, 2)
    served = {name: after[name]["steps_served"] - before[name]["steps_served"] for name in after}
    assert served == {"mtp-a": 1, "mtp-b": 3}
    for codes, r in zip([first, *others], rows):
        assert torch.equal(torch.from_numpy(codes), local_codes(model, r))


async def test_a_bad_step_is_answered_with_its_error_and_the_replica_serves_the_next(running, nats_server,
                                                                                      tiny_checkpoint, model):
    rows = make_rows(model, 3, seed=20, sampled=True)
    fingerprint = checkpoint_fingerprint(tiny_checkpoint)
    async with predictor_client(nats_server.url, fingerprint, timeout_s=STEP_S, attempts=1):
        before = await replica_stats(nats_server.url, 2)  # once both are live
    nc = await nats.connect(nats_server.url)
    try:
        garbage = decode((await nc.request(subjects.mtp_step("mtp-a"), b"\x93not a step", timeout=STEP_S)).data,
                         StepReply)
        other = pack_step("0123456789abcdef", 7, *rows.args())
        mismatch = decode((await nc.request(subjects.mtp_step("mtp-a"), encode(other), timeout=STEP_S)).data,
                          StepReply)
        good = pack_step(fingerprint, 8, *rows.args())
        answer = decode((await nc.request(subjects.mtp_step("mtp-a"), encode(good), timeout=STEP_S)).data, StepReply)
    finally:
        await nc.close()
    assert garbage.step_id is None and garbage.error.code == ErrorCode.BAD_MESSAGE
    assert "unreadable StepRequest" in garbage.error.message
    assert mismatch.step_id == 7 and mismatch.error.code == ErrorCode.FINGERPRINT_MISMATCH
    assert "0123456789abcdef" in mismatch.error.message and fingerprint in mismatch.error.message
    assert answer.error is None and answer.step_id == 8 and answer.replica == "mtp-a"
    assert torch.equal(torch.from_numpy(answer.rows()), local_codes(model, rows))
    after = (await replica_stats(nats_server.url, 2))["mtp-a"]
    refused = {code: after["steps_refused"].get(code, 0) - before["mtp-a"]["steps_refused"].get(code, 0)
               for code in ("bad_message", "fingerprint_mismatch")}
    assert refused == {"bad_message": 1, "fingerprint_mismatch": 1}
    assert after["steps_served"] == before["mtp-a"]["steps_served"] + 1


async def test_a_client_for_other_weights_is_refused_by_every_replica_naming_them(running, nats_server, model):
    rows = make_rows(model, 2, seed=30, sampled=False)
    async with predictor_client(nats_server.url, "0123456789abcdef", timeout_s=STEP_S, attempts=3) as client:
        with pytest.raises(RemoteStepFailed) as failed:
            await asyncio.to_thread(client.predict_rest, *rows.args())
        assert client.replicas.live() == [], "a replica serving other weights is no candidate any more"
    assert sorted(failed.value.replicas) == ["mtp-a", "mtp-b"]
    assert str(failed.value).count("fingerprint_mismatch") == 2


async def test_a_step_the_model_cannot_take_is_rejected_at_once_not_resent(running, nats_server, tiny_checkpoint,
                                                                           model):
    rows = make_rows(model, 2, seed=40, sampled=False)
    bad = dataclasses.replace(rows, c0=torch.tensor([1, model.config.talker.vocab_size + 5]))
    async with predictor_client(nats_server.url, checkpoint_fingerprint(tiny_checkpoint), timeout_s=STEP_S,
                                attempts=3) as client:
        with pytest.raises(StepRejected) as rejected:
            await asyncio.to_thread(client.predict_rest, *bad.args())
        assert sum(stats["sent"] for stats in client.stats()["replicas"].values()) == 1
        assert torch.equal(await asyncio.to_thread(client.predict_rest, *rows.args()), local_codes(model, rows))
    assert rejected.value.code == ErrorCode.INVALID_REQUEST and "outside" in str(rejected.value)
