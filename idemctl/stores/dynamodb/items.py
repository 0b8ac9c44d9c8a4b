"""Records and the sequence guard's entities as DynamoDB items: attribute values, the
expressions' attribute names, times."""

from __future__ import annotations

import json
import re
import time
import zlib
from datetime import UTC, datetime
from typing import Any

from idemctl.errors import StoreError
from idemctl.model import Entity, Record, Status

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
    # The sequence guard's entities (``key`` is ENTITY_PREFIX + the entity's name):
    "#ent": "entity",
    "#seq": "sequence",
    "#akey": "applied_key",
    "#aat": "applied_at",
    "#hold": "holder",
    "#htok": "holder_token",
    "#lock": "lock_expires_at",
    "#ver": "version",
    "#sby": "settled_by",
    # The sparse index of in-progress keys (see ``shard_of``):
    "#ips": "ip_shard",
}
"""The attributes' names in expressions (``#st``) and on the item (``status``)."""

ENTITY_PREFIX = "\x1eentity\x1e"
"""What the partition key of an entity of the sequence guard starts with, before its name.
No idempotency key can: keys hold no control characters (``validate_key``), and U+001E is
one. So entities share the table (its TTL, its provisioning) and never meet a key."""

_STATUSES = {status.value for status in Status}


SHARDS = 16
"""The partitions of the in-progress index (GSI ``INDEX``): a key in progress carries
``ip_shard``, one of SHARDS values by a hash of the key, so that no one partition of the
index takes every claim's write; a reader queries each (``inprogress``). Changing it
strands the keys in progress under the old values: it is part of the table's format."""

INDEX = "in_progress"
"""The name of the sparse global secondary index of in-progress keys."""

INDEX_KEYS = [
    {"AttributeName": "ip_shard", "KeyType": "HASH"},
    {"AttributeName": "lease_expires_at", "KeyType": "RANGE"},
]
"""The index's key schema, as DescribeTable gives it (and schemas/dynamodb.json makes it)."""


def shard_of(key: str) -> dict[str, str]:
    """The ``ip_shard`` attribute value of ``key`` while it is in progress: CRC-32, the same
    in every process and version of Python (``hash`` of a str is not)."""
    return s(str(zlib.crc32(key.encode()) % SHARDS))


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


def entity_key(entity: str) -> str:
    """The partition key of ``entity``'s item."""
    return ENTITY_PREFIX + entity


def is_entity_key(key: str) -> bool:
    return key.startswith(ENTITY_PREFIX)


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


def to_entity(item: dict[str, Any]) -> Entity:
    key = value_of(item, "key")
    if not isinstance(key, str) or not is_entity_key(key):
        raise StoreError(f"DynamoDB item {key!r} is not an idemctl entity")
    updated = from_ms(value_of(item, "updated_at"))
    return Entity(
        entity=key[len(ENTITY_PREFIX) :],
        sequence=value_of(item, "sequence"),
        key=value_of(item, "applied_key"),
        applied_at=from_ms(value_of(item, "applied_at")),
        holder=value_of(item, "holder"),
        holder_token=value_of(item, "holder_token"),
        lock_expires_at=from_ms(value_of(item, "lock_expires_at")),
        updated_at=updated or datetime.fromtimestamp(0, UTC),
        expires_at=from_ms(value_of(item, "expires_at")),
    )


def entity_item(entity: Entity, version: int) -> dict[str, Any]:
    """The whole item of ``entity`` (PutItem), at ``version``; ttl is ``expires_at``."""
    item: dict[str, Any] = {
        "key": s(entity_key(entity.entity)),
        "entity": s(entity.entity),
        "updated_at": n(ms_of(entity.updated_at)),
        "version": n(version),
    }
    optional = {
        "sequence": None if entity.sequence is None else n(entity.sequence),
        "applied_key": None if entity.key is None else s(entity.key),
        "applied_at": None if entity.applied_at is None else n(ms_of(entity.applied_at)),
        "holder": None if entity.holder is None else s(entity.holder),
        "holder_token": None if entity.holder_token is None else n(entity.holder_token),
        "lock_expires_at": (
            None if entity.lock_expires_at is None else n(ms_of(entity.lock_expires_at))
        ),
    }
    if entity.expires_at is not None:
        expires = ms_of(entity.expires_at)
        optional["expires_at"] = n(expires)
        optional["ttl"] = n(expires // 1000)
    item.update({name: value for name, value in optional.items() if value is not None})
    return item


def ms_of(at: datetime) -> int:
    """A time in milliseconds since the epoch, as the items keep it."""
    return to_ms(at.timestamp())
