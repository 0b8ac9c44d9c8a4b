"""Open a store by URL (``idemctl.backends`` maps each scheme to its store, imported only
when its scheme is asked for)."""

from __future__ import annotations

from idemctl import backends
from idemctl.errors import ConfigError
from idemctl.stores.base import Store
from idemctl.urls import redact_url

DEFAULT_URL = "sqlite:///./idemctl.db"

__all__ = ["DEFAULT_URL", "Store", "open_store", "refuse_powertools"]


def open_store(url: str = DEFAULT_URL) -> Store:
    """The store at ``url`` (``sqlite:///path``, ``memory://``, ...), ready to use."""
    refuse_powertools(url)
    store: Store = backends.for_url(url).load("store").from_url(url)
    return store


def refuse_powertools(url: str) -> None:
    """ConfigError for a Powertools table's URL (``layout=powertools``), where idemctl's own
    protocol would claim keys: a command that would runs this before anything else."""
    if backends.layout_of(url) == "powertools":
        raise ConfigError(
            f"{redact_url(url)} is Powertools' layout: idemctl reads and repairs its records "
            "(inspect, list, stats, doctor, unlock, forget, purge) but never claims keys in "
            "it; consume, init, verify and the outbox need idemctl's own layout (no "
            "layout=powertools, another table or key prefix)"
        )
