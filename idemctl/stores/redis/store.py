"""RedisStore: its parts (the protocol's steps, written from ``idemctl.stores.redis.steps_async``;
the operator's operations, the entities', provisioning) and how a URL opens it."""

from __future__ import annotations

from typing import Any

from idemctl.durations import MAX_TIMEOUT_MS
from idemctl.stores.limits import DEFAULT_LEASE, DEFAULT_RETENTION, LEASE_RANGE, RETENTION_RANGE
from idemctl.stores.redis.admin import RedisAdmin
from idemctl.stores.redis.connect import connect, target
from idemctl.stores.redis.entities import RedisEntities
from idemctl.stores.redis.provision import RedisProvisioning
from idemctl.stores.redis.steps import RedisSteps
from idemctl.urls import UrlOptions


class RedisStore(RedisSteps, RedisAdmin, RedisEntities, RedisProvisioning):
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
