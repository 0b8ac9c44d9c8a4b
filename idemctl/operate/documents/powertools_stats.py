"""``schemas/powertools-stats.schema.json``: ``idemctl stats --json`` on a Powertools
table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from idemctl.powertools.model import PowertoolsStats


def document(where: Mapping[str, str], counts: PowertoolsStats) -> dict[str, Any]:
    return {
        **where,
        "layout": "powertools",
        "total": counts.total,
        "by_state": {s.value: n for s, n in counts.by_state.items()},
        "skipped": counts.skipped,
        "counted_by": counts.counted_by,
    }
