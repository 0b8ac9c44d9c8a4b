"""What a ``postgresql://`` store URL asks for: the libpq connection string, and the store's
settings, each checked against its range before anything connects."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode, urlunsplit

from idemctl.durations import MAX_TIMEOUT_MS
from idemctl.errors import ConfigError
from idemctl.stores.limits import DEFAULT_LEASE, DEFAULT_RETENTION, LEASE_RANGE, RETENTION_RANGE
from idemctl.stores.postgres.sql import DEFAULT_SCHEMA
from idemctl.urls import UrlOptions, redact_url

LIBPQ = ("sslmode", "sslrootcert", "sslcert", "sslkey", "application_name", "target_session_attrs")
"""libpq options a URL may carry through to the connection."""


def from_url(url: str) -> tuple[str, dict[str, Any]]:
    """The connection string and the PostgresStore settings ``url`` names."""
    options = UrlOptions(url)
    parts = options.parts
    settings: dict[str, Any] = {
        "schema": options.text("schema", DEFAULT_SCHEMA) or DEFAULT_SCHEMA,
        "prefix": options.text("prefix", "") or "",
        "lease": options.duration("lease", DEFAULT_LEASE, *LEASE_RANGE),
        "retention": options.duration("retention", DEFAULT_RETENTION, *RETENTION_RANGE),
        # PostgreSQL counts these in milliseconds, in 32 bits; 0 would mean wait for ever
        "lock_timeout": options.duration("lock_timeout", 0.1, 0.001, MAX_TIMEOUT_MS),
        "statement_timeout": options.duration("statement_timeout", 10.0, 0.001, MAX_TIMEOUT_MS),
        "connect_timeout": options.duration("connect_timeout", 5.0, 0.001),
        "pool_min": options.whole("pool_min", 1),
        "pool_max": options.whole("pool_max", 8, minimum=1),
    }
    libpq = {n: v for n in LIBPQ if (v := options.text(n)) is not None}
    options.finish()
    if not parts.hostname and not parts.path.strip("/"):
        raise ConfigError(f"PostgreSQL URL {redact_url(url)} names no host or database")
    conninfo = urlunsplit(parts._replace(scheme="postgresql", query=urlencode(libpq), fragment=""))
    return conninfo, settings
