"""Which CODES partitions this vocoder serves: claimed on `part.<n>` by compare-and-set with an epoch.

Each pass of `reconcile()` reads the partitions' claims and the live vocoders' leases. It claims an unserved
partition (unowned, or its owner's lease lapsed: a takeover, epoch + 1 over the exact revision read, so of two racing
vocoders one wins) and notices partitions this replica lost (another vocoder claimed them after this one's lease
lapsed) so that it stops serving them. A replica that wants every partition (`all`) keeps to its share of them
(partition_share.py): it claims only while it holds fewer, and while it holds more and another live vocoder fewer it
hands one over per pass, the way a clean exit does: stop fetching, finish the work taken, then delete the claim
(never the other way round, so two vocoders never consume one partition). A replica pinned to a list of partitions
claims all of them, as its operator asked. On a clean exit `release_all()` deletes this replica's claims so that a
standby takes them at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from messages import subjects
from services.bus.claims import PartitionClaim, claim_partition, read_partition
from services.bus.errors import OwnershipConflict
from services.bus.leases import live_leases
from services.runtime.settings_schema import SettingsError
from services.vocoder.partition_share import HandoffPause, PartitionView, UnservedClock

log = logging.getLogger(__name__)

OnGained = Callable[[int, PartitionClaim], Awaitable[None]]
OnLost = Callable[[int], Awaitable[None]]
LoadOf = Callable[[int], int]
Claims = dict[int, PartitionClaim | None]

SERVICE = "vocoder"  # the service name on the vocoders' leases


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
    """Claims and tracks this replica's partitions; calls `on_gained` / `on_lost` / `on_released` as ownership
    changes (`on_released`: a hand-off; it returns once the partition's work is finished and nothing is fetched).

    `patience_s`: how long a partition may stay unserved before a replica past its share claims it anyway (the lease
    ttl: within it, a live vocoder short of its share has had several control passes to claim it). `load_of`: the
    in-flight requests of a partition here; the hand-off picks the least busy one (fewest streams to rebuild)."""

    def __init__(self, kv: KeyValue, replica: str, wanted: tuple[int, ...], *, num_partitions: int,
                 patience_s: float, on_gained: OnGained, on_lost: OnLost, on_released: OnLost,
                 load_of: LoadOf) -> None:
        self._kv = kv
        self.replica = replica
        self.wanted = wanted
        self.num_partitions = num_partitions
        self.serves_a_share = wanted == tuple(range(num_partitions))  # `all` (or a list naming every one)
        self._on_gained, self._on_lost, self._on_released = on_gained, on_lost, on_released
        self._load_of = load_of
        self._unserved = UnservedClock(patience_s)
        self._pause = HandoffPause(base_s=10 * patience_s, max_s=300 * patience_s)
        self.owned: dict[int, PartitionClaim] = {}
        self.num_handed_off = 0

    async def reconcile(self) -> None:
        """One pass over the wanted partitions."""
        claims: Claims = {partition: await read_partition(self._kv, partition) for partition in self.wanted}
        for partition in list(self.owned):
            claims[partition] = await self._check_still_owned(partition, claims[partition])
        leases = await live_leases(self._kv)
        alive = {lease.replica for lease in leases} | {self.replica}
        live = tuple(sorted({lease.replica for lease in leases if lease.service == SERVICE} | {self.replica}))
        now = time.monotonic()
        view = self._view(claims, live, alive)
        self._unserved.observe(view.unserved(), now)
        for partition in view.unserved():
            if self._may_claim(partition, claims[partition], view, now):
                claims[partition] = await self._claim(partition, claims[partition])
                view = self._view(claims, live, alive)
        if self.serves_a_share and not self._pause.is_paused(live, now):
            await self._maybe_hand_off(view)

    def _view(self, claims: Claims, live: tuple[str, ...], alive: set[str]) -> PartitionView:
        """`live`: the live vocoders (who shares); `alive`: every replica with a live lease (whose claims stand)."""
        owners = {}
        for partition, claim in claims.items():
            owner = claim.record.replica if claim is not None else None
            mine_unserved = owner == self.replica and partition not in self.owned
            owners[partition] = owner if owner in alive and not mine_unserved else None
        return PartitionView(self.replica, live, self.num_partitions, owners)

    def _may_claim(self, partition: int, current: PartitionClaim | None, view: PartitionView, now: float) -> bool:
        if not self.serves_a_share or len(self.owned) < view.share():
            return True
        if current is not None and current.record.replica == self.replica:
            return True  # a hand-off whose release did not reach the bucket: serve it again, hand it over later
        if not self._unserved.is_overdue(partition, now):
            return False  # a live vocoder short of its share takes it
        log.warning("partition %d has had no vocoder for %.1fs: claiming it past this replica's share of %d",
                    partition, self._unserved.patience_s, view.share())
        self._pause.start(view.live, now)
        return True

    async def _claim(self, partition: int, current: PartitionClaim | None) -> PartitionClaim | None:
        """Claim an unserved partition; returns the claim in force afterwards (None: it stayed unowned)."""
        if current is not None and current.record.replica != self.replica:
            log.warning("vocoder %s owning partition %d is gone; taking it over", current.record.replica, partition)
        try:
            claim = await claim_partition(self._kv, partition, self.replica, current=current)
        except OwnershipConflict:
            log.info("another vocoder claimed partition %d first", partition)
            return await read_partition(self._kv, partition)
        self.owned[partition] = claim
        log.info("claimed partition %d (epoch %d)", partition, claim.record.epoch)
        await self._on_gained(partition, claim)
        return claim

    async def _maybe_hand_off(self, view: PartitionView) -> None:
        """Hand one partition over when this replica holds more than its share and another live vocoder fewer
        (never while a partition is unserved: the short vocoder takes that one first)."""
        if len(self.owned) <= view.share() or view.unserved() or not view.someone_short():
            return
        partition = min(self.owned, key=lambda p: (self._load_of(p), -p))
        claim = self.owned.pop(partition)
        log.info("handing partition %d over (%d partitions here, share %d of %d among %d vocoders)", partition,
                 len(self.owned) + 1, view.share(), self.num_partitions, len(view.live))
        await self._on_released(partition)
        try:
            await self._kv.delete(subjects.partition_key(partition), last=claim.revision)
        except (KeyWrongLastSequenceError, KeyNotFoundError):
            pass  # someone else holds it now: not ours to delete
        self.num_handed_off += 1

    async def _check_still_owned(self, partition: int, current: PartitionClaim | None) -> PartitionClaim | None:
        """Whether the partition is still ours (stop serving it if not); returns the claim in force."""
        mine = self.owned[partition]
        if current is not None and current.revision == mine.revision:
            return current
        if current is None:  # the key expired (bucket ttl) or was deleted by hand: write our claim again
            try:
                self.owned[partition] = await claim_partition(self._kv, partition, self.replica, current=None)
                return self.owned[partition]
            except OwnershipConflict:
                current = await read_partition(self._kv, partition)
        owner = current.record.replica if current is not None else "?"
        log.warning("lost partition %d to %s; stopping its consumer", partition, owner)
        del self.owned[partition]
        await self._on_lost(partition)
        return current

    async def release_all(self) -> None:
        """Delete this replica's claims (only where they are still ours), so that a standby claims them now."""
        for partition, claim in list(self.owned.items()):
            try:
                await self._kv.delete(subjects.partition_key(partition), last=claim.revision)
            except (KeyWrongLastSequenceError, KeyNotFoundError):
                pass  # someone else holds it now: not ours to delete
            del self.owned[partition]
        log.info("released partitions")
