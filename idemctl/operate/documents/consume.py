"""``idemctl consume --json`` (no schema yet), and what its live status shows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from idemctl.kafka.options import Summary


def fields(summary: Summary) -> dict[str, Any]:
    """What ``consume``'s live status shows."""
    counts = summary.counts
    shown = ("executed", "replayed", "retried", "dead_lettered", "busy", "store_unavailable")
    return {
        "state": summary.state,
        "partitions": summary.partitions,
        "lag": summary.lag,
        **{name: counts[name] for name in shown},
        **{name: counts[name] for name in ("stale", "gaps") if name in counts},
        "paused_partitions": summary.paused,
        "stalled_partitions": summary.stalled,
    }


def document(
    where: Mapping[str, str], topics: list[str], group: str, summary: Summary
) -> dict[str, Any]:
    return {
        **where,
        "topics": topics,
        "group": group,
        "counts": dict(sorted(summary.counts.items())),
        "dead_letters": dict(sorted(summary.dead_letters.items())),
    }
