"""Powertools' idempotency records as idemctl reads them: the layout (attribute names, key
shape), a record, and the state Powertools would judge it in. Pure values: no I/O.

Powertools for AWS Lambda writes one record per idempotency key: ``status`` INPROGRESS or
COMPLETED, ``expiration`` in epoch seconds (after it the record counts as absent),
``in_progress_expiration`` in epoch milliseconds (the invocation's end, when Powertools
knew the Lambda context: after it the next call takes the record over), ``data`` (the
response: a JSON string, a map in the TypeScript version) and ``validation`` (a digest of
the payload). Its rules, from its source (persistence/base.py, dynamodb.py, redis.py), are
judged here on this machine's clock, as Powertools judges them on the function's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any

INPROGRESS = "INPROGRESS"
COMPLETED = "COMPLETED"


class State(StrEnum):
    """What Powertools makes of a record now; ``stats`` counts these, ``list`` filters by them."""

    COMPLETED = "completed"
    """Its next call with the same payload replays ``data``."""
    IN_PROGRESS = "in_progress"
    """A live invocation holds it: its in-progress expiry is in the future."""
    STALE = "stale"
    """In progress, its in-progress expiry passed: the invocation is over (timed out or
    crashed); Powertools takes the record over on the next call, ``unlock --stale`` frees
    it now."""
    BLOCKED = "blocked"
    """In progress with no in-progress expiry (no Lambda context was registered): every call
    with the payload fails with IdempotencyAlreadyInProgressError until ``expiration``."""
    EXPIRED = "expired"
    """Past ``expiration``: Powertools treats it as absent; TTL (or ``purge``) deletes it."""
    INVALID = "invalid"
    """No record Powertools wrote: an unknown status, no or a non-numeric expiration, an
    attribute its persistence layer never writes. Only ``get`` returns one (``inspect``
    says why); every other call passes such items over and counts them as skipped."""


@dataclass(frozen=True)
class Layout:
    """Where a Powertools persistence layer keeps each field: its constructor's arguments,
    under the same names (``DynamoDBPersistenceLayer``, ``RedisCachePersistenceLayer``)."""

    key_attr: str = "id"
    sort_key_attr: str | None = None
    static_pk_value: str | None = None
    expiry_attr: str = "expiration"
    in_progress_expiry_attr: str = "in_progress_expiration"
    status_attr: str = "status"
    data_attr: str = "data"
    validation_key_attr: str = "validation"

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def written(self, with_key: bool) -> frozenset[str]:
        """The attributes Powertools' persistence layer writes under this layout (with the
        key attributes where the record holds them: DynamoDB's items, not Redis's values)."""
        keys = (self.key_attr, self.sort_key_attr) if with_key else ()
        values = (
            self.expiry_attr,
            self.in_progress_expiry_attr,
            self.status_attr,
            self.data_attr,
            self.validation_key_attr,
        )
        return frozenset(n for n in (*keys, *values) if n is not None)


@dataclass(frozen=True)
class PowertoolsRecord:
    """One record as stored. ``key`` is the idempotency key (the sort key's value on a
    table with one, else the partition key's); ``partition`` the static partition value on
    such a table. Times are UTC; ``None`` where the record has none (or an unreadable one,
    named in ``problems``)."""

    key: str
    status: str | None
    expiration: datetime | None
    in_progress_expiration: datetime | None
    data: Any = None
    validation: str | None = None
    partition: str | None = None
    problems: tuple[str, ...] = field(default=())
    """Why the item is no record Powertools wrote; empty for one it did."""

    @property
    def is_powertools(self) -> bool:
        return not self.problems

    def state(self, now: datetime) -> State:
        """As Powertools judges it at ``now``: expiry first (``DataRecord.status``), then
        the status, then the in-progress expiry (the condition of ``_put_record``)."""
        if self.expiration is None or self.problems:
            return State.INVALID
        if int(now.timestamp()) > int(self.expiration.timestamp()):
            return State.EXPIRED
        if self.status == COMPLETED:
            return State.COMPLETED
        if self.status != INPROGRESS:
            return State.INVALID
        if self.in_progress_expiration is None:
            return State.BLOCKED
        if in_ms(self.in_progress_expiration) < in_ms(now):
            return State.STALE
        return State.IN_PROGRESS

    def to_json(self, now: datetime) -> dict[str, Any]:
        """``schemas/powertools-record.schema.json``."""
        return {
            "key": self.key,
            "partition": self.partition,
            "status": self.status,
            "state": self.state(now).value,
            "expiration": _iso(self.expiration),
            "in_progress_expiration": _iso(self.in_progress_expiration),
            "data": self.data,
            "validation": self.validation,
            "problems": list(self.problems),
        }


@dataclass(frozen=True)
class PowertoolsPage:
    records: list[PowertoolsRecord]
    cursor: str | None
    """Give it back to go on: the last key of this page; ``None`` on the last page."""


@dataclass(frozen=True)
class PowertoolsStats:
    by_state: dict[State, int]
    """Every state, 0 where none."""
    skipped: int = 0
    """Items that are no Powertools records (another application's keys in the database,
    Powertools' ``:lock`` helper keys are not counted at all)."""
    counted_by: str = "scan"

    @property
    def total(self) -> int:
        return sum(self.by_state.values())


def record_from(
    key: str,
    values: Mapping[str, Any],
    layout: Layout,
    partition: str | None = None,
    *,
    with_key: bool = False,
) -> PowertoolsRecord:
    """The record whose attributes are ``values`` (plain Python values: numbers as int,
    float or Decimal), under ``layout``'s names; ``with_key`` where ``values`` holds the key
    attributes too. Its ``problems`` say why it is no record Powertools wrote: a status
    other than INPROGRESS or COMPLETED, an expiry that is no number, an attribute
    Powertools never writes (another application's item, read through the wrong URL)."""
    problems: list[str] = []
    status = values.get(layout.status_attr)
    if not isinstance(status, str):
        problems.append(f"no {layout.status_attr!r} string")
        status = None
    elif status not in (INPROGRESS, COMPLETED):
        problems.append(f"{layout.status_attr} {status!r} is neither {INPROGRESS} nor {COMPLETED}")
    if layout.expiry_attr not in values:
        problems.append(f"no {layout.expiry_attr!r}")
    expiration = _moment(values.get(layout.expiry_attr), 1, layout.expiry_attr, problems)
    in_progress = _moment(
        values.get(layout.in_progress_expiry_attr), 1000, layout.in_progress_expiry_attr, problems
    )
    others = sorted(set(values) - layout.written(with_key))
    if others:
        shown = ", ".join(map(repr, others[:3])) + (" ..." if len(others) > 3 else "")
        problems.append(f"attributes Powertools never writes: {shown}")
    validation = values.get(layout.validation_key_attr)
    return PowertoolsRecord(
        key=key,
        status=status,
        expiration=expiration,
        in_progress_expiration=in_progress,
        data=_data(values.get(layout.data_attr)),
        validation=validation if isinstance(validation, str) else None,
        partition=partition,
        problems=tuple(problems),
    )


def not_a_record(key: str, what: str) -> PowertoolsRecord:
    """An item that holds no attributes at all as Powertools writes them: ``what`` it is."""
    return PowertoolsRecord(key, None, None, None, problems=(what,))


def in_ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _moment(raw: Any, per_second: int, name: str, problems: list[str]) -> datetime | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float | Decimal):
        problems.append(f"{name!r} is no number: {raw!r}")
        return None
    try:
        number = float(raw)
        return datetime.fromtimestamp(number / per_second, UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        problems.append(f"{name!r} is no epoch {'seconds' if per_second == 1 else 'ms'}: {raw!r}")
        return None


def _data(raw: Any) -> Any:
    """The response as JSON where it is a JSON string (Python's form), else as stored (a
    map: TypeScript's)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat().replace("+00:00", "Z")
