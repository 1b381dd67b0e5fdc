"""Late launch: the next overlapped step is queued just before the one in flight ends, or at once when a request
arrives, so a request that arrives while a step runs joins the next step instead of the one after it."""

from __future__ import annotations

import threading
import time

import pytest

from services.engine.engine_request import EngineRequest
from services.engine.launch_pace import LaunchPace
from services.engine.request_inbox import RequestInbox
from services.model.sampling import SamplingParams
from tests.support.engine_helpers import TEXTS, load_tiny, make_request, new_engine

GUARD_S = 30.0  # a bound on a hang, never a synchronisation


def test_the_pace_times_a_launch_by_the_recent_device_and_launch_times():
    pace = LaunchPace(smoothing=0.5, margin_s=0.001)
    assert pace.launch_at() is None, "nothing measured"
    pace.launched(1.000, 0.002, mixed=False)
    assert pace.launch_at() is None, "no step's codes arrived yet"
    pace.launched(1.003, 0.002, mixed=False)
    pace.arrived(1.010)  # the first arrival: nothing before it to measure from
    assert pace.launch_at() is None
    pace.launched(1.013, 0.002, mixed=False)
    pace.arrived(1.020)  # the second step ran from 1.010 (the first's codes) to 1.020
    assert pace.device_s == {False: pytest.approx(0.010)} and pace.launch_s == pytest.approx(0.002)
    # The step in flight (queued at 1.013) began at 1.020: queue the next at 1.020 + 0.010 - 0.002 - 0.001.
    assert pace.launch_at() == pytest.approx(1.027)


def test_a_step_queued_after_the_one_before_ended_is_timed_from_its_queueing():
    """Queued late (the device idle meanwhile), a step's device time starts at its queueing, not at the previous
    step's end: an idle gap never counts as device time, so a late launch does not make the next one later still."""
    pace = LaunchPace(smoothing=1.0, margin_s=0.0)
    pace.launched(0.000, 0.001, mixed=False)
    pace.arrived(0.010)
    pace.launched(0.015, 0.001, mixed=False)  # queued 5 ms after the step before it ended
    pace.arrived(0.023)
    assert pace.device_s[False] == pytest.approx(0.008)


def test_mixed_and_decode_only_steps_are_timed_apart_and_a_restart_keeps_the_averages():
    pace = LaunchPace(smoothing=1.0, margin_s=0.0)
    for queued, arrived, mixed in ((0.0, 0.010, False), (0.009, 0.022, True), (0.021, 0.030, False)):
        pace.launched(queued, 0.001, mixed=mixed)
        pace.arrived(arrived)
    assert pace.device_s == {True: pytest.approx(0.012), False: pytest.approx(0.008)}
    pace.launched(0.029, 0.001, mixed=True)
    assert pace.launch_at() == pytest.approx(0.030 + 0.012 - 0.001), "a mixed step in flight: the mixed time"
    pace.restart()
    assert pace.launch_at() is None and pace.device_s == {True: pytest.approx(0.012), False: pytest.approx(0.008)}


def test_the_inbox_wait_ends_at_its_deadline_or_as_soon_as_a_request_is_queued():
    inbox = RequestInbox()
    assert inbox.wait_for_arrival(time.perf_counter() - 1) is False, "a deadline passed: no wait"
    waiting = threading.Event()
    got: list[bool] = []

    def wait() -> None:
        waiting.set()
        got.append(inbox.wait_for_arrival(time.perf_counter() + 60))

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert waiting.wait(GUARD_S)
    inbox.put(_Queued("a"), _NoScheduler())
    waiter.join(GUARD_S)
    assert not waiter.is_alive() and got == [True], "a queued request ends the wait long before its deadline"
    assert inbox.wait_for_arrival(time.perf_counter() + 60) is True, "one already queued: no wait"


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return load_tiny(tiny_checkpoint)


def _two_steps_in(tiny):
    """An engine with late launch and one request whose steps overlap, two steps in: a step is in flight and the
    codes of the one before it have arrived."""
    model, tokenizer = tiny
    engine = new_engine(model, blocks=96, overlap_steps=True, late_launch=True)
    request = EngineRequest("a", make_request(tokenizer, TEXTS[0]), 1, SamplingParams(), 20)
    assert engine.add_request(request) is None
    engine.step(), engine.step()
    return engine, tokenizer


def test_a_request_that_arrives_while_a_step_waits_for_its_launch_time_is_in_that_step(tiny):
    engine, tokenizer = _two_steps_in(tiny)
    engine._pace.device_s = {False: 60.0, True: 60.0}  # the step in flight "ends" in a minute: the next one waits
    waiting = threading.Event()
    wait_for_arrival = engine.inbox.wait_for_arrival

    def told(until: float) -> bool:
        waiting.set()
        return wait_for_arrival(until)

    engine.inbox.wait_for_arrival = told
    stepper = threading.Thread(target=engine.step)
    stepper.start()
    assert waiting.wait(GUARD_S), "with a step in flight and its time known, the next launch waits"
    assert engine.add_request(EngineRequest("b", make_request(tokenizer, TEXTS[1]), 2, SamplingParams(), 5)) is None
    stepper.join(GUARD_S)
    assert not stepper.is_alive(), "the arrival ends the wait"
    scheduled, _ = engine._in_flight
    assert {item.seq.request_id for item in scheduled.scheduled} == {"a", "b"}, "it joined the step just launched"


def test_without_an_arrival_the_next_step_is_queued_at_its_launch_time(tiny):
    engine, _ = _two_steps_in(tiny)
    engine._pace.device_s = {False: 0.3, True: 0.3}
    launch_at = engine._pace.launch_at()
    engine.step()
    assert time.perf_counter() >= launch_at, "it was not queued before its time"


class _NoScheduler:
    """A scheduler that holds no request (all the inbox asks it: whether the id is a duplicate)."""

    def get(self, request_id: str) -> None:
        return None


class _Queued:
    """All the inbox reads of a sequence: its id."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
