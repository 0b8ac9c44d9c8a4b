"""RedisStore: the claim/complete protocol, each operation one script call."""

from __future__ import annotations

from collections.abc import Sequence
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
)
from idemctl.stores.base import (
    DEFAULT_LEASE,
    DEFAULT_RETENTION,
    LEASE_RANGE,
    RETENTION_RANGE,
)
from idemctl.stores.redis.admin import RedisAdmin
from idemctl.stores.redis.connect import connect, target
from idemctl.stores.redis.entities import RedisEntities
from idemctl.stores.redis.provision import RedisProvisioning
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

    # Each operation is an Op (ops.py: its script call and what the replies come to), run
    # here by _do and awaited on an async client by idemctl.aio.

    def _claim_many(self, requests: Sequence[ClaimRequest], lease: float) -> list[ClaimOutcome]:
        return self._do(self.ops.claim(requests, lease))

    def _complete(self, c: Completion, retention: float) -> Record:
        return self._do(self.ops.complete(c, retention))

    def complete_many(
        self, completions: Sequence[Completion], retention: float | None = None
    ) -> list[bool]:
        return self._do(self.ops.complete_many(completions, self.retention_for(retention)))

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
        finish, plain = self.ops.finish(completions, settles, self.retention_for(retention))
        finished = self._do(finish)
        if plain:
            answers = self.complete_many(plain, retention)
            finished.update(zip((c.key for c in plain), answers, strict=True))
        return [finished[c.key] for c in completions]

    def _fail(self, held: Holder, error: str, retriable: bool, retention: float) -> Record:
        return self._do(self.ops.fail(held, error, retriable, retention))

    def extend(
        self, key: str, owner: str, fencing_token: int, lease: float | None = None
    ) -> datetime:
        return self._do(self.ops.extend(key, owner, fencing_token, self.lease_for(lease)))

    def release(
        self, key: str, owner: str, fencing_token: int, *, handler_ran: bool = True
    ) -> Record:
        return self._do(self.ops.release(key, owner, fencing_token, handler_ran))
