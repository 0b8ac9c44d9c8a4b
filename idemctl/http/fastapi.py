"""Per-route ``Idempotency-Key`` for FastAPI: the ASGI middleware
(``idemctl.http.asgi.IdempotencyMiddleware``) around the routes marked ``idempotent``, with
options of their own.

    from fastapi import APIRouter, FastAPI
    from idemctl.http.fastapi import IdempotentRoute, idempotent

    router = APIRouter(route_class=IdempotentRoute)

    @router.post("/charges", status_code=201)
    @idempotent(store="redis://127.0.0.1:6379/0", wait=10)  # Options' fields, or options=
    async def charge(request: Request, body: Charge) -> dict: ...

    app = FastAPI()
    app.include_router(router)

A marked route runs in the middleware (the one engine, ``idemctl.http.attempt_aio``) once
FastAPI has matched it: its path parameters are known, its validation (422) runs inside.
Routes not marked pass untouched. The routes given one store (the same URL, the same
store object, or none: ``$IDEMCTL_STORE``) share it, opened once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi.routing import APIRoute

from idemctl.errors import ConfigError
from idemctl.http.asgi import IdempotencyMiddleware, Receive, Scope, Send
from idemctl.http.policy import Options

if TYPE_CHECKING:
    from idemctl.stores.base import Store
    from idemctl.stores.base_async import AsyncStore

MARK = "__idemctl_http__"
"""The endpoint's attribute that holds its ``Marked``."""
SAFE = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
"""Methods a marked route does not guard unless its options name them."""

E = TypeVar("E", bound=Callable[..., Any])


@dataclass(frozen=True)
class Marked:
    """How an endpoint is guarded: its store and its options (an ``Options``, or its
    fields; ``methods`` left out: the route's own, but for ``SAFE`` ones)."""

    store: str | Store | AsyncStore | None
    options: Options | None
    fields: Mapping[str, Any]

    def options_for(self, methods: set[str] | None) -> Options:
        if self.options is not None:
            return self.options
        fields = dict(self.fields)
        if "methods" not in fields and methods:
            guarded = tuple(sorted(m for m in methods if m.upper() not in SAFE))
            if guarded:
                fields["methods"] = guarded
        return _options(fields)


def _options(fields: Mapping[str, Any]) -> Options:
    try:
        return Options(**fields)
    except TypeError as exc:  # a field Options has not
        raise ConfigError(f"idempotent(): {exc}") from exc


def idempotent(
    store: str | Store | AsyncStore | None = None,
    *,
    options: Options | None = None,
    **fields: Any,
) -> Callable[[E], E]:
    """Marks an endpoint for ``IdempotentRoute``: guarded on ``store`` (a URL, a store or
    an async store; None: ``$IDEMCTL_STORE``, else the embedded default), with ``options``
    or Options' ``fields``. Above or below the route's decorator, either works."""
    if options is not None and fields:
        raise ConfigError("idempotent() takes options= or Options' fields, not both")
    if options is None:
        _options(fields)  # a misspelt field fails at import, not at the first request
    mark = Marked(store, options, dict(fields))

    def decorate(endpoint: E) -> E:
        setattr(endpoint, MARK, mark)
        return endpoint

    return decorate


def marked(endpoint: Callable[..., Any]) -> Marked | None:
    found = getattr(endpoint, MARK, None)
    return found if isinstance(found, Marked) else None


class IdempotentRoute(APIRoute):
    """FastAPI's route, guarded when its endpoint is marked ``idempotent``:
    ``APIRouter(route_class=IdempotentRoute)``, or ``app.router.route_class`` before the
    routes are added. The guard wraps the route's handling (``handle``, after FastAPI
    matched it), not ``self.app``: a route of an included router runs an app FastAPI
    builds for the inclusion, and ``handle`` is where both meet."""

    _guard: IdempotencyMiddleware | None = None
    _looked: bool = False

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        guard = self._guarded()
        if guard is None or scope["type"] != "http" or scope["method"] not in (self.methods or ()):
            await super().handle(scope, receive, send)  # 405 and the rest: the route's own
            return
        await guard(scope, receive, send)

    async def _handled(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().handle(scope, receive, send)

    def _guarded(self) -> IdempotencyMiddleware | None:
        """The middleware around this route, made on its first request (the mark may
        come after the route's decorator); None when the endpoint is not marked."""
        if not self._looked:
            mark = marked(self.endpoint)
            if mark is not None:
                self._guard = IdempotencyMiddleware(
                    self._handled,
                    store=shared_store(mark.store),
                    options=mark.options_for(self.methods),
                )
            self._looked = True
        return self._guard


_STORES: dict[object, tuple[object, AsyncStore]] = {}
_OPENING = threading.Lock()


def shared_store(given: str | Store | AsyncStore | None) -> AsyncStore:
    """The one async store of the routes given ``given``: per URL (None: ``$IDEMCTL_STORE``,
    else the embedded default) or per store object, opened once (it connects on first use)."""
    from idemctl.http import opened_async
    from idemctl.stores.base_async import AsyncStore

    if isinstance(given, AsyncStore):
        return given
    if given is None or isinstance(given, str):
        from idemctl.stores import DEFAULT_URL

        given = given or os.environ.get("IDEMCTL_STORE") or DEFAULT_URL
        key: object = given
    else:
        key = id(given)
    with _OPENING:
        found = _STORES.get(key)
        if found is None:  # an object's id stays its own: the object is kept here
            found = (given, opened_async(given))
            _STORES[key] = found
        return found[1]


__all__ = ["IdempotentRoute", "Marked", "idempotent", "marked", "shared_store"]
