"""Usage records summed per UTC day, tenant and model over a time range: what the operator route and `voxmesh usage`
show. Pure: the records come from services/usage/reader.py."""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from messages.errors import ErrorCode
from messages.usage import UsageRecord


class UsageQueryError(ValueError):
    """A usage query that cannot be answered as asked (a time that does not parse, an empty range)."""

    code = ErrorCode.INVALID_VALUE


@dataclass(frozen=True, slots=True)
class UsageQuery:
    """Which records count: `start <= record.at < end` (unix seconds), of one tenant and one model when named."""

    start: float
    end: float
    tenant: str | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        if not self.start < self.end:
            raise UsageQueryError(f"the range is empty: from ({_iso(self.start)}) must be before to ({_iso(self.end)})")

    def counts(self, record: UsageRecord) -> bool:
        return (self.start <= record.at < self.end and (self.tenant is None or record.tenant == self.tenant)
                and (self.model is None or record.model == self.model))


@dataclass(slots=True)
class UsageRow:
    """The totals of one UTC day, tenant and model (or of the whole range, `day` "total")."""

    day: str
    tenant: str
    model: str
    requests: int = 0
    characters: int = 0
    audio_seconds: float = 0.0
    errors: int = 0

    def add(self, record: UsageRecord) -> None:
        self.requests += 1
        self.characters += record.characters
        self.audio_seconds += record.audio_seconds
        self.errors += record.outcome == "failed"

    def as_dict(self) -> dict:
        return asdict(self)


def usage_rows(records: Iterable[UsageRecord], query: UsageQuery) -> list[UsageRow]:
    """One row per (UTC day, tenant, model) that has a counted record, in that order. A request counts once even if
    its record appears twice in `records` (the stream holds one; a reader that retried may not)."""
    rows: dict[tuple[str, str, str], UsageRow] = {}
    seen: set[str] = set()
    for record in records:
        if not query.counts(record) or record.request_id in seen:
            continue
        seen.add(record.request_id)
        key = (utc_day(record.at), record.tenant, record.model)
        rows.setdefault(key, UsageRow(*key)).add(record)
    return [rows[key] for key in sorted(rows)]


def grand_total(rows: Iterable[UsageRow]) -> UsageRow:
    """Every row summed (day "total", tenant and model "*")."""
    total = UsageRow("total", "*", "*")
    for row in rows:
        total.requests += row.requests
        total.characters += row.characters
        total.audio_seconds += row.audio_seconds
        total.errors += row.errors
    return total


def utc_day(at: float) -> str:
    """The UTC calendar day of a unix time, as YYYY-MM-DD."""
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).date().isoformat()


def parse_time(text: str) -> float:
    """Unix seconds of an ISO 8601 date (`2026-01-31`: that day's 00:00 UTC) or time (`2026-01-31T12:00:00Z`; a time
    without an offset is UTC)."""
    try:
        moment = datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UsageQueryError(f"{text!r} is not an ISO 8601 date or time (e.g. 2026-01-31 or "
                              f"2026-01-31T12:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp()


def month_start(now: float) -> float:
    """00:00 UTC of the first day of `now`'s UTC month: where a query without `from` starts."""
    day = datetime.datetime.fromtimestamp(now, datetime.timezone.utc)
    return day.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


def _iso(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).isoformat()
