"""The event loop's turns beside the engine thread's launches (services.decode.launch_turns, the engine's launch
listener)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.decode.launch_turns import LaunchTurns
from services.engine.launch_listener import LaunchListener
from services.engine.engine_request import EngineRequest
from services.model.sampling import SamplingParams
from tests.support.engine_helpers import load_tiny, make_request, new_engine


async def _yield_to_loop(times: int = 5) -> None:
    for _ in range(times):
        await asyncio.sleep(0)


async def test_loop_work_waits_out_a_launch_and_goes_on_when_it_ends():
    turns = LaunchTurns(asyncio.get_running_loop())
    await asyncio.wait_for(turns.launched(), 5)  # no launch under way: at once
    assert turns.num_waits == 0
    begun, end = threading.Event(), threading.Event()

    def engine_thread() -> None:
        turns.begins()
        begun.set()
        end.wait(10)
        turns.ends()

    thread = threading.Thread(target=engine_thread)
    thread.start()
    await asyncio.to_thread(begun.wait, 10)
    waiting = asyncio.ensure_future(turns.launched())
    await _yield_to_loop()
    assert not waiting.done() and turns.num_waits == 1  # held while the launch runs
    end.set()
    await asyncio.wait_for(waiting, 5)  # the launch's end wakes it
    thread.join(10)


async def test_a_launch_that_ends_while_the_loop_registers_its_wait_still_wakes_it():
    # The engine thread's `ends` runs between the loop's read of "launching" and its registration: the wake-up it
    # schedules runs on the loop after the registration, so the waiter is not left behind.
    loop = asyncio.get_running_loop()
    turns = LaunchTurns(loop)
    turns.begins()
    original = loop.create_future

    def racing_future() -> asyncio.Future:
        loop.create_future = original  # once: the waiter's own future
        turns.ends()  # as if the engine thread ran just here
        return original()

    waiting = asyncio.ensure_future(turns.launched())  # not started until the loop runs it
    loop.create_future = racing_future
    try:
        await asyncio.sleep(0)  # the waiter runs up to its wait (sleep(0) makes no future)
    finally:
        loop.create_future = original
    await asyncio.wait_for(waiting, 5)
    assert turns.num_waits == 1


async def test_back_to_back_launches_hold_the_loop_for_one_launch_only():
    # The engine thread ends a launch and begins the next before the loop runs: the waiter goes on after the first.
    turns = LaunchTurns(asyncio.get_running_loop())
    turns.begins()
    waiting = asyncio.ensure_future(turns.launched())
    await _yield_to_loop()
    turns.ends()
    turns.begins()
    await asyncio.wait_for(waiting, 5)
    assert turns.num_waits == 1


async def test_a_cancelled_waiter_leaves_no_trace():
    turns = LaunchTurns(asyncio.get_running_loop())
    turns.begins()
    waiting = asyncio.ensure_future(turns.launched())
    await _yield_to_loop()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert turns._waiters == []
    turns.ends()
    await asyncio.wait_for(turns.launched(), 5)


def test_ends_after_the_loop_closed_is_harmless():
    loop = asyncio.new_event_loop()
    turns = LaunchTurns(loop)
    loop.close()
    turns.begins()
    turns.ends()  # a step finishing during shutdown must not raise on the engine thread


class _Recording(LaunchListener):
    """Records each call with the runner's launches so far (`launches`, counted by the runner's wrapper)."""

    def __init__(self) -> None:
        self.launches, self.calls = 0, []

    def begins(self) -> None:
        self.calls.append(("begins", self.launches))

    def ends(self) -> None:
        self.calls.append(("ends", self.launches))


def _engine_with_one_request(checkpoint, overlap: bool, fail: bool = False):
    """A tiny engine holding one request, its runner's launches counted (and raising with `fail`), its launch listener
    recording: (engine, listener)."""
    model, tokenizer = load_tiny(checkpoint)
    phase = _Recording()
    engine = new_engine(model, blocks=64, overlap_steps=overlap, launch_listener=phase)
    launch = engine.runner.launch

    def counted(scheduled):
        phase.launches += 1
        if fail:
            raise RuntimeError("launch failed")
        return launch(scheduled)

    engine.runner.launch = counted
    engine.add_request(EngineRequest(
        "r", make_request(tokenizer, "hello there"), seed=1, params=SamplingParams(), max_new_frames=3))
    return engine, phase


def test_every_step_tells_its_phase_around_the_launch_and_before_waiting(tiny_checkpoint):
    engine, phase = _engine_with_one_request(tiny_checkpoint, overlap=True)  # launches that only queue, as on CUDA
    frames = [frame for _ in range(4) for frame in engine.step().frames]
    assert [frame.index for frame in frames] == [0, 1, 2]  # the request ran to its end through the told launches
    assert phase.calls == [("begins", 0), ("ends", 1), ("begins", 1), ("ends", 2), ("begins", 2), ("ends", 3),
                           ("begins", 3), ("ends", 3)]  # the last step launches nothing, and still ends its phase


def test_a_launch_that_runs_the_step_itself_is_not_told(tiny_checkpoint):
    # Without overlapped steps (the CPU's default) a launch is the whole model run: holding the loop's work for it
    # would hold it for every step, back to back.
    engine, phase = _engine_with_one_request(tiny_checkpoint, overlap=False)
    engine.step()
    assert phase.launches == 1 and phase.calls == []


def test_a_launch_that_raises_still_ends_its_phase(tiny_checkpoint):
    engine, phase = _engine_with_one_request(tiny_checkpoint, overlap=True, fail=True)
    output = engine.step()  # the failure is isolated (the re-runs raise too): the request ends, the engine serves on
    assert [outcome.request_id for outcome in output.outcomes] == ["r"]
    assert phase.calls[:2] == [("begins", 0), ("ends", 1)]
