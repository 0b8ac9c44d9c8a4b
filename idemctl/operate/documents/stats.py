"""``schemas/stats.schema.json``: ``idemctl stats --json`` on idemctl's own layout."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from idemctl.model import Stats, Status, iso_time


def document(
    where: Mapping[str, str], stats: Stats, at: datetime, entities: int | None
) -> dict[str, Any]:
    """``entities`` None: the store has no guard table yet, or counting it is a Scan."""
    oldest = stats.oldest_in_progress
    return {
        **where,
        "total": stats.total,
        "by_status": {s.value: stats.by_status.get(s) for s in Status},
        "stale": stats.stale,
        "released": stats.released,
        "oldest_in_progress_at": iso_time(oldest),
        "oldest_in_progress_age_seconds": (
            None if oldest is None else round((at - oldest).total_seconds(), 3)
        ),
        "past_retention": stats.past_retention,
        "entities": entities,
        "counted_by": stats.counted_by,
    }
