"""``redis://``, ``rediss://`` (TLS), ``redis+cluster://``; Powertools' layout too."""

from idemctl.backends.registry import Backend, register

register(
    Backend(
        "redis",
        ("redis", "rediss", "redis+cluster"),
        store="idemctl.stores.redis:RedisStore",
        driver="redis",
        extra="redis",
        async_store="idemctl.stores.redis.store_async:AsyncRedisStore",
        layouts={"powertools": "idemctl.powertools.redis:RedisPowertoolsTable"},
        scratch="idemctl.harness.rooms:RedisRoom",
    )
)
