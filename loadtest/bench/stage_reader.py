"""One target's stage breakdown for a whole bench run: marks EVENTS before the first request, reads the run's events
back after the last, and summarizes each level's first packets by stage (stages.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

from nats.aio.client import Client

from loadtest.bench.loadgen import LevelResult
from loadtest.bench.stages import EventsMark, events_mark, read_marks, level_stages, unix_offset
from services.bus.connection import CredentialsRefused
from services.runtime.observer import connect_observer

CONNECT_TIMEOUT_S = 10.0


class EventsUnreachable(RuntimeError):
    """The mesh's NATS (or its EVENTS stream) could not be read: the bench would measure without its breakdown."""

    code = "events_unreachable"


class StageReader:
    def __init__(self, nc: Client, mark: EventsMark) -> None:
        self._nc, self._mark = nc, mark

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, nats_url: str) -> AsyncIterator[StageReader]:
        """Connected to `nats_url`, EVENTS marked; raises EventsUnreachable before any request is sent."""
        try:
            nc = await connect_observer(nats_url, "voxmesh-bench", initial_timeout_s=CONNECT_TIMEOUT_S)
        except CredentialsRefused as exc:
            raise EventsUnreachable(f"{nats_url} refused the bench's credentials ({exc}); the read-only observer is "
                                    "enough: VOXMESH_NATS_USER=observer VOXMESH_NATS_PASSWORD_FILE=<voxmesh up's "
                                    "state dir>/nats-auth/observer.password") from exc
        except Exception as exc:  # noqa: BLE001 - whatever stops the connection, the bench must not start
            raise EventsUnreachable(f"cannot connect to {nats_url} for the stage breakdown: {exc}") from exc
        try:
            try:
                mark = await events_mark(nc.jetstream())
            except Exception as exc:  # noqa: BLE001
                raise EventsUnreachable(f"{nats_url} has no readable EVENTS stream: {exc!r}") from exc
            yield cls(nc, mark)
        finally:
            await nc.close()

    async def stages(self, results: Sequence[LevelResult]) -> list[dict | None]:
        """Each level's `level_stages` (None for a level none of whose requests has every event)."""
        ids = [record.request_id for result in results for record in result.records if record.request_id]
        marks = await read_marks(self._nc.jetstream(), self._mark, ids)
        offset = unix_offset()
        return [level_stages(result.records, marks, offset) for result in results]
