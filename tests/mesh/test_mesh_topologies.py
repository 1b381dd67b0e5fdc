"""Every disaggregated topology comes up from its compose file under `voxmesh up --topology NAME` on the tiny CPU
model and gives the codes of an offline run (the same codes `single` gives) for concurrent greedy and seeded
requests, with its remote stage really used: the mtp replicas served the code predictor's steps, the prefill
replicas handed prompts over. (1p1d has its own file with its faults: tests/mesh/test_mesh_remote_prefill.py.)"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.support.mesh import run_mesh
from services.runtime.lifecycle import micro_name
from tests.support.mesh_client import codes_on_bus, replica_stats, replicas_serving, stream_speech
from tests.support.offline_synthesis import synth_codes

FRAMES = 12
BODIES = (
    {"input": "Every topology speaks this one the same.", "voice": "vivian", "temperature": 0,
     "max_new_tokens": FRAMES},
    {"input": "A second greedy request beside it.", "voice": "ryan", "temperature": 0, "max_new_tokens": FRAMES},
    {"input": "And a sampled one, with its seed.", "voice": "eric", "seed": 4242, "max_new_tokens": FRAMES},
)
REMOTE_WORK = {
    "split": None,
    "mtp": ("mtp", 2, "steps_served"),
    "1pNd": ("prefill", 1, "handed_over"),
    "MpNd": ("prefill", 2, "handed_over"),
}
"""The remote stage of each topology: its service, its replicas, and the counter that shows it worked."""


@pytest.fixture(scope="module")
def oracle(tiny_checkpoint) -> list[np.ndarray]:
    return [synth_codes(tiny_checkpoint, body["input"], body["voice"], seed=body.get("seed"),
                        frames=FRAMES) for body in BODIES]


ROUNDS = 3
"""Rounds of the three requests a topology gets for its remote stage to serve one. The gateway routes a prompt to
the prefill queue only after a look at it; a look that times out (1 s, a loaded CI machine) sends that moment's
requests to decode, which prefills them itself, as it should: so the remote stage is asked to serve within a few
rounds, each round's codes checked."""


@pytest.mark.parametrize("topology", sorted(REMOTE_WORK))
async def test_the_topology_gives_the_codes_of_single(topology, oracle, tiny_checkpoint, tmp_path):
    remote = REMOTE_WORK[topology]
    with run_mesh(tiny_checkpoint, tmp_path / "state", "--topology", topology) as mesh:
        if remote is not None:  # serving before the requests come: they are routed to it
            await replicas_serving(mesh.nats_url, remote[0], remote[1])
        for _ in range(ROUNDS):
            results = await asyncio.gather(*[stream_speech(mesh.gateway_url, body) for body in BODIES])
            codes = [(await codes_on_bus(mesh.nats_url, result.request_id))[0] for result in results]
            for body, result, got, want in zip(BODIES, results, codes, oracle):
                assert result.end["type"] == "audio.done", result.end
                np.testing.assert_array_equal(got, want, err_msg=f"{topology}: {body['input']}")
            if remote is None:
                break
            work = await replica_stats(mesh.nats_url, micro_name(remote[0]), remote[1])
            if sum(stats[remote[2]] for stats in work.values()) >= 1:
                break
    if remote is not None:
        assert sum(stats[remote[2]] for stats in work.values()) >= 1, work
