"""``schemas/action.schema.json``: what ``unlock``, ``forget``, ``purge`` and ``outbox purge``
did, or would do (``--dry-run``), with ``--json``."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from idemctl.operate.documents import item

if TYPE_CHECKING:
    from idemctl.model import Entity, Record
    from idemctl.operate.results import Action
    from idemctl.powertools.model import PowertoolsRecord


def document(
    action: str,
    where: Mapping[str, str],
    *,
    dry_run: bool,
    count: int,
    keys: list[str] | None = None,
    record: Record | PowertoolsRecord | None = None,
    entity: Entity | None = None,
    skipped: int | None = None,
    at: datetime | None = None,
) -> dict[str, Any]:
    """``skipped``: the items a Powertools sweep passed over as none of Powertools'; ``at``:
    the time a Powertools record's state is judged at."""
    return {
        "action": action,
        **where,
        "dry_run": dry_run,
        "count": count,
        "keys": keys,
        "record": None if record is None else item.document(record, at or datetime.now(UTC)),
        "entity": None if entity is None else entity.to_json(),
        **({} if skipped is None else {"skipped": skipped}),
    }


def of(done: Action, where: Mapping[str, str]) -> dict[str, Any]:
    """The document of an operator action's result (``idemctl.operate``)."""
    return document(
        done.action,
        where,
        dry_run=done.dry_run,
        count=done.count,
        keys=done.keys,
        record=done.record,
        entity=done.entity,
        skipped=done.skipped,
        at=done.at,
    )
