"""``schemas/outbox-status.schema.json``: ``idemctl outbox status --json``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from idemctl.outbox.table import OutboxStatus


def document(where: Mapping[str, str], found: OutboxStatus) -> dict[str, Any]:
    return {
        **where,
        "at": found.now.isoformat(),
        "total": found.total.to_json(found.now),
        "types": [t.to_json(found.now) for t in found.types],
    }
