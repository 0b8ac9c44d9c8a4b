"""The claim/complete path's operations on Redis, sans-IO: each builds its script call and
says what the call's replies come to (an ``Op``). ``RedisStore`` runs them on its client;
``idemctl.stores.redis.store_async`` awaits the same ones on an async client, so the Lua,
the keys and the reading of the replies are one. Model: ``idemctl.stores.postgres.flows``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeAlias, TypeVar

from idemctl.model import (
    ClaimOutcome,
    ClaimRequest,
    Completion,
    Guard,
    GuardReply,
    Holder,
    Record,
    Settle,
    Status,
    Verdict,
    canonical_json,
    parse_json,
)
from idemctl.stores.base import new_owners
from idemctl.stores.machine import lease_lost
from idemctl.stores.redis.records import (
    claim_outcome,
    fields_of,
    from_ms,
    parse_reply,
    text,
    to_record,
)
from idemctl.stores.redis.scripts import Item

T = TypeVar("T")

ENTITIES = "entity:"
"""What follows the store's prefix in an entity's Redis key, before its ``{name}``."""


@dataclass(frozen=True, slots=True)
class Call:
    """One script call: the script's name, the values every key shares, each key with its
    own values, and whether durable=1 confirms it."""

    name: str
    shared: Sequence[Any]
    items: Sequence[Item]
    confirm: bool


Op: TypeAlias = tuple[Call, Callable[[list[Any]], T]]
"""An operation on the protocol: its script call, and what the call's replies come to."""


def ms(seconds: float) -> int:
    """``seconds`` as the whole milliseconds the scripts take (at least 1)."""
    return max(1, round(seconds * 1000))


@dataclass(frozen=True)
class Ops:
    """The operations of a store with these settings (``RedisStore.ops``)."""

    prefix: str
    durable: bool
    default_retention: float

    def rkey(self, key: str) -> str:
        """The Redis key of the record for ``key``."""
        return f"{self.prefix}{{{key}}}"

    def ekey(self, entity: str) -> str:
        """The Redis key of ``entity``'s sequence."""
        return f"{self.prefix}{ENTITIES}{{{entity}}}"

    def script(
        self,
        name: str,
        shared: Sequence[Any],
        items: Sequence[tuple[str, Sequence[Any]]],
        durable: bool = False,
        named: Callable[[str], str] | None = None,
    ) -> Call:
        """Script ``name`` over ``items`` (key, per-key values): one reply per item. A write
        (``durable``) is confirmed under durable=1 (see ScriptRunner.call). Keys are
        records' (``rkey``), or named by ``named`` (an entity's ``ekey``)."""
        named = named or self.rkey
        keyed = [(named(key), values) for key, values in items]
        return Call(name, shared, keyed, durable and self.durable)

    def claim(self, requests: Sequence[ClaimRequest], lease: float) -> Op[list[ClaimOutcome]]:
        owners = new_owners(len(requests))
        shared = (ms(lease), ms(self.default_retention))
        items = [(r.key, (r.fingerprint or "", o)) for r, o in zip(requests, owners, strict=True)]
        return self.script("claim", shared, items, durable=True), lambda replies: [
            claim_outcome(*x) for x in zip(requests, owners, replies, strict=True)
        ]

    def complete(self, c: Completion, retention: float) -> Op[Record]:
        key, owner, fencing_token = c.key, c.owner, c.fencing_token
        keep = ms(retention)
        data = canonical_json(c.result)

        def read(replies: list[Any]) -> Record:
            reply = replies[0]
            if text(reply[0]) != "done":
                return held(key, owner, fencing_token, reply)
            # This call completed it: the script sent only what the call does not know.
            created, attempts, fp, now = (text(x) for x in reply[1:])
            at = from_ms(now)
            assert at is not None
            return Record(
                key=key,
                status=Status.COMPLETED,
                fingerprint=fp or None,
                owner=None,
                fencing_token=fencing_token,
                attempts=int(attempts),
                created_at=from_ms(created) or at,
                updated_at=at,
                completed_at=at,
                expires_at=from_ms(int(now) + keep),
                result=parse_json(data),
            )

        items = [(key, (owner, fencing_token, data))]
        return self.script("complete", (keep, "1"), items, durable=True), read

    def complete_many(self, completions: Sequence[Completion], retention: float) -> Op[list[bool]]:
        shared = (ms(retention), "0")
        items = [(c.key, (c.owner, c.fencing_token, canonical_json(c.result))) for c in completions]
        return self.script("complete", shared, items, durable=True), _oks

    def finish(
        self, completions: Sequence[Completion], settles: Sequence[Settle], retention: float
    ) -> tuple[Op[dict[str, bool]], list[Completion]]:
        """finish.lua over the completions that have a settle (on one server): whether each
        finished, by key; and the completions without one, to complete as complete_many."""
        by_key = {s.key: s for s in settles}
        pairs = [c for c in completions if c.key in by_key]
        items: list[Item] = [
            (
                (self.ekey(by_key[c.key].entity), self.rkey(c.key)),
                (by_key[c.key].sequence, c.key, c.owner, c.fencing_token, canonical_json(c.result)),
            )
            for c in pairs
        ]
        call = Call("finish", (ms(retention),), items, self.durable)
        plain = [c for c in completions if c.key not in by_key]
        return (
            call,
            lambda replies: {c.key: int(r) == 1 for c, r in zip(pairs, replies, strict=True)},
        ), plain

    def fail(self, holder: Holder, error: str, retriable: bool, retention: float) -> Op[Record]:
        args = (holder.owner, holder.fencing_token, error, "1" if retriable else "0")
        call = self.script("fail", (ms(retention),), [(holder.key, args)], durable=True)
        return call, _holder_reads(holder.key, holder.owner, holder.fencing_token)

    def extend(self, key: str, owner: str, fencing_token: int, lease: float) -> Op[datetime]:
        shared = (ms(lease), ms(self.default_retention))
        call = self.script("extend", shared, [(key, (owner, fencing_token))])
        reads = _holder_reads(key, owner, fencing_token)

        def read(replies: list[Any]) -> datetime:
            expires = reads(replies).lease_expires_at
            assert expires is not None
            return expires

        return call, read

    def release(self, key: str, owner: str, fencing_token: int, handler_ran: bool) -> Op[Record]:
        call = self.script("release", (int(not handler_ran),), [(key, (owner, fencing_token))])
        return call, _holder_reads(key, owner, fencing_token)

    def guard(self, guards: Sequence[Guard], lease: float) -> Op[list[GuardReply]]:
        shared = (ms(lease), ms(self.default_retention))
        items = [(g.entity, (g.sequence, g.key, g.fencing_token)) for g in guards]
        call = self.script("guard", shared, items, True, self.ekey)
        return call, lambda replies: [_guard_reply(reply) for reply in replies]

    def settle(self, settles: Sequence[Settle], retention: float) -> Op[list[bool]]:
        items = [
            (s.entity, (s.sequence, s.key, s.fencing_token, "1" if s.applied else "0"))
            for s in settles
        ]
        call = self.script("settle", (ms(retention),), items, True, self.ekey)
        return call, lambda replies: [int(reply) == 1 for reply in replies]


def live(key: str, raw: str | bytes | None, now: datetime) -> Record | None:
    """The record ``raw`` holds for ``key``, unless it is past retention at ``now``."""
    fields = fields_of(raw)
    if fields is None:
        return None
    record = to_record(key, fields)
    return None if record.retention_over(now) else record


def held(key: str, owner: str, fencing_token: int, reply: Sequence[Any]) -> Record:
    """What a holder's call (fail, extend, release, complete) answered: the record, or
    LeaseLost when the key is no longer held by this owner and token."""
    code, fields = parse_reply(reply)
    if fields is not None and code == "ok":
        return to_record(key, fields)
    record = None if fields is None else to_record(key, fields)
    raise lease_lost(key, owner, fencing_token, record)


def _holder_reads(key: str, owner: str, fencing_token: int) -> Callable[[list[Any]], Record]:
    return lambda replies: held(key, owner, fencing_token, replies[0])


def _oks(replies: list[Any]) -> list[bool]:
    return [text(r[0]) == "ok" for r in replies]


def _guard_reply(reply: Sequence[Any]) -> GuardReply:
    verdict, last, holder = (text(x) for x in reply)
    return GuardReply(Verdict(verdict), int(last) if last else None, holder or None)
