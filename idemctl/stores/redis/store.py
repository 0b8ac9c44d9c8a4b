"""RedisStore: the claim/complete protocol, each operation one script call."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from idemctl.durations import MAX_TIMEOUT_MS
from idemctl.model import (
    ClaimOutcome,
    ClaimRequest,
    Completion,
    Holder,
    Record,
    Settle,
    Status,
    canonical_json,
    parse_json,
)
from idemctl.stores.base import (
    DEFAULT_LEASE,
    DEFAULT_RETENTION,
    LEASE_RANGE,
    RETENTION_RANGE,
    new_owners,
)
from idemctl.stores.machine import lease_lost
from idemctl.stores.redis.admin import RedisAdmin
from idemctl.stores.redis.connect import connect, target
from idemctl.stores.redis.core import Call, Op
from idemctl.stores.redis.entities import RedisEntities
from idemctl.stores.redis.provision import RedisProvisioning
from idemctl.stores.redis.records import claim_outcome, from_ms, parse_reply, text, to_record
from idemctl.stores.redis.scripts import Item
from idemctl.urls import UrlOptions


class RedisStore(RedisAdmin, RedisEntities, RedisProvisioning):
    scheme = "redis"

    @classmethod
    def from_url(cls, url: str) -> RedisStore:
        options = UrlOptions(url)
        settings: dict[str, Any] = {
            "prefix": options.text("prefix", "idem:"),
            "lease": options.duration("lease", DEFAULT_LEASE, *LEASE_RANGE),
            "retention": options.duration("retention", DEFAULT_RETENTION, *RETENTION_RANGE),
            "durable": options.flag("durable", False),
            "durable_timeout": options.duration("durable_timeout", 1.0, 0.001, MAX_TIMEOUT_MS),
        }
        settings["replicas"] = options.whole("replicas", 0)
        to = target(url, options)
        store = cls(connect(url, to), url=url, **settings)
        store.target = to
        return store

    # Each operation is an Op (its script call and what the replies come to): run here by
    # _do, awaited on an async client by idemctl.aio.

    def _claim_many(self, requests: Sequence[ClaimRequest], lease: float) -> list[ClaimOutcome]:
        return self._do(self._claim_op(requests, lease))

    def _claim_op(self, requests: Sequence[ClaimRequest], lease: float) -> Op[list[ClaimOutcome]]:
        owners = new_owners(len(requests))
        shared = (self._ms(lease), self._ms(self.default_retention))
        items = [(r.key, (r.fingerprint or "", o)) for r, o in zip(requests, owners, strict=True)]
        return self._script("claim", shared, items, durable=True), lambda replies: [
            claim_outcome(*x) for x in zip(requests, owners, replies, strict=True)
        ]

    def _complete(self, c: Completion, retention: float) -> Record:
        return self._do(self._complete_op(c, retention))

    def _complete_op(self, c: Completion, retention: float) -> Op[Record]:
        key, owner, fencing_token = c.key, c.owner, c.fencing_token
        keep = self._ms(retention)
        data = canonical_json(c.result)

        def read(replies: list[Any]) -> Record:
            reply = replies[0]
            if text(reply[0]) != "done":
                return self._held(key, owner, fencing_token, reply)
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
        return self._script("complete", (keep, "1"), items, durable=True), read

    def complete_many(
        self, completions: Sequence[Completion], retention: float | None = None
    ) -> list[bool]:
        return self._do(self._complete_many_op(completions, self._retention(retention)))

    def _complete_many_op(
        self, completions: Sequence[Completion], retention: float
    ) -> Op[list[bool]]:
        shared = (self._ms(retention), "0")
        items = [(c.key, (c.owner, c.fencing_token, canonical_json(c.result))) for c in completions]
        return self._script("complete", shared, items, durable=True), _oks

    def finish_many(
        self,
        completions: Sequence[Completion],
        settles: Sequence[Settle],
        retention: float | None = None,
    ) -> list[bool]:
        """On one server, each entity and its key in one script (finish.lua): both or
        neither. A cluster keeps them on two nodes: the entities first, then the keys."""
        if self.cluster or not settles:
            return super().finish_many(completions, settles, retention)
        finish, plain = self._finish_op(completions, settles, self._retention(retention))
        finished = self._do(finish)
        if plain:
            answers = self.complete_many(plain, retention)
            finished.update(zip((c.key for c in plain), answers, strict=True))
        return [finished[c.key] for c in completions]

    def _finish_op(
        self, completions: Sequence[Completion], settles: Sequence[Settle], retention: float
    ) -> tuple[Op[dict[str, bool]], list[Completion]]:
        """finish.lua over the completions that have a settle (on one server): whether each
        finished, by key; and the completions without one, to complete as complete_many."""
        by_key = {s.key: s for s in settles}
        keep = self._ms(retention)
        pairs = [c for c in completions if c.key in by_key]
        items: list[Item] = [
            (
                (self._ekey(by_key[c.key].entity), self._rkey(c.key)),
                (by_key[c.key].sequence, c.key, c.owner, c.fencing_token, canonical_json(c.result)),
            )
            for c in pairs
        ]
        call = Call("finish", (keep,), items, self.durable)
        plain = [c for c in completions if c.key not in by_key]
        return (
            call,
            lambda replies: {c.key: int(r) == 1 for c, r in zip(pairs, replies, strict=True)},
        ), plain

    def _fail(self, held: Holder, error: str, retriable: bool, retention: float) -> Record:
        return self._do(self._fail_op(held, error, retriable, retention))

    def _fail_op(self, held: Holder, error: str, retriable: bool, retention: float) -> Op[Record]:
        args = (held.owner, held.fencing_token, error, "1" if retriable else "0")
        call = self._script("fail", (self._ms(retention),), [(held.key, args)], durable=True)
        return call, self._holder_reads(held.key, held.owner, held.fencing_token)

    def extend(
        self, key: str, owner: str, fencing_token: int, lease: float | None = None
    ) -> datetime:
        return self._do(self._extend_op(key, owner, fencing_token, self._lease(lease)))

    def _extend_op(self, key: str, owner: str, fencing_token: int, lease: float) -> Op[datetime]:
        shared = (self._ms(lease), self._ms(self.default_retention))
        call = self._script("extend", shared, [(key, (owner, fencing_token))])
        reads = self._holder_reads(key, owner, fencing_token)

        def read(replies: list[Any]) -> datetime:
            expires = reads(replies).lease_expires_at
            assert expires is not None
            return expires

        return call, read

    def release(
        self, key: str, owner: str, fencing_token: int, *, handler_ran: bool = True
    ) -> Record:
        return self._do(self._release_op(key, owner, fencing_token, handler_ran))

    def _release_op(
        self, key: str, owner: str, fencing_token: int, handler_ran: bool
    ) -> Op[Record]:
        call = self._script("release", (int(not handler_ran),), [(key, (owner, fencing_token))])
        return call, self._holder_reads(key, owner, fencing_token)

    def _holder_reads(
        self, key: str, owner: str, fencing_token: int
    ) -> Callable[[list[Any]], Record]:
        """What a holder's call (fail, extend, release) comes to: the record, or LeaseLost."""
        return lambda replies: self._held(key, owner, fencing_token, replies[0])

    def _held(self, key: str, owner: str, fencing_token: int, reply: Sequence[Any]) -> Record:
        code, fields = parse_reply(reply)
        if fields is not None and code == "ok":
            return to_record(key, fields)
        record = None if fields is None else to_record(key, fields)
        raise lease_lost(key, owner, fencing_token, record)


def _oks(replies: list[Any]) -> list[bool]:
    return [text(r[0]) == "ok" for r in replies]
