"""How many CODES partitions each live vocoder serves, so that every live vocoder serves some.

The live vocoders (those holding a live `lease.<replica>` of service `vocoder`), sorted by name, split the
partitions evenly: each gets `num_partitions // n`, and the first `num_partitions % n` of them one more. Every
vocoder computes the same shares from the same leases, so their claims add up to the partitions without any vocoder
asking another. A vocoder claims an unserved partition while it holds fewer than its share, and hands one of its own
over (a clean release, as at shutdown) while it holds more and another live vocoder holds fewer.

Views differ for a moment (a lease just written or just lapsed), and a live vocoder may never take a partition (one
pinned to others with `--partitions`, or one whose control loop is stuck). So a partition nobody served for
`patience_s` is claimed by any vocoder that wants it, past its share, and that vocoder pauses its hand-offs: handing
partitions to a vocoder that does not take them would only bring them back, each time stalling their streams.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)


def share_of(replica: str, live: tuple[str, ...], num_partitions: int) -> int:
    """How many partitions `replica` (one of the sorted `live`) serves when the live vocoders split them evenly."""
    base, extra = divmod(num_partitions, len(live))
    return base + (1 if live.index(replica) < extra else 0)


@dataclass(frozen=True, slots=True)
class PartitionView:
    """One control pass's reading of the bucket.

    Attributes:
        replica: this vocoder.
        live: the live vocoders, sorted by name (this one always among them: its own lease may be mid-renewal).
        num_partitions: CODES partitions in all.
        owners: partition -> the live vocoder serving it, for the partitions this replica looks at; None when the
            partition has no live owner (unowned, its owner's lease lapsed, or a release of this replica's own that
            did not reach the bucket).
    """

    replica: str
    live: tuple[str, ...]
    num_partitions: int
    owners: Mapping[int, str | None]

    def share(self, replica: str | None = None) -> int:
        return share_of(replica or self.replica, self.live, self.num_partitions)

    def held_by(self, replica: str) -> int:
        return sum(1 for owner in self.owners.values() if owner == replica)

    def unserved(self) -> list[int]:
        return sorted(partition for partition, owner in self.owners.items() if owner is None)

    def someone_short(self) -> bool:
        """Whether another live vocoder holds fewer partitions than its share."""
        return any(self.held_by(other) < self.share(other) for other in self.live if other != self.replica)


class UnservedClock:
    """Since when each partition has had no live owner, as this replica's passes saw it."""

    def __init__(self, patience_s: float) -> None:
        self.patience_s = patience_s
        self._since: dict[int, float] = {}

    def observe(self, unserved: Iterable[int], now: float) -> None:
        """Record this pass's unserved partitions; a partition served again forgets its clock."""
        unserved = set(unserved)
        self._since = {p: self._since.get(p, now) for p in unserved}

    def is_overdue(self, partition: int, now: float) -> bool:
        """True when the partition has waited past the patience for a vocoder within its share to claim it."""
        since = self._since.get(partition)
        return since is not None and now - since >= self.patience_s


class HandoffPause:
    """Hand-offs held back after this replica had to claim an overdue partition past its share.

    The pause lasts `base_s`, doubling (up to `max_s`) each time it happens again with the same live vocoders, and
    ends at once when the live vocoders change (a new one may take partitions)."""

    def __init__(self, base_s: float, max_s: float) -> None:
        self.base_s, self.max_s = base_s, max_s
        self._live: tuple[str, ...] | None = None
        self._length_s = base_s
        self._until = 0.0

    def start(self, live: tuple[str, ...], now: float) -> None:
        if live == self._live:
            self._length_s = min(self._length_s * 2, self.max_s)
        else:
            self._live, self._length_s = live, self.base_s
        self._until = now + self._length_s
        log.warning("partition hand-offs paused for %.0fs (a live vocoder did not take its share)", self._length_s)

    def is_paused(self, live: tuple[str, ...], now: float) -> bool:
        return live == self._live and now < self._until
