"""The bus benchmarks (loadtest/bus) on one server and a real three-server cluster side by side: every path gets
every figure, the cluster's leaders are placed where the bench asked, and each figure's ratio to R1 is there."""

from __future__ import annotations

from loadtest.bus.bus_load import sweep
from loadtest.bus.bus_ops_bench import PATHS
from loadtest.bus.bus_ops_bench import run as run_ops
from loadtest.bus.request_ops import OPS
from loadtest.bus.stream_shape import StreamShape

ITERATIONS = 20


async def test_the_ops_bench_runs_one_server_and_a_cluster_side_by_side() -> None:
    document = await run_ops(ITERATIONS, PATHS, time_limit_s=180.0)

    assert document["iterations"] == ITERATIONS and set(document["buses"]) == set(PATHS)
    for label in PATHS:
        for op in OPS:
            summary = document["buses"][label][op]
            assert summary["n"] >= ITERATIONS and 0 < summary["p50"] <= summary["p99"], (label, op, summary)
    # every stream and consumer the bench uses was led from the member R3L's client is on
    assert set(document["leaders"]["R3"].values()) == {"bench-1"}, document["leaders"]
    for op in OPS:
        for key in ("ratio_r3_over_r1", "ratio_r3l_over_r1"):
            ratio = document[key][op]
            assert ratio["p50"] is not None and ratio["p50"] > 0, (key, op, ratio)


async def test_the_load_generator_sweeps_both_buses_and_the_cluster_replicates_over_its_routes() -> None:
    document = await sweep([2, 4], seconds=4.0, warmup_s=1.0, shape=StreamShape(frames=20), time_limit_s=180.0)

    for label in ("R1", "R3"):
        assert [level["streams"] for level in document["levels"][label]] == [2, 4], document["stopped"]
    for r1, r3 in zip(document["levels"]["R1"], document["levels"]["R3"], strict=True):
        assert r1["servers"]["members"] == 1 and r3["servers"]["members"] == 3
        assert r1["servers"]["route_out_bytes_per_s"] == 0
        # the codes' copies and the audio (gateway and vocoder on different members) cross the routes
        assert r3["servers"]["route_out_bytes_per_s"] > r3["per_second"]["audio_bytes"] / 2, r3
    assert [row["streams"] for row in document["ratio_r3_over_r1"]] == [2, 4]
    assert all(row["codes_append"]["p50"] > 0 for row in document["ratio_r3_over_r1"])
