"""The protocol's logic on PostgreSQL without the I/O: each operation is a flow, a generator
that yields the statements to run (``Statement``) and is sent what each gave (``Reply``),
and returns the operation's answer. ``drive`` (``stores.postgres.drive``) runs a flow on a
sync connection (the ``PostgresStore``), ``drive_async`` on an async one (``idemctl.aio``'s
store): both stores send the same statements with the same parameters and read the rows
the same way.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple, TypeAlias, TypeVar

from idemctl.errors import LeaseLost, StoreUnavailable
from idemctl.model import (
    Acquired,
    Busy,
    ClaimOutcome,
    ClaimRequest,
    Completion,
    Guard,
    GuardReply,
    Holder,
    Record,
    Settle,
    Verdict,
    canonical_json,
)
from idemctl.stores.base import new_owner, new_owners
from idemctl.stores.machine import decide_claim, decide_guard, lease_lost
from idemctl.stores.postgres.sql import entity_of, record_of, utc

T = TypeVar("T")

GUARD_TRIES = 5
"""Statements a guard item may take when its row changes between the statement's snapshot
and its write (a concurrent writer): then it answers BUSY."""


class Statement(NamedTuple):
    """One statement a flow wants run, with its parameters."""

    sql: str
    params: Any = None
    prepare: bool | None = None
    """True: the library's single-key path, prepared on its connection, whose plan
    PostgreSQL may keep (see ``pool_base.PoolSettings.connect_kwargs``); None: planned at
    each execution for its parameters."""


class Reply(NamedTuple):
    """What a statement gave: its rows (none for a statement without a result) and the
    number of rows it touched."""

    rows: list[tuple[Any, ...]]
    rowcount: int


Flow: TypeAlias = Generator[Statement, Reply, T]
"""Yields statements, is sent their replies, returns ``T``."""


def rounds_of(names: Sequence[str]) -> list[list[int]]:
    """The indexes of ``names`` in rounds where no name comes twice, each in the order
    given: one statement cannot change a row twice, so the second item on a row goes in the
    next statement and sees what the one before it did, as items one by one would."""
    seen: dict[str, int] = {}
    rounds: list[list[int]] = []
    for i, name in enumerate(names):
        n = seen[name] = seen.get(name, -1) + 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].append(i)
    return rounds


# Claims -------------------------------------------------------------------------------------


def claim(
    sql: Mapping[str, str], requests: Sequence[ClaimRequest], lease: float
) -> Flow[list[ClaimOutcome]]:
    """Claim each key (already validated), in order, for ``lease`` seconds."""
    if len(requests) == 1:
        return [(yield from claim_one(sql, requests[0], lease))]
    outcomes: list[ClaimOutcome | None] = [None] * len(requests)
    for indexes in rounds_of([r.key for r in requests]):
        batch = [requests[i] for i in indexes]
        answers = yield from claim_statement(sql, batch, lease)
        for i, outcome in zip(indexes, answers, strict=True):
            outcomes[i] = outcome
    return [o for o in outcomes if o is not None]


def claim_one(sql: Mapping[str, str], r: ClaimRequest, lease: float) -> Flow[ClaimOutcome]:
    """One key: the statement of its own, whose plan the connection keeps."""
    owner = new_owner()
    params = {"key": r.key, "fp": r.fingerprint, "owner": owner, "lease": lease}
    reply = yield Statement(sql["claim_one"], params, prepare=True)
    return (yield from claimed(sql, [r], [owner], reply))[0]


def claim_params(
    requests: Sequence[ClaimRequest], owners: Sequence[str], lease: float
) -> dict[str, Any]:
    return {
        "keys": [r.key for r in requests],
        "fps": [r.fingerprint for r in requests],
        "owners": list(owners),
        "lease": lease,
    }


def claim_statement(
    sql: Mapping[str, str], requests: Sequence[ClaimRequest], lease: float
) -> Flow[list[ClaimOutcome]]:
    """One claim statement over keys that are all different."""
    owners = new_owners(len(requests))
    reply = yield Statement(sql["claim"], claim_params(requests, owners, lease))
    return (yield from claimed(sql, requests, owners, reply))


def claimed(
    sql: Mapping[str, str], requests: Sequence[ClaimRequest], owners: Sequence[str], reply: Reply
) -> Flow[list[ClaimOutcome]]:
    """The outcomes of a claim statement's rows."""
    rows = {row[0]: row for row in reply.rows}
    outcomes: list[ClaimOutcome] = []
    for r, owner in zip(requests, owners, strict=True):
        row = rows[r.key]
        if row[1] is not None:
            outcomes.append(Acquired(r.key, owner, row[1], row[2], utc(row[3]), takeover=row[4]))
        else:
            outcomes.append((yield from not_claimed(sql, r, row[5:19], row[19])))
    return outcomes


def not_claimed(
    sql: Mapping[str, str], request: ClaimRequest, old: Sequence[Any], now: datetime
) -> Flow[ClaimOutcome]:
    """Why the claim statement left a key alone, from the row it saw."""
    if old[0] is None:
        # Inserted by another transaction after this statement's snapshot: read it now.
        fresh = yield Statement(sql["get_any"], {"key": request.key})
        if not fresh.rows:
            return Busy(None)
        old = fresh.rows[0]
    record = record_of(old)
    outcome, _ = decide_claim(record, request.key, request.fingerprint, utc(now), 0.0)
    # What the row allowed changed under us: somebody else holds it now.
    return Busy(record) if isinstance(outcome, Acquired) else outcome


# Completion and the other transitions of a held key ----------------------------------------


def completion_params(completions: Sequence[Completion], retention: float) -> dict[str, Any]:
    return {
        "keys": [c.key for c in completions],
        "owners": [c.owner for c in completions],
        "tokens": [c.fencing_token for c in completions],
        "results": [canonical_json(c.result).decode() for c in completions],
        "retention": retention,
    }


def complete_one(sql: Mapping[str, str], c: Completion, retention: float) -> Flow[Record]:
    """``complete``: the record, or LeaseLost."""
    params = {
        "key": c.key,
        "owner": c.owner,
        "token": c.fencing_token,
        "result": canonical_json(c.result).decode(),
        "retention": retention,
    }
    reply = yield Statement(sql["complete_one"], params, prepare=True)
    if reply.rows:
        return record_of(reply.rows[0])
    raise (yield from lost(sql, c.key, c.owner, c.fencing_token))


def complete_many(
    sql: Mapping[str, str], completions: Sequence[Completion], retention: float
) -> Flow[list[bool]]:
    """``complete_many``: one statement; True where the key was still held as named."""
    reply = yield Statement(sql["complete_keys"], completion_params(completions, retention))
    done = {row[0] for row in reply.rows}
    return [c.key in done for c in completions]


def held(
    sql: Mapping[str, str], statement: str, h: Holder, params: Mapping[str, Any]
) -> Flow[Record]:
    """One of the statements that need ``h`` to hold the key: the record it wrote, or
    LeaseLost with the key as it is now."""
    args = {"key": h.key, "owner": h.owner, "token": h.fencing_token, **params}
    reply = yield Statement(sql[statement], args)
    if reply.rows:
        return record_of(reply.rows[0])
    raise (yield from lost(sql, h.key, h.owner, h.fencing_token))


def fail(
    sql: Mapping[str, str], h: Holder, error: str, retriable: bool, retention: float
) -> Flow[Record]:
    params = {"error": error, "retriable": retriable, "retention": retention}
    return (yield from held(sql, "fail", h, params))


def extend(sql: Mapping[str, str], h: Holder, lease: float) -> Flow[datetime]:
    record = yield from held(sql, "extend", h, {"lease": lease})
    assert record.lease_expires_at is not None
    return record.lease_expires_at


def release(sql: Mapping[str, str], h: Holder, handler_ran: bool) -> Flow[Record]:
    return (yield from held(sql, "release", h, {"unrun": int(not handler_ran)}))


def lost(sql: Mapping[str, str], key: str, owner: str, fencing_token: int) -> Flow[LeaseLost]:
    """The LeaseLost to raise for ``owner`` and ``fencing_token``, from the key as it is."""
    reply = yield Statement(sql["get"], {"key": key})
    now = record_of(reply.rows[0]) if reply.rows else None
    return lease_lost(key, owner, fencing_token, now)


def get(sql: Mapping[str, str], key: str) -> Flow[Record | None]:
    reply = yield Statement(sql["get"], {"key": key})
    return record_of(reply.rows[0]) if reply.rows else None


def get_many(sql: Mapping[str, str], keys: Sequence[str]) -> Flow[dict[str, Record]]:
    reply = yield Statement(sql["get_many"], {"keys": list(dict.fromkeys(keys))})
    return {r.key: r for r in map(record_of, reply.rows)}


def schema_version(sql: Mapping[str, str]) -> Flow[int]:
    """The version of the provisioned schema (NotProvisioned, translated, when none)."""
    reply = yield Statement(sql["schema_version"])
    return int(reply.rows[0][0])


# The sequence guard -------------------------------------------------------------------------


def guard(
    sql: Mapping[str, str], guards: Sequence[Guard], lease: float, retention: float
) -> Flow[list[GuardReply]]:
    """``guard_many`` for valid items; ``retention`` is the store's default."""
    replies: list[GuardReply | None] = [None] * len(guards)
    for indexes in rounds_of([g.entity for g in guards]):
        pending = indexes
        for _ in range(GUARD_TRIES):
            pending = yield from guard_statement(sql, guards, pending, lease, retention, replies)
            if not pending:
                break
        for i in pending:  # the row kept changing under us: others are working on it
            replies[i] = yield from reply_unwritten(sql, guards[i], retention)
    return [r for r in replies if r is not None]


def guard_params(guards: Sequence[Guard], lease: float, retention: float) -> dict[str, Any]:
    return {
        "entities": [g.entity for g in guards],
        "sequences": [g.sequence for g in guards],
        "keys": [g.key for g in guards],
        "tokens": [g.fencing_token for g in guards],
        "lease": lease,
        "retention": retention,
    }


def guard_statement(
    sql: Mapping[str, str],
    guards: Sequence[Guard],
    indexes: list[int],
    lease: float,
    retention: float,
    replies: list[GuardReply | None],
) -> Flow[list[int]]:
    """One guard statement over items on different entities: their replies, and the
    items whose row changed between the snapshot and the write (to ask again)."""
    batch = [guards[i] for i in indexes]
    reply = yield Statement(sql["guard"], guard_params(batch, lease, retention))
    rows = {row[0]: row for row in reply.rows}
    again = []
    for i, g in zip(indexes, batch, strict=True):
        row = rows[g.entity]
        if row[1]:
            replies[i] = GuardReply(Verdict.GO, row[2])
            continue
        # Not written: decide_guard on the row as the statement's snapshot saw it says
        # why. Where that says GO, the row changed before the write looked: ask again.
        answer, _ = decide_guard(entity_of(row[3:12]), g, utc(row[12]), lease, retention)
        if answer.verdict is Verdict.GO:
            again.append(i)
        else:
            replies[i] = answer
    return again


def reply_unwritten(sql: Mapping[str, str], g: Guard, retention: float) -> Flow[GuardReply]:
    """The reply to a guard that could not write: STALE when the committed row says
    so, else BUSY (with the holder the row names, if any)."""
    reply = yield Statement(sql["read_entity"], {"entity": g.entity})
    if not reply.rows:
        clock = yield Statement(sql["now"])
        entity, now = None, utc(clock.rows[0][0])
    else:
        row = reply.rows[0]
        entity, now = entity_of(row), utc(row[9])
    answer, _ = decide_guard(entity, g, now, 0.0, retention)
    return answer if answer.verdict is not Verdict.GO else GuardReply(Verdict.BUSY, answer.last)


def settle_params(settles: Sequence[Settle], retention: float) -> dict[str, Any]:
    return {
        "entities": [s.entity for s in settles],
        "sequences": [s.sequence for s in settles],
        "keys": [s.key for s in settles],
        "tokens": [s.fencing_token for s in settles],
        "applied": [s.applied for s in settles],
        "retention": retention,
    }


def settle_in_transaction(settles: Sequence[Settle]) -> bool:
    """Whether ``settle`` takes more than one statement: then the driver runs it in one
    transaction, so a lock timeout undoes all of them."""
    return len(rounds_of([s.entity for s in settles])) > 1


def settle(sql: Mapping[str, str], settles: Sequence[Settle], retention: float) -> Flow[list[bool]]:
    """``settle_many``: True where that key and token still held the entity."""
    done = [False] * len(settles)
    for indexes in rounds_of([s.entity for s in settles]):
        batch = [settles[i] for i in indexes]
        reply = yield Statement(sql["settle"], settle_params(batch, retention))
        held_now = {row[0] for row in reply.rows}
        for i, s in zip(indexes, batch, strict=True):
            done[i] = s.entity in held_now
    return done


def settle_blocked(settles: Sequence[Settle], waited: float) -> StoreUnavailable:
    """What ``settle_many`` says when an entity's row stayed locked for ``waited``."""
    return StoreUnavailable(
        f"entity {settles[0].entity!r} (or another of this batch) is locked by a "
        f"transaction in progress (waited {waited:g}s); try again"
    )
