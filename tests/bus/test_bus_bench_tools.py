"""The bus benchmarks (loadtest/bus) on one real nats-server: the operation bench's and the load generator's
documents have every figure, in order, from real publishes."""

from __future__ import annotations

from loadtest.bus.bus_load import sweep
from loadtest.bus.bus_ops_bench import run as run_ops
from loadtest.bus.request_ops import CHUNK_FRAMES, OPS
from loadtest.bus.stream_shape import StreamShape

ITERATIONS = 20


def _ordered(summary: dict) -> bool:
    return 0 < summary["p50"] <= summary["p95"] <= summary["p99"] <= summary["max"]


async def test_the_ops_bench_times_every_request_path_operation_on_one_server() -> None:
    document = await run_ops(ITERATIONS, ("R1",), time_limit_s=120.0)

    assert document["iterations"] == ITERATIONS and list(document["buses"]) == ["R1"]
    assert "ratio_r3_over_r1" not in document  # a ratio only where both buses ran
    ops = document["buses"]["R1"]
    assert set(ops) == set(OPS)
    chunks = len(CHUNK_FRAMES)
    expected = {"codes_append": ITERATIONS * (chunks + 1), "codes_append_first": ITERATIONS,
                "codes_delivery": ITERATIONS * chunks, "audio_delivery": ITERATIONS * chunks}
    for op, summary in ops.items():
        assert summary["n"] == expected.get(op, ITERATIONS), (op, summary)
        assert _ordered(summary), (op, summary)
    assert document["leaders"]["R1"]["CODES"] == "bench-single"  # the one server leads everything
    assert document["machine"]["cpus"] >= 1 and document["commit"]


async def test_the_load_generator_publishes_codes_and_audio_at_the_streams_rate() -> None:
    shape = StreamShape(frames=20)  # 1.6 s requests: several end within a level
    document = await sweep([2, 4], seconds=4.0, warmup_s=1.0, shape=shape, time_limit_s=120.0, labels=("R1",))

    levels = document["levels"]["R1"]
    assert [level["streams"] for level in levels] == [2, 4], document["stopped"]
    for level in levels:
        rates, latency = level["per_second"], level["latency_ms"]
        # 12.5 frames/s per stream in chunks of 2, 2, 4, 8, 4 frames (plus a CodesEnd): about 3.5 codes messages per
        # stream-second; bounded well apart from zero and from a runaway generator.
        per_stream = rates["codes_msgs"] / level["streams"]
        assert 1.5 < per_stream < 6.0, rates
        assert rates["audio_msgs"] > 0 and rates["audio_bytes"] / rates["audio_msgs"] > 2 * 1920 * 2, rates
        for key in ("codes_append", "codes_delivery", "audio_delivery", "codes_to_audio", "generator_lag"):
            assert latency[key]["n"] > 0, (key, latency)
        assert level["servers"]["members"] == 1 and level["servers"]["route_out_bytes_per_s"] == 0
        assert level["servers"]["cpu_cores"] > 0
    assert document["sustained_streams"]["R1"] in (2, 4, None)
    assert document["stream_shape"]["chunk_frames"] == [2, 2, 4, 8, 4]
