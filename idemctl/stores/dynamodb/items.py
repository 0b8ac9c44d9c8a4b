"""Records as DynamoDB items: attribute values, the expressions' attribute names, times."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from typing import Any

from idemctl.errors import StoreError
from idemctl.model import Record, Status

NAMES = {
    "#k": "key",
    "#st": "status",
    "#fp": "fingerprint",
    "#ow": "owner",
    "#tok": "fencing_token",
    "#att": "attempts",
    "#lease": "lease_expires_at",
    "#cr": "created_at",
    "#up": "updated_at",
    "#done": "completed_at",
    "#exp": "expires_at",
    "#ttl": "ttl",
    "#res": "result",
    "#err": "error",
    "#retr": "retriable",
    "#by": "done_by",
}
"""The attributes' names in expressions (``#st``) and on the item (``status``)."""

_STATUSES = {status.value for status in Status}


def names_in(expression: str) -> dict[str, str]:
    """The ExpressionAttributeNames an expression uses (DynamoDB refuses unused ones)."""
    return {name: NAMES[name] for name in set(re.findall(r"#\w+", expression))}


def to_ms(at: float) -> int:
    """Seconds (since the epoch, or a duration) in milliseconds, as the items keep time."""
    return round(at * 1000)


def from_ms(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


def first_token() -> int:
    """The fencing token of a key with no item (never seen, purged, deleted by TTL): this
    machine's clock in microseconds since the epoch, as ``machine.first_token``; the
    client's clock, as for leases."""
    return time.time_ns() // 1000


def n(value: int) -> dict[str, str]:
    """A number attribute value."""
    return {"N": str(value)}


def s(value: str) -> dict[str, str]:
    """A string attribute value."""
    return {"S": value}


def value_of(item: dict[str, Any], name: str) -> Any:
    """Attribute ``name`` of ``item`` as Python: str, int, bool, or None when absent."""
    value = item.get(name)
    if value is None:
        return None
    if "S" in value:
        return value["S"]
    if "N" in value:
        return int(value["N"])
    if "BOOL" in value:
        return value["BOOL"]
    return None


def to_record(item: dict[str, Any]) -> Record:
    created = from_ms(value_of(item, "created_at"))
    if created is None or value_of(item, "status") not in _STATUSES:
        raise StoreError(f"DynamoDB item {value_of(item, 'key')!r} is not an idemctl record")
    result = value_of(item, "result")
    return Record(
        key=value_of(item, "key"),
        status=Status(value_of(item, "status")),
        fingerprint=value_of(item, "fingerprint"),
        owner=value_of(item, "owner"),
        fencing_token=value_of(item, "fencing_token") or 0,
        attempts=value_of(item, "attempts") or 0,
        lease_expires_at=from_ms(value_of(item, "lease_expires_at")),
        created_at=created,
        updated_at=from_ms(value_of(item, "updated_at")) or created,
        completed_at=from_ms(value_of(item, "completed_at")),
        expires_at=from_ms(value_of(item, "expires_at")),
        result=None if result is None else json.loads(result),
        error=value_of(item, "error"),
        retriable=bool(value_of(item, "retriable")),
    )
