"""Records and claim outcomes, and the sequence guard's entities, from the scripts' replies
and the keys' JSON (lua/_lib.lua)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from idemctl.errors import StoreError
from idemctl.model import (
    Acquired,
    Busy,
    ClaimOutcome,
    ClaimRequest,
    Completed,
    Entity,
    Failed,
    Mismatch,
    Record,
    Status,
)


def text(value: Any) -> str:
    return value.decode("utf-8") if type(value) is bytes else str(value)


def from_ms(value: str | int, _at: Any = datetime.fromtimestamp) -> datetime | None:
    """A time in milliseconds since the epoch ("" for none) as a datetime."""
    return _at(int(value) / 1000, UTC) if value else None


def server_time(seconds: Any, micros: Any) -> datetime:
    """A TIME reply as a datetime."""
    return datetime.fromtimestamp(int(seconds) + int(micros) / 1e6, UTC)


def fields_of(raw: str | bytes | None) -> dict[str, str] | None:
    """A record's fields from its JSON text (see lua/_lib.lua), or None when there is none or
    the key holds something else: a key of another program under the prefix is not ours."""
    fields = _json_object(raw)
    return fields if fields is not None and fields.get("status") else None


def _json_object(raw: str | bytes | None) -> dict[str, str] | None:
    """The JSON object a key holds, or None (none, or not JSON, or not an object)."""
    if raw is None:
        return None
    try:
        fields = json.loads(raw)
    except ValueError:
        return None
    return fields if isinstance(fields, dict) else None


def parse_reply(reply: Sequence[Any]) -> tuple[str, dict[str, str] | None]:
    """A script's reply: its code, and the record's fields (None when there is no record)."""
    return text(reply[0]), (json.loads(reply[1]) if len(reply) > 1 else None)


def to_record(key: str, f: dict[str, str]) -> Record:
    get = f.get
    created = from_ms(f["created"])
    assert created is not None
    result = get("result")
    return Record(
        key=key,
        status=Status(f["status"]),
        fingerprint=get("fp") or None,
        owner=get("owner") or None,
        fencing_token=int(f["token"]),
        attempts=int(f["attempts"]),
        lease_expires_at=from_ms(get("lease", "")),
        created_at=created,
        updated_at=from_ms(get("updated", "")) or created,
        completed_at=from_ms(get("completed", "")),
        expires_at=from_ms(get("expires", "")),
        result=json.loads(result) if result else None,
        error=get("error") or None,
        retriable=get("retriable") == "1",
    )


def entity_fields_of(raw: str | bytes | None) -> dict[str, str] | None:
    """An entity's fields from its JSON text (see lua/_lib.lua), or None when there is none
    or the key holds something else (an idempotency record has a status; an entity never)."""
    fields = _json_object(raw)
    if fields is None or "status" in fields or not fields.get("updated"):
        return None
    return fields


def to_entity(entity: str, f: dict[str, str]) -> Entity:
    get = f.get
    updated = from_ms(f["updated"])
    assert updated is not None
    sequence, token = get("seq"), get("holder_token")
    return Entity(
        entity=entity,
        sequence=int(sequence) if sequence else None,
        key=get("key") or None,
        applied_at=from_ms(get("applied", "")),
        holder=get("holder") or None,
        holder_token=int(token) if token else None,
        lock_expires_at=from_ms(get("lock", "")),
        updated_at=updated,
        expires_at=from_ms(get("expires", "")),
    )


def claim_outcome(request: ClaimRequest, owner: str, reply: Sequence[Any]) -> ClaimOutcome:
    """The claim script's reply for ``request``, claimed as ``owner``."""
    code = text(reply[0])
    if code in ("acquired", "takeover"):
        token, attempts, lease = reply[1:]
        return Acquired(
            request.key,
            owner,
            int(token),
            int(attempts),
            datetime.fromtimestamp(int(lease) / 1000, UTC),
            code == "takeover",
        )
    fields = parse_reply(reply)[1]
    assert fields is not None
    record = to_record(request.key, fields)
    if code == "completed":
        return Completed(record)
    if code == "busy":
        return Busy(record)
    if code == "mismatch":
        return Mismatch(record, request.fingerprint)
    if code == "failed":
        return Failed(record)
    raise StoreError(f"claim script answered {code!r}")
