"""``Idempotency-Key`` for HTTP APIs: ASGI (``idemctl.http.asgi``) and WSGI
(``idemctl.http.wsgi``) middleware over one policy (``idemctl.http.policy``), on every
store. Importing this package loads no framework and no store driver.

See docs/guides/http.md for the semantics table.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from idemctl.http.policy import HEADER, REPLAYED, Attempt, Options, Request, authorization_caller

if TYPE_CHECKING:
    from idemctl.stores.base import Store
    from idemctl.stores.base_async import AsyncStore

__all__ = ["HEADER", "REPLAYED", "Attempt", "Options", "Request", "authorization_caller"]


def _url(given: str | None) -> str:
    from idemctl.stores import DEFAULT_URL

    return given or os.environ.get("IDEMCTL_STORE") or DEFAULT_URL


def opened(given: str | Store | None) -> Store:
    """The sync store a WSGI middleware was given: a store as it is, else the one at the
    URL (None: ``$IDEMCTL_STORE``, else the embedded default)."""
    if given is not None and not isinstance(given, str):
        return given
    from idemctl.stores import open_store

    return open_store(_url(given))


def opened_async(given: str | Store | AsyncStore | None) -> AsyncStore:
    """The async store an ASGI middleware was given: an async store as it is, a sync one
    wrapped, else the one at the URL."""
    from idemctl import aio

    if isinstance(given, aio.AsyncStore):
        return given
    if given is not None and not isinstance(given, str):
        return aio.wrap(given)
    return aio.open_store(_url(given))
