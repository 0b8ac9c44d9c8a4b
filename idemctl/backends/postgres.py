"""``postgresql://`` (``postgres://``)."""

from idemctl.backends.registry import Backend, register

register(
    Backend(
        "postgresql",
        ("postgresql", "postgres"),
        store="idemctl.stores.postgres:PostgresStore",
        driver="psycopg",
        extra="postgres",
        async_store="idemctl.stores.postgres.store_async:AsyncPostgresStore",
        transactional=True,
        scratch="idemctl.harness.rooms:PostgresRoom",
    )
)
