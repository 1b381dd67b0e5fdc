"""The step timeline: a step's device time and the stream's idle time before it, from the events a step records."""

from __future__ import annotations

import pytest
import torch
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.decode.stats import StepSeconds
from services.engine.engine_request import EngineRequest
from services.engine.step_timeline import StepTimeline
from services.metrics import names
from services.metrics.timings import snapshots
from services.metrics.from_stats import decode_families, stats_registry
from services.model.sampling import SamplingParams
from tests.support.engine_helpers import load_tiny, make_request, new_engine
from tests.unit.test_metrics_timings import _decode_stats


def _timeline() -> tuple[StepTimeline, StepSeconds]:
    """A timeline reporting into decode's step times, as the decode service wires them."""
    times = StepSeconds()
    return StepTimeline(times.record), times


class _Mark:
    """A completed CUDA event's stand-in on the CPU: its moment on the device's clock, in milliseconds."""

    def __init__(self, at_ms: float) -> None:
        self.at_ms = at_ms

    def elapsed_time(self, later: _Mark) -> float:
        return later.at_ms - self.at_ms


def test_device_time_by_kind_and_the_idle_stream_between_steps():
    timeline, times = _timeline()
    timeline.applied(_Mark(0.0), _Mark(8.0), mixed=False)  # the first step: no idle time before it is known
    timeline.applied(_Mark(8.0), _Mark(17.0), mixed=True)  # queued before the first ended: no idle time
    timeline.applied(_Mark(20.0), _Mark(26.0), mixed=False)  # the host was 3 ms late
    snapshot = snapshots(times.timings)
    assert snapshot["device_decode"]["count"] == 2 and snapshot["device_mixed"]["count"] == 1
    assert snapshot["device_mixed"]["p50_ms"] == pytest.approx(9.0)
    assert snapshot["device_decode"]["max_ms"] == pytest.approx(8.0)
    assert snapshot["idle"]["count"] == 2 and snapshot["idle"]["max_ms"] == pytest.approx(3.0)
    assert snapshot["idle"]["p50_ms"] == pytest.approx(0.0)


def test_a_pause_with_nothing_in_flight_is_not_counted_as_idle():
    timeline, times = _timeline()
    timeline.applied(_Mark(0.0), _Mark(5.0), mixed=False)
    timeline.restart()  # the engine ran dry; the next step comes when a request does
    timeline.applied(_Mark(900.0), _Mark(905.0), mixed=False)
    assert snapshots(times.timings)["idle"]["count"] == 0


def test_a_slow_step_is_logged_with_what_it_held_and_a_normal_one_is_not(caplog):
    timeline, _ = _timeline()
    with caplog.at_level("WARNING", logger="services.engine.step_timeline"):
        timeline.applied(_Mark(0.0), _Mark(8.0), mixed=False, rows=64, tokens=64)
        assert caplog.records == []
        timeline.applied(_Mark(8.0), _Mark(402.0), mixed=True, rows=64, tokens=1730, launch_s=0.3891)
    [record] = caplog.records
    assert record.getMessage() == ("a mixed step of 64 sequences and 1730 tokens took 394 ms on the device, 389 ms "
                                   "of it launching on the host")


def test_steps_without_events_count_only_their_launch():
    timeline, times = _timeline()
    timeline.launched(0.002)
    timeline.applied(None, None, mixed=False)  # a CPU step records no events
    snapshot = snapshots(times.timings)
    assert snapshot["launch"]["count"] == 1 and snapshot["launch"]["p50_ms"] == pytest.approx(2.0)
    assert snapshot["device_decode"]["count"] == snapshot["idle"]["count"] == 0


def test_the_step_timings_render_as_a_histogram_by_part():
    timeline, times = _timeline()
    timeline.applied(_Mark(0.0), _Mark(7.0), mixed=False)
    timeline.applied(_Mark(7.0), _Mark(16.0), mixed=True, launch_s=0.003)
    stats = _decode_stats({}) | {"step_seconds": snapshots(times.timings)}
    text = generate_latest(stats_registry(lambda: stats, decode_families)).decode()
    family = next(f for f in text_string_to_metric_families(text) if f.name == names.STEP)
    counts = {s.labels["part"]: s.value for s in family.samples if s.name == names.STEP + "_count"}
    assert counts == {"device_decode": 1, "device_mixed": 1, "idle": 1, "launch": 0, "launch_mixed": 1}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA events need a GPU")
def test_real_events_time_work_on_the_device():
    from services.engine.in_flight_step import InFlightStep

    timeline, times = _timeline()
    device = torch.device("cuda")
    for _ in range(2):
        begun = InFlightStep.begin_on_device(device)
        a = torch.randn(2048, 2048, device=device)
        codes = torch.zeros((1, 16), dtype=torch.int64, device=device) + (a @ a).sum().long()
        step = InFlightStep.start(["r"], codes, 0, begun=begun)
        step.result()
        timeline.applied(step.begun, step.arrived, mixed=False)
    snapshot = snapshots(times.timings)
    assert snapshot["device_decode"]["count"] == 2 and snapshot["device_decode"]["p50_ms"] > 0


def test_an_engine_hands_each_step_to_the_sink_it_was_built_with(tiny_checkpoint):
    """The sink is the engine's from its constructor (decode's StepSeconds), not set on its parts afterwards: on the
    CPU each step that ran something reports its launch (no device events there)."""
    model, tokenizer = load_tiny(tiny_checkpoint)
    seen: list[tuple[str, float]] = []
    engine = new_engine(model, blocks=64, step_sink=lambda part, seconds: seen.append((part, seconds)))
    engine.add_request(EngineRequest("r", make_request(tokenizer, "hello there"), 1, SamplingParams(), 3))
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    launches = [seconds for part, seconds in seen if part == "launch"]
    assert len(launches) == steps == 3 and all(seconds > 0 for seconds in launches)
    assert {part for part, _ in seen} <= {"launch", "launch_mixed"}
