"""The async store at a URL, or over a sync store: a backend's native async half where it
has one (Redis, PostgreSQL), else the sync store in worker threads."""

from __future__ import annotations

from idemctl import backends
from idemctl.stores import DEFAULT_URL
from idemctl.stores import open_store as open_sync_store
from idemctl.stores.base import Store
from idemctl.stores.base_async import AsyncStore


def open_store(url: str = DEFAULT_URL) -> AsyncStore:
    """The async store at ``url``, for the same URLs as ``idemctl.open_store``. Connections
    are made on first use; close it with ``await store.aclose()`` or ``async with``."""
    return wrap(open_sync_store(url))


def wrap(store: Store) -> AsyncStore:
    """The async store over the sync ``store`` (which it closes when closed)."""
    backend = backends.named(getattr(store, "scheme", ""))
    if backend is not None and backend.async_store is not None:
        native: AsyncStore = backend.load("async_store")(store)
        return native
    in_process = backend is not None and backend.in_process  # writes serialised anyway
    return AsyncStore(store, threads=1 if in_process else None)
