"""``schemas/record.schema.json``, ``entity.schema.json`` and ``powertools-record.schema.json``:
what ``inspect`` and ``list`` print with ``--json``, each item its own ``to_json``."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from idemctl.powertools.model import PowertoolsRecord

if TYPE_CHECKING:
    from idemctl.model import Entity, Record


def document(found: Record | Entity | PowertoolsRecord, at: datetime) -> dict[str, Any]:
    """``found``'s document; a Powertools record's state is judged at ``at``."""
    if isinstance(found, PowertoolsRecord):
        return found.to_json(at)
    return found.to_json()
