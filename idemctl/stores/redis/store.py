"""RedisStore: the claim/complete protocol, each operation one script call."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

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
from idemctl.stores.base import DEFAULT_LEASE, DEFAULT_RETENTION, new_owners
from idemctl.stores.machine import lease_lost
from idemctl.stores.redis.admin import RedisAdmin
from idemctl.stores.redis.connect import connect
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
            "lease": options.duration("lease", DEFAULT_LEASE),
            "retention": options.duration("retention", DEFAULT_RETENTION),
            "durable": options.flag("durable", False),
            "durable_timeout": options.duration("durable_timeout", 1.0),
        }
        settings["replicas"] = options.whole("replicas", 0)
        return cls(connect(url, options), url=url, **settings)

    def _claim_many(self, requests: Sequence[ClaimRequest], lease: float) -> list[ClaimOutcome]:
        owners = new_owners(len(requests))
        shared = (self._ms(self._lease(lease)), self._ms(self.default_retention))
        items = [(r.key, (r.fingerprint or "", o)) for r, o in zip(requests, owners, strict=True)]
        replies = self._call("claim", shared, items, durable=True)
        return [claim_outcome(*x) for x in zip(requests, owners, replies, strict=True)]

    def _complete(self, c: Completion, retention: float) -> Record:
        key, owner, fencing_token, result = c.key, c.owner, c.fencing_token, c.result
        keep = self._ms(self._retention(retention))
        data = canonical_json(result)
        reply = self._one("complete", (keep, "1"), key, owner, fencing_token, data, durable=True)
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

    def complete_many(
        self, completions: Sequence[Completion], retention: float | None = None
    ) -> list[bool]:
        shared = (self._ms(self._retention(retention)), "0")
        items = [(c.key, (c.owner, c.fencing_token, canonical_json(c.result))) for c in completions]
        return [text(r[0]) == "ok" for r in self._call("complete", shared, items, durable=True)]

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
        by_key = {s.key: s for s in settles}
        keep = self._ms(self._retention(retention))
        pairs = [c for c in completions if c.key in by_key]
        items: list[Item] = [
            (
                (self._ekey(by_key[c.key].entity), self._rkey(c.key)),
                (by_key[c.key].sequence, c.key, c.owner, c.fencing_token, canonical_json(c.result)),
            )
            for c in pairs
        ]
        replies = self._scripts.call("finish", (keep,), items, confirm=self.durable)
        finished = {c.key: int(r) == 1 for c, r in zip(pairs, replies, strict=True)}
        plain = [c for c in completions if c.key not in by_key]
        if plain:
            answers = self.complete_many(plain, retention)
            finished.update(zip((c.key for c in plain), answers, strict=True))
        return [finished[c.key] for c in completions]

    def _fail(self, held: Holder, error: str, retriable: bool, retention: float) -> Record:
        key, owner, fencing_token = held.key, held.owner, held.fencing_token
        shared = (self._ms(self._retention(retention)),)
        args = (owner, fencing_token, error, "1" if retriable else "0")
        return self._held(
            key, owner, fencing_token, self._one("fail", shared, key, *args, durable=True)
        )

    def extend(
        self, key: str, owner: str, fencing_token: int, lease: float | None = None
    ) -> datetime:
        shared = (self._ms(self._lease(lease)), self._ms(self.default_retention))
        reply = self._one("extend", shared, key, owner, fencing_token)
        expires = self._held(key, owner, fencing_token, reply).lease_expires_at
        assert expires is not None
        return expires

    def release(
        self, key: str, owner: str, fencing_token: int, *, handler_ran: bool = True
    ) -> Record:
        reply = self._one("release", (int(not handler_ran),), key, owner, fencing_token)
        return self._held(key, owner, fencing_token, reply)

    def _held(self, key: str, owner: str, fencing_token: int, reply: Sequence[Any]) -> Record:
        code, fields = parse_reply(reply)
        if fields is not None and code == "ok":
            return to_record(key, fields)
        record = None if fields is None else to_record(key, fields)
        raise lease_lost(key, owner, fencing_token, record)
