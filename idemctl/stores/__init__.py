"""Open a store by URL. Backends are imported only when their scheme is asked for."""

from __future__ import annotations

import importlib

from idemctl.errors import ConfigError, MissingDriver
from idemctl.powertools import is_powertools
from idemctl.stores.base import Store
from idemctl.urls import redact_url, split_url

DEFAULT_URL = "sqlite:///./idemctl.db"

# scheme -> ("module:Class", the driver package, the extra that installs it)
BACKENDS: dict[str, tuple[str, str | None, str | None]] = {
    "sqlite": ("idemctl.stores.sqlite:SQLiteStore", None, None),
    "memory": ("idemctl.stores.memory:MemoryStore", None, None),
    "redis": ("idemctl.stores.redis:RedisStore", "redis", "redis"),
    "rediss": ("idemctl.stores.redis:RedisStore", "redis", "redis"),
    "redis+cluster": ("idemctl.stores.redis:RedisStore", "redis", "redis"),
    "postgresql": ("idemctl.stores.postgres:PostgresStore", "psycopg", "postgres"),
    "postgres": ("idemctl.stores.postgres:PostgresStore", "psycopg", "postgres"),
    "dynamodb": ("idemctl.stores.dynamodb:DynamoDBStore", "boto", "dynamodb"),
}

__all__ = ["BACKENDS", "DEFAULT_URL", "Store", "open_store", "refuse_powertools"]


def open_store(url: str = DEFAULT_URL) -> Store:
    """The store at ``url`` (``sqlite:///path``, ``memory://``, ...), ready to use."""
    refuse_powertools(url)
    scheme = split_url(url).scheme.lower()
    if scheme not in BACKENDS:
        known = ", ".join(f"{s}://" for s in BACKENDS)
        raise ConfigError(f"unknown store scheme {scheme!r} in {redact_url(url)}; known: {known}")
    target, driver, extra = BACKENDS[scheme]
    module_name, class_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # psycopg's pool is the psycopg_pool package: one extra installs both.
        if driver is not None and exc.name is not None and exc.name.startswith(driver):
            raise MissingDriver(
                f"the {scheme}:// store needs the {driver} package: pip install 'idemctl[{extra}]'"
            ) from exc
        raise
    store: Store = getattr(module, class_name).from_url(url)
    return store


def refuse_powertools(url: str) -> None:
    """ConfigError for a Powertools table's URL (``layout=powertools``), where idemctl's own
    protocol would claim keys: a command that would runs this before anything else."""
    if is_powertools(url):
        raise ConfigError(
            f"{redact_url(url)} is Powertools' layout: idemctl reads and repairs its records "
            "(inspect, list, stats, doctor, unlock, forget, purge) but never claims keys in "
            "it; consume, init, verify and the outbox need idemctl's own layout (no "
            "layout=powertools, another table or key prefix)"
        )
