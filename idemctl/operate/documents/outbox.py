"""``idemctl outbox relay --json`` and ``replay --json`` (no schema yet), and what the
relay's live status shows."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from idemctl.outbox.relay import RelaySummary
    from idemctl.outbox.table import OutboxRow


def relay_fields(summary: RelaySummary) -> dict[str, int]:
    """What ``outbox relay``'s live status shows; its JSON document starts the same."""
    return {
        "published": summary.published,
        "failed": summary.failed,
        "store_unavailable": summary.store_unavailable,
    }


def relay(where: Mapping[str, str], brokers: str, summary: RelaySummary) -> dict[str, Any]:
    return {
        **where,
        "brokers": brokers,
        **relay_fields(summary),
        "batches": summary.batches,
        "undelivered": summary.undelivered,
        "delivery_error": summary.delivery_error if summary.undelivered else None,
    }


def replay(
    where: Mapping[str, str],
    selected: int,
    sent: int,
    failed: list[tuple[uuid.UUID, str]],
    marked: int,
) -> dict[str, Any]:
    return {
        **where,
        "selected": selected,
        "sent": sent,
        "marked_published": marked,
        "failed": [{"id": str(i), "error": e} for i, e in failed],
    }


def row(found: OutboxRow, topic: str) -> dict[str, Any]:
    """A row as ``outbox replay --dry-run --json`` lists it: with the topic it would go to."""
    return {**found.to_json(), "topic": topic}
