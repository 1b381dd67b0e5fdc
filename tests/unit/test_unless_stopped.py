"""unless_stopped: the work's result, None on a stop, and nothing left behind when the caller is cancelled."""

from __future__ import annotations

import asyncio
import gc

import pytest

from services.bus.stoppable import unless_stopped

NEVER_RETRIEVED = "Task exception was never retrieved"


@pytest.fixture
async def loop_errors():
    """What the running loop's exception handler is given (a task's unread error is reported there when freed)."""
    found: list[dict] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: found.append(context))
    yield found
    loop.set_exception_handler(None)


async def test_the_work_result_is_returned():
    assert await unless_stopped(asyncio.sleep(0, result=7), asyncio.Event()) == 7


async def test_a_stop_cancels_the_work_and_gives_none():
    stop, started, cancelled = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def work():
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    waiting = asyncio.create_task(unless_stopped(work(), stop))
    await started.wait()
    stop.set()
    assert await waiting is None
    assert cancelled.is_set()


async def test_the_work_error_is_raised():
    async def refused():
        raise ConnectionError("no responders")

    with pytest.raises(ConnectionError, match="no responders"):
        await unless_stopped(refused(), asyncio.Event())


async def test_work_failing_after_its_caller_is_cancelled_leaves_no_unread_error(loop_errors):
    """The caller is cancelled, and the work, told to stop, fails instead (asyncio.wait_for in Python 3.11 drops a
    cancellation that comes in the turn its inner future completes: a lease renewal the bus refused as the service
    stops): the caller sees its cancellation, and the work's error is not reported later as never retrieved."""
    started = asyncio.Event()
    work_tasks: list[asyncio.Task] = []

    async def fails_instead_of_stopping():
        work_tasks.append(asyncio.current_task())
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass  # the cancellation lost
        raise ConnectionError("no responders")

    caller = asyncio.create_task(unless_stopped(fails_instead_of_stopping(), asyncio.Event()))
    await started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.wait(work_tasks)  # waits for the work's end without reading its outcome
    assert work_tasks[0].done() and not work_tasks[0].cancelled()
    work_tasks.clear()
    del caller
    gc.collect()  # an unread error is reported when its task is freed

    assert [context["message"] for context in loop_errors if context["message"] == NEVER_RETRIEVED] == []
