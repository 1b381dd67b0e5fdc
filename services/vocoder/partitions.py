"""Which CODES partitions this vocoder serves: claimed on `part.<n>` by compare-and-set with an epoch.

Each pass of `reconcile()` claims every wanted partition that is unowned or whose owner's lease lapsed (a takeover:
epoch + 1 over the exact revision read, so of two racing vocoders one wins), and notices partitions this replica
lost (another vocoder claimed them after this one's lease lapsed) so that it stops serving them. On a clean exit
`release_all()` deletes this replica's claims so that a standby takes them at once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from messages import subjects
from services.bus.claims import PartitionClaim, claim_partition, read_partition
from services.bus.errors import OwnershipConflict
from services.bus.leases import is_alive
from services.runtime.settings_schema import SettingsError

log = logging.getLogger(__name__)

OnGained = Callable[[int, PartitionClaim], Awaitable[None]]
OnLost = Callable[[int], Awaitable[None]]


def parse_partitions(spec: str, num_partitions: int) -> tuple[int, ...]:
    """`"all"` or a comma-separated list like `"0,2"` -> sorted partition numbers, each below `num_partitions`."""
    text = spec.strip().lower()
    if text == "all":
        return tuple(range(num_partitions))
    try:
        chosen = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise SettingsError(f"--partitions / VOXMESH_PARTITIONS: {spec!r} is neither 'all' nor a comma-separated "
                            f"list of partition numbers") from None
    if not chosen:
        raise SettingsError("--partitions / VOXMESH_PARTITIONS: name at least one partition, or 'all'")
    bad = [p for p in chosen if not 0 <= p < num_partitions]
    if bad:
        raise SettingsError(f"--partitions / VOXMESH_PARTITIONS: {bad} outside 0..{num_partitions - 1} "
                            f"(num_partitions is {num_partitions})")
    return tuple(chosen)


class PartitionManager:
    """Claims and tracks this replica's partitions; calls `on_gained` / `on_lost` as ownership changes."""

    def __init__(self, kv: KeyValue, replica: str, wanted: tuple[int, ...], *, on_gained: OnGained,
                 on_lost: OnLost) -> None:
        self._kv = kv
        self.replica = replica
        self.wanted = wanted
        self._on_gained, self._on_lost = on_gained, on_lost
        self.owned: dict[int, PartitionClaim] = {}

    async def reconcile(self) -> None:
        """One pass over the wanted partitions."""
        for partition in self.wanted:
            current = await read_partition(self._kv, partition)
            if partition in self.owned:
                await self._check_still_owned(partition, current)
            else:
                await self._maybe_claim(partition, current)

    async def _maybe_claim(self, partition: int, current: PartitionClaim | None) -> None:
        if current is not None and current.record.replica != self.replica:
            if await is_alive(self._kv, current.record.replica):
                return  # served by a live vocoder
            log.warning("vocoder %s owning partition %d is gone; taking it over", current.record.replica, partition)
        try:
            claim = await claim_partition(self._kv, partition, self.replica, current=current)
        except OwnershipConflict:
            log.info("another vocoder claimed partition %d first", partition)
            return
        self.owned[partition] = claim
        log.info("claimed partition %d (epoch %d)", partition, claim.record.epoch)
        await self._on_gained(partition, claim)

    async def _check_still_owned(self, partition: int, current: PartitionClaim | None) -> None:
        mine = self.owned[partition]
        if current is not None and current.revision == mine.revision:
            return
        if current is None:  # the key expired (bucket ttl) or was deleted by hand: write our claim again
            try:
                self.owned[partition] = await claim_partition(self._kv, partition, self.replica, current=None)
                return
            except OwnershipConflict:
                current = await read_partition(self._kv, partition)
        owner = current.record.replica if current is not None else "?"
        log.warning("lost partition %d to %s; stopping its consumer", partition, owner)
        del self.owned[partition]
        await self._on_lost(partition)

    async def release_all(self) -> None:
        """Delete this replica's claims (only where they are still ours), so that a standby claims them now."""
        for partition, claim in list(self.owned.items()):
            try:
                await self._kv.delete(subjects.partition_key(partition), last=claim.revision)
            except (KeyWrongLastSequenceError, KeyNotFoundError):
                pass  # someone else holds it now: not ours to delete
            del self.owned[partition]
        log.info("released partitions")
