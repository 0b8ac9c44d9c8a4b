"""The idempotency record, its states, the claim outcomes and payload fingerprints.

Pure values and functions: nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import json
import json.scanner
import re
from collections.abc import Mapping, Sequence
from dataclasses import field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, NamedTuple, TypeAlias

from idemctl.errors import InvalidKey, InvalidPayload
from idemctl.frozen import frozen

MAX_KEY_BYTES = 512
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")

JSON: TypeAlias = Any
"""A value that ``json.dumps`` accepts: the stored result of a handler."""


class Status(StrEnum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"


@frozen
class Record:
    """One idempotency key as the store holds it. Times are timezone-aware UTC."""

    key: str
    status: Status
    fingerprint: str | None
    owner: str | None
    fencing_token: int
    attempts: int
    """Claims that ran (or may have run) the handler: a release that says it never ran
    takes its claim's back, so it can be 0 while a key waits to be claimed again."""
    created_at: datetime
    updated_at: datetime
    lease_expires_at: datetime | None = None
    completed_at: datetime | None = None
    expires_at: datetime | None = None
    result: JSON = None
    error: str | None = None
    retriable: bool = False

    def lease_live(self, now: datetime) -> bool:
        """True while an owner holds an unexpired lease on an in-progress key."""
        return (
            self.status is Status.IN_PROGRESS
            and self.owner is not None
            and self.lease_expires_at is not None
            and self.lease_expires_at > now
        )

    def stale(self, now: datetime) -> bool:
        """An in-progress key whose owner's lease expired and nobody freed: its worker may
        have died. ``unlock --stale`` frees it; the next delivery would take it over anyway."""
        return (
            self.status is Status.IN_PROGRESS
            and self.owner is not None
            and (self.lease_expires_at is None or self.lease_expires_at <= now)
        )

    def released(self) -> bool:
        """An in-progress key with no owner: freed by ``release`` or an unlock, it waits for
        the next delivery to claim it."""
        return self.status is Status.IN_PROGRESS and self.owner is None

    def retention_over(self, now: datetime) -> bool:
        """Past retention the key is as if never seen."""
        return self.expires_at is not None and self.expires_at <= now

    def to_json(self) -> dict[str, Any]:
        """The stable JSON shape of ``schemas/record.schema.json``."""
        return {
            "key": self.key,
            "status": self.status.value,
            "fingerprint": self.fingerprint,
            "owner": self.owner,
            "fencing_token": self.fencing_token,
            "attempts": self.attempts,
            "lease_expires_at": iso_time(self.lease_expires_at),
            "created_at": iso_time(self.created_at),
            "updated_at": iso_time(self.updated_at),
            "completed_at": iso_time(self.completed_at),
            "expires_at": iso_time(self.expires_at),
            "result": self.result,
            "error": self.error,
            "retriable": self.retriable,
        }


def iso_time(value: datetime | None) -> str | None:
    """``2026-11-22T04:29:57.514000Z``: how every JSON output writes a time."""
    return None if value is None else value.astimezone(UTC).isoformat().replace("+00:00", "Z")


# Claim outcomes -------------------------------------------------------------


@frozen
class Acquired:
    """This attempt holds the key: run the handler, then complete or fail with these tokens."""

    key: str
    owner: str
    fencing_token: int
    attempt: int
    lease_expires_at: datetime
    takeover: bool = False
    """True when the key was taken from an in-progress attempt that never finished:
    that attempt may have done part of its work."""


@frozen
class Completed:
    """Done before: replay ``record.result`` instead of running the handler."""

    record: Record


@frozen
class Busy:
    """Another owner holds a live lease: try again later. ``record`` is None when the
    holder's claim is not visible yet (an open PostgreSQL transaction holds the key)."""

    record: Record | None


@frozen
class Mismatch:
    """The key was seen with another payload fingerprint: never run."""

    record: Record
    fingerprint: str | None


@frozen
class Failed:
    """The key failed permanently: never run again until forgotten or past retention."""

    record: Record


ClaimOutcome: TypeAlias = Acquired | Completed | Busy | Mismatch | Failed


@frozen
class ClaimRequest:
    """One item of ``claim_many``."""

    key: str
    fingerprint: str | None = None


@frozen
class Holder:
    """The attempt that holds a key: what complete, fail, extend and release must name."""

    key: str
    owner: str
    fencing_token: int


@frozen
class Completion(Holder):
    """One item of ``complete_many``."""

    result: JSON = None


# The sequence guard --------------------------------------------------------------

MAX_SEQUENCE = 2**53 - 1
"""The largest sequence every store compares exactly (a Lua number is a double)."""


@frozen
class Order:
    """What the sequence guard needs of one event: the entity it changes and its place in
    that entity's history. Only an event whose sequence is above the entity's last applied
    one runs; the guard orders by this sequence, not by arrival."""

    entity: str
    sequence: int

    def __post_init__(self) -> None:
        validate_key(self.entity, "entity")
        validate_sequence(self.sequence)


class Guard(NamedTuple):
    """One item of ``guard_many``: the attempt holding ``key`` asks to apply ``sequence``."""

    entity: str
    sequence: int
    key: str
    fencing_token: int


class Settle(NamedTuple):
    """One item of ``settle_many``: the attempt that the guard let through is done;
    ``applied``: its handler finished (advance the entity), else it only lets go."""

    entity: str
    sequence: int
    key: str
    fencing_token: int
    applied: bool = True


class Verdict(StrEnum):
    GO = "go"
    """The sequence is newer: this attempt holds the entity until it settles."""
    STALE = "stale"
    """The entity applied this sequence or a later one: never run."""
    BUSY = "busy"
    """Another key's attempt holds the entity: try again later."""


@frozen
class Stale:
    """The event is not newer than what its entity applied: never run. In PostgreSQL
    transactional mode, ``Unit.outcome`` when the key's order guard said so."""

    entity: str
    sequence: int
    last: int
    """The entity's last applied sequence."""


class GuardReply(NamedTuple):
    verdict: Verdict
    last: int | None
    """The entity's last applied sequence (None: none yet)."""
    holder: str | None = None
    """BUSY: the key whose attempt holds the entity."""


@frozen
class Entity:
    """One entity of the sequence guard as the store holds it. Times are timezone-aware UTC."""

    entity: str
    sequence: int | None
    """The last sequence applied (None while its first event is being handled)."""
    key: str | None
    """The idempotency key whose handler applied ``sequence``."""
    applied_at: datetime | None
    holder: str | None
    """The key whose attempt holds the entity now (its guard said go), or None."""
    holder_token: int | None
    lock_expires_at: datetime | None
    updated_at: datetime
    expires_at: datetime | None = None
    """End of retention: past it the entity is as if never seen, like a key."""

    def locked(self, now: datetime) -> bool:
        return (
            self.holder is not None
            and self.lock_expires_at is not None
            and self.lock_expires_at > now
        )

    def retention_over(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    def to_json(self) -> dict[str, Any]:
        return {
            "entity": self.entity,
            "sequence": self.sequence,
            "key": self.key,
            "applied_at": iso_time(self.applied_at),
            "holder": self.holder,
            "holder_token": self.holder_token,
            "lock_expires_at": iso_time(self.lock_expires_at),
            "updated_at": iso_time(self.updated_at),
            "expires_at": iso_time(self.expires_at),
        }


@frozen
class EntityPage:
    """One page of ``scan_entities``; pass ``cursor`` back for the next."""

    entities: list[Entity]
    cursor: str | None = None


def validate_sequence(sequence: int) -> int:
    """Return ``sequence`` if the guard can order by it: a whole number 0..2**53-1."""
    if isinstance(sequence, bool) or not isinstance(sequence, int):
        raise InvalidPayload(f"sequence must be a whole number, not {type(sequence).__name__}")
    if not 0 <= sequence <= MAX_SEQUENCE:
        raise InvalidPayload(f"sequence {sequence} is outside 0..{MAX_SEQUENCE}")
    return sequence


def sequence_of(value: Any) -> int:
    """An event's sequence from what it carries: an integer (or its decimal text), or an
    ISO 8601 timestamp, taken as microseconds since the Unix epoch (naive means UTC)."""
    if isinstance(value, bool):
        raise InvalidPayload("a sequence cannot be true or false")
    if isinstance(value, int):
        return validate_sequence(value)
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"[0-9]+", text):
            return validate_sequence(int(text))
        try:
            at = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise InvalidPayload(
                f"sequence {value[:60]!r} is neither a whole number nor an ISO 8601 timestamp"
            ) from None
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
        return validate_sequence((at - _EPOCH) // timedelta(microseconds=1))
    raise InvalidPayload(
        f"sequence must be a whole number or an ISO 8601 timestamp, not {type(value).__name__}"
    )


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# Admin values ----------------------------------------------------------------


@frozen
class RecordPage:
    """One page of ``scan``; pass ``cursor`` back for the next, None when there is none."""

    records: list[Record]
    cursor: str | None = None


@frozen
class Stats:
    total: int
    by_status: Mapping[Status, int | None]
    """None where the store cannot tell without reading every record (counted_by
    ``approximate``: DynamoDB's completed and failed)."""
    stale: int
    """In-progress keys whose owner's lease expired and nobody freed (see Record.stale)."""
    oldest_in_progress: datetime | None
    """created_at of the oldest in-progress key."""
    past_retention: int | None = 0
    """Records kept physically after retention, waiting for ``purge`` (None: not known,
    as by_status)."""
    released: int = 0
    """In-progress keys with no owner, waiting for their next delivery (Record.released)."""
    counted_by: str = "scan"
    """How the counts were made: ``scan`` (every record read), ``query`` (the database
    counted its rows), ``index`` (Redis's counters and in-progress index: exact, a record
    counted up to a second past its TTL), ``approximate`` (DynamoDB's item count, refreshed
    about every six hours, with the in-progress keys exact from the index)."""


@frozen
class Finding:
    """One line of ``check()``: what was looked at, whether it is fine, how to fix it.

    Three levels: ok; a warning (``ok`` and ``warning``: a trade-off worth knowing, which
    does not fail ``doctor``); a failure (not ``ok``)."""

    name: str
    ok: bool
    detail: str
    fix: str | None = None
    warning: bool = False

    @property
    def level(self) -> str:
        """``ok``, ``warn`` or ``fail``."""
        if not self.ok:
            return "fail"
        return "warn" if self.warning else "ok"


@frozen
class Provisioning:
    """What ``provision`` ran (or, with ``dry_run``, would run)."""

    statements: list[str]
    changed: bool
    dry_run: bool = False
    notes: list[str] = field(default_factory=list)


# Keys and fingerprints ---------------------------------------------------------


def validate_key(key: str, what: str = "idempotency key") -> str:
    """Return ``key`` if it is a usable idempotency key (or, with ``what``, entity name),
    else raise InvalidKey.

    One rule for every store: a non-empty string of valid Unicode, at most MAX_KEY_BYTES in
    UTF-8, without control characters (U+0000-U+001F, U+007F-U+009F: PostgreSQL cannot
    store NUL in text, and none of them shows in a terminal or a log as it is)."""
    if (
        isinstance(key, str)
        and key.isascii()
        and key.isprintable()
        and 0 < len(key) <= MAX_KEY_BYTES
    ):
        return key  # the common case, without the regex: printable ASCII is one byte a char
    if not isinstance(key, str):
        raise InvalidKey(f"{what} must be a string, not {type(key).__name__}")
    if not key:
        raise InvalidKey(f"{what} is empty")
    control = _CONTROL.search(key)
    if control is not None:
        raise InvalidKey(
            f"{what} {key[:60]!r} holds a control character (U+"
            f"{ord(control.group()):04X} at position {control.start()}); keys may hold none"
        )
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidKey(f"{what} {key!r} is not valid UTF-8") from None
    if size > MAX_KEY_BYTES:
        raise InvalidKey(
            f"{what} is {size} bytes long; at most {MAX_KEY_BYTES} bytes are allowed "
            "(hash long keys, e.g. with the payload-hash key strategy)"
        )
    return key


def _not_json(value: object) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
_encode = (
    # json's C encoder built once, as JSONEncoder.encode would build it for every value;
    # without its check for circular values (one recurses into RecursionError instead).
    json.encoder.c_make_encoder(  # type: ignore[attr-defined]
        None, _not_json, json.encoder.encode_basestring, None, ":", ",", True, False, False
    )
    if json.encoder.c_make_encoder is not None  # type: ignore[attr-defined]
    else None
)
_decoder = json.JSONDecoder()
_scan = json.scanner.make_scanner(_decoder)  # type: ignore[arg-type]


def _decode(text: str) -> Any:
    try:
        value, end = _scan(text, 0)
    except StopIteration:  # leading whitespace, or not JSON: json's own way, which says
        return _decoder.decode(text)
    return value if end == len(text) else _decoder.decode(text)


def canonical_json(value: JSON) -> bytes:
    """One byte form per JSON value: sorted keys, no whitespace, UTF-8, no NaN."""
    if value is None:
        return b"null"
    try:
        if _encode is None:  # pragma: no cover - CPython has the C encoder
            return _CANONICAL.encode(value).encode("utf-8")
        return "".join(_encode(value, 0)).encode("utf-8")
    except (TypeError, ValueError, RecursionError) as exc:  # UnicodeEncodeError: ValueError
        raise InvalidPayload(f"value is not JSON-serializable: {exc}") from exc


def parse_json(raw: bytes) -> Any:
    """``json.loads(raw)`` for bytes, quicker for the common case of UTF-8 without a BOM
    (json.loads first guesses the encoding of bytes)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return json.loads(raw)  # UTF-16 or UTF-32, or not text: json.loads says which
    if text.startswith("\ufeff"):
        return json.loads(raw)
    return _decode(text)


def fingerprint(payload: JSON | bytes | str, *, fields: Sequence[str] | None = None) -> str:
    """SHA-256 (hex) of the payload's canonical JSON form.

    ``bytes`` and ``str`` holding JSON are parsed first, so key order and whitespace
    do not change the fingerprint; ones that are not JSON are hashed as they are.
    ``fields`` picks part of a JSON object (dotted paths such as ``"order.amount"``),
    for payloads that carry volatile parts like timestamps.
    """
    value: Any = payload
    if type(payload) is bytes or isinstance(payload, bytes | bytearray | memoryview | str):
        raw = payload.encode("utf-8") if isinstance(payload, str) else bytes(payload)
        try:
            value = parse_json(raw)
        except (UnicodeDecodeError, ValueError):
            if fields:
                raise InvalidPayload("fields were given but the payload is not JSON") from None
            return hashlib.sha256(raw).hexdigest()
    if fields:
        value = {path: _pick(value, path) for path in fields}
    return parsed_fingerprint(value)


def parsed_fingerprint(value: JSON) -> str:
    """``fingerprint`` of a payload whose JSON was parsed already (into ``value``)."""
    return hashlib.sha256(canonical_json(value)).hexdigest()


def _pick(value: Any, path: str) -> Any:
    current = value
    for part in path.split("."):
        if not isinstance(current, dict) or part not in current:
            raise InvalidPayload(f"payload has no field {path!r}")
        current = current[part]
    return current
