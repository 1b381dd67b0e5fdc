"""Awaiting work that a stop may cut short (a connect attempt, a lease renewal the bus does not answer)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def unless_stopped(work: Awaitable[T], stop: asyncio.Event) -> T | None:
    """`work`'s result, or None if `stop` is set first (then `work` is cancelled); `work`'s error is raised."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # cancelled from outside: leave no work behind
        task.cancel()
        # The work may end in an error instead of its cancellation (Python 3.11's asyncio.wait_for loses a cancel
        # that comes in the turn its future completes: a lease renewal the bus refused as the service stops). That
        # error is moot now; left unread, it would be logged as "never retrieved" whenever the collector frees it.
        task.add_done_callback(_read_outcome)
        raise
    finally:
        stopped.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None
    return task.result()


def _read_outcome(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()
