"""The record's state machine: what each transition does to a record, and what every
backend says when one is refused. Row stores (memory, SQLite) apply these functions inside a
row transaction; the Lua scripts, the SQL and DynamoDB's conditional writes encode the same
rules, and the contract suite holds them to it."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from idemctl.errors import LeaseLost, Refused
from idemctl.model import (
    JSON,
    Acquired,
    Busy,
    ClaimOutcome,
    Completed,
    Entity,
    Failed,
    Guard,
    GuardReply,
    Mismatch,
    Record,
    Settle,
    Status,
    Verdict,
    iso_time,
)
from idemctl.stores.base import new_owner

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def first_token(now: datetime) -> int:
    """The fencing token of a key with no record at all (never seen, or deleted by purge or
    the store's own expiry): ``now`` in microseconds since the Unix epoch.

    Every token ever issued for a key was at most the clock in microseconds when it was
    claimed (a key is not claimed twice in one microsecond), so a key whose record vanished
    starts above any token of its earlier lives and fencing never goes backwards, as long
    as the clock does not. Below 2**53 for millennia: exact in Lua numbers and JSON.
    """
    return (now - EPOCH) // timedelta(microseconds=1)


def clock_passed(record: Record, now: datetime) -> bool:
    """Whether ``record`` may vanish (be purged) at ``now``: its fencing token is below
    ``first_token(now)``, so the key's next life starts above every token of this one.

    Each takeover is one token up, and a clock can stand still or be coarse (a test's hand
    clock; a machine's in a VM): a key claimed several times within one of its ticks holds
    tokens above it, and deleting its record then would let the next claim start at or
    below a token already handed out.
    """
    return record.fencing_token < first_token(now)


def decide_claim(
    existing: Record | None,
    key: str,
    fingerprint: str | None,
    now: datetime,
    lease: float,
    first: int | None = None,
) -> tuple[ClaimOutcome, Record | None]:
    """The claim rules of ARCHITECTURE.md: the outcome, and the record to write (None: no
    write). ``first``: the token of a key with no record, ``first_token(now)`` unless the
    store's ``now`` is coarser than its clock (the row stores keep milliseconds and give
    the clock's microseconds here)."""
    expires = now + timedelta(seconds=lease)
    owner = new_owner()
    if existing is None or existing.retention_over(now):
        # Past retention (or forgotten) the key is new, but the fencing counter goes on: a
        # zombie of the old life must never hold a token that is valid again. With no record
        # at all, the clock starts it above every token the key may have had.
        if existing is not None:
            token = existing.fencing_token + 1
        else:
            token = first_token(now) if first is None else first
        record = Record(
            key=key,
            status=Status.IN_PROGRESS,
            fingerprint=fingerprint,
            owner=owner,
            fencing_token=token,
            attempts=1,
            created_at=now,
            updated_at=now,
            lease_expires_at=expires,
        )
        return Acquired(key, owner, token, 1, expires, takeover=False), record
    if (
        fingerprint is not None
        and existing.fingerprint is not None
        and fingerprint != existing.fingerprint
    ):
        return Mismatch(existing, fingerprint), None
    if existing.status is Status.COMPLETED:
        return Completed(existing), None
    if existing.status is Status.FAILED and not existing.retriable:
        return Failed(existing), None
    if existing.lease_live(now):
        return Busy(existing), None
    # An expired or released lease, or a retriable failure: claim it again.
    token = existing.fencing_token + 1
    attempt = existing.attempts + 1
    record = replace(
        existing,
        status=Status.IN_PROGRESS,
        owner=owner,
        fencing_token=token,
        attempts=attempt,
        updated_at=now,
        lease_expires_at=expires,
        completed_at=None,
        expires_at=None,
        fingerprint=existing.fingerprint or fingerprint,
    )
    takeover = existing.status is Status.IN_PROGRESS
    return Acquired(key, owner, token, attempt, expires, takeover=takeover), record


def check_holder(
    existing: Record | None, key: str, owner: str, fencing_token: int, now: datetime
) -> Record:
    """The record if ``owner`` with ``fencing_token`` still holds ``key``, else LeaseLost.

    An owner whose lease ran out keeps the key until somebody takes it over: nobody else
    ran the work, so finishing it is still safe.
    """
    if existing is None or existing.retention_over(now):
        raise lease_lost(key, owner, fencing_token, None)
    if (
        existing.status is not Status.IN_PROGRESS
        or existing.owner != owner
        or existing.fencing_token != fencing_token
    ):
        raise lease_lost(key, owner, fencing_token, existing)
    return existing


def lease_lost(key: str, owner: str, fencing_token: int, record: Record | None) -> LeaseLost:
    """What every backend says when ``owner`` with ``fencing_token`` no longer holds
    ``key``: ``record`` is the key as it is now, None when it is gone."""
    if record is None:
        return LeaseLost(f"key {key!r} is gone: it was forgotten, purged or expired")
    holder = (
        f"already {record.status.value}"
        if record.owner == owner and record.fencing_token == fencing_token
        else f"now {record.status.value} with fencing token {record.fencing_token}"
    )
    return LeaseLost(
        f"lease on key {key!r} lost: this attempt held fencing token {fencing_token}, "
        f"the key is {holder}",
        record,
    )


def not_unlockable(record: Record) -> Refused:
    """What every backend says when asked to unlock a key that holds no lease."""
    return Refused(
        f"key {record.key!r} is {record.status.value}: there is no lease to unlock", record
    )


def live_lease(record: Record, now: datetime | None = None) -> Refused:
    """What every backend says when asked, without force, to unlock a key whose lease
    is live (with ``now``, how long it has left)."""
    left = (
        f" ({(record.lease_expires_at - now).total_seconds():.1f}s left)"
        if now is not None and record.lease_expires_at is not None
        else ""
    )
    return Refused(
        f"key {record.key!r} has a live lease{left} held by {record.owner}; "
        "unlocking it lets a second worker run it concurrently "
        "(use --force, or force=True, to do it anyway)",
        record,
    )


def completed(record: Record, now: datetime, result: JSON, retention: float) -> Record:
    return replace(
        record,
        status=Status.COMPLETED,
        owner=None,
        lease_expires_at=None,
        updated_at=now,
        completed_at=now,
        expires_at=now + timedelta(seconds=retention),
        result=result,
        error=None,
        retriable=False,
    )


def failed(record: Record, now: datetime, error: str, retriable: bool, retention: float) -> Record:
    return replace(
        record,
        status=Status.FAILED,
        owner=None,
        lease_expires_at=None,
        updated_at=now,
        expires_at=now + timedelta(seconds=retention),
        error=error,
        retriable=retriable,
    )


def forgotten(record: Record, now: datetime) -> Record:
    """What ``forget`` leaves: a tombstone whose retention is over, so the key is as if never
    seen, that keeps the fencing counter (the next claim gets token + 1). ``purge`` deletes
    it like any record past retention."""
    return replace(
        record, owner=None, lease_expires_at=None, updated_at=now, expires_at=now, result=None
    )


def released(record: Record, now: datetime, handler_ran: bool = True) -> Record:
    """Claimable again at once; the fencing counter stays, and so do the attempts unless
    the handler never ran (the claim's attempt is taken back)."""
    attempts = record.attempts if handler_ran else max(record.attempts - 1, 0)
    return replace(record, owner=None, lease_expires_at=now, updated_at=now, attempts=attempts)


def unlocked(record: Record, now: datetime, force: bool) -> Record:
    """The record freed by an operator, or Refused when that would be unsafe."""
    if record.status is not Status.IN_PROGRESS:
        raise not_unlockable(record)
    if record.lease_live(now) and not force:
        raise live_lease(record, now)
    return released(record, now) if record.owner is not None else record


def check_forgettable(record: Record, force: bool) -> None:
    if record.status is Status.IN_PROGRESS and not force:
        raise Refused(
            f"key {record.key!r} is in progress; forgetting it lets a redelivery run it "
            "while the current attempt may still be working "
            "(use --force, or force=True, to do it anyway)",
            record,
        )


# The sequence guard ----------------------------------------------------------------------


def decide_guard(
    existing: Entity | None, g: Guard, now: datetime, lease: float, retention: float
) -> tuple[GuardReply, Entity | None]:
    """The guard's rules: the reply, and the entity to write (None: no write).

    Stale first: a sequence at or below the last applied one never runs, whoever holds the
    entity. Then the lock: another key's live attempt (or a later attempt on the same key)
    makes it busy; the same key's earlier attempt (taken over, so fenced by the key) or an
    expired lock is taken, and the holder asking again extends its lock. The lock's
    expiry follows the key's lease; the entity lives ``retention`` past its last change.
    """
    if existing is not None and existing.retention_over(now):
        existing = None
    last = None if existing is None else existing.sequence
    if last is not None and g.sequence <= last:
        return GuardReply(Verdict.STALE, last), None
    if (
        existing is not None
        and existing.locked(now)
        and (existing.holder != g.key or (existing.holder_token or 0) > g.fencing_token)
    ):
        return GuardReply(Verdict.BUSY, last, existing.holder), None
    until = now + timedelta(seconds=lease)
    entity = Entity(
        entity=g.entity,
        sequence=last,
        key=None if existing is None else existing.key,
        applied_at=None if existing is None else existing.applied_at,
        holder=g.key,
        holder_token=g.fencing_token,
        lock_expires_at=until,
        updated_at=now,
        expires_at=until + timedelta(seconds=retention),
    )
    return GuardReply(Verdict.GO, last), entity


def decide_settle(
    existing: Entity | None, s: Settle, now: datetime, retention: float
) -> tuple[bool, Entity | None]:
    """Whether the attempt ``s`` names still held the entity, and the entity to write.

    Fenced like ``complete``: only the holder's key with the holder's token may advance
    the entity or let it go, also after its lock expired if nobody took it meanwhile."""
    if (
        existing is None
        or existing.retention_over(now)
        or existing.holder != s.key
        or existing.holder_token != s.fencing_token
    ):
        return False, None
    if not s.applied:
        return True, replace(
            existing, holder=None, holder_token=None, lock_expires_at=None, updated_at=now
        )
    advanced = existing.sequence is None or s.sequence > existing.sequence
    return True, replace(
        existing,
        sequence=s.sequence if advanced else existing.sequence,
        key=s.key if advanced else existing.key,
        applied_at=now if advanced else existing.applied_at,
        holder=None,
        holder_token=None,
        lock_expires_at=None,
        updated_at=now,
        expires_at=now + timedelta(seconds=retention),
    )


def entity_locked(entity: Entity) -> Refused:
    """What every backend says when asked, without force, to forget a held entity."""
    return Refused(
        f"entity {entity.entity!r} is held by key {entity.holder!r} until "
        f"{iso_time(entity.lock_expires_at)}; forgetting it lets an older event apply while that "
        "attempt may still be working (use --force, or force=True, to do it anyway)"
    )
