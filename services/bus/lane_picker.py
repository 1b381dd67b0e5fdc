"""Which of decode's request queues to take from now: interactive before batch, and the lanes of one priority in
turn (deficit round-robin with a quantum of one request), so tenants in different lanes share seats evenly.

Pure logic: it sees how many requests each lane holds (the REQUESTS stream's per-subject counts) and how many seats
each priority may still fill, and answers how many to take from each lane. Round-robin state is kept across rounds:
the lane after the last one served goes first next time, so a replica that frees one seat at a time still alternates
between lanes instead of always serving the first lane with work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from messages.streams import RequestLane


class LanePicker:
    """Plans each fetch round over a fixed list of lanes (`messages.streams.request_lanes`, preferred order)."""

    def __init__(self, lanes: Sequence[RequestLane], priorities: Sequence[str]) -> None:
        self.lanes = tuple(lanes)
        self.priorities = tuple(priorities)
        self._by_priority = {p: [lane for lane in self.lanes if lane.priority == p] for p in self.priorities}
        self._cursor = dict.fromkeys(self.priorities, 0)
        """Per priority: the index (in its lanes) of the lane served first in the next round."""

    def plan(self, pending: Mapping[str, int], rooms: Mapping[str, int],
             floors: Mapping[str, int] | None = None) -> list[tuple[RequestLane, int]]:
        """How many requests to take from each lane (`pending`: requests held, by durable name): at most
        `rooms[p]` of priority p, and at most the largest room in all (every priority's room counts the same free
        seats; batch's is smaller by the seats kept for interactive work). `floors[p]`: seats an earlier priority
        leaves free for p while p has work (batch's floor: it is never starved). Lanes without work are skipped."""
        floors = floors or {}
        has_work = {p: any(pending.get(lane.durable, 0) > 0 for lane in self._by_priority[p]) for p in self.priorities}
        taken: dict[str, int] = {}
        total = max(rooms.values(), default=0)
        used = 0
        for index, priority in enumerate(self.priorities):
            held_back = sum(floors.get(later, 0) for later in self.priorities[index + 1:] if has_work[later])
            room = min(rooms.get(priority, 0), total - used - held_back)
            lanes = self._by_priority[priority]
            if room <= 0 or not lanes:
                continue
            start = self._cursor[priority]
            order = lanes[start:] + lanes[:start]
            left = {lane.durable: pending.get(lane.durable, 0) for lane in order}
            last_served: int | None = None
            while room > 0 and any(left[lane.durable] > 0 for lane in order):
                for offset, lane in enumerate(order):
                    if room <= 0:
                        break
                    if left[lane.durable] <= 0:
                        continue
                    left[lane.durable] -= 1
                    taken[lane.durable] = taken.get(lane.durable, 0) + 1
                    room -= 1
                    used += 1
                    last_served = offset
            if last_served is not None:
                self._cursor[priority] = (start + last_served + 1) % len(lanes)
        return [(lane, taken[lane.durable]) for lane in self.lanes if lane.durable in taken]
