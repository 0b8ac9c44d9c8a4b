"""The example ASGI app (examples/http/asgi_app.py's routes) three ways, for
benchmarks/http_overhead.py: ``$BENCH_APP`` is ``plain`` (no middleware), ``idemctl``
(idemctl.http.asgi on ``$IDEMCTL_STORE``) or ``peer`` (asgi-idempotency-header 0.2.0's
middleware with its Redis backend on ``$PEER_REDIS``)."""

from __future__ import annotations

import os

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from examples.http.asgi_app import charges

routes = [Route("/charges", charges, methods=["POST"])]
which = os.environ.get("BENCH_APP", "plain")
middleware: list[Middleware] = []
if which == "idemctl":
    from idemctl.http.asgi import IdempotencyMiddleware

    middleware = [Middleware(IdempotencyMiddleware, store=os.environ["IDEMCTL_STORE"])]
elif which == "peer":
    from idempotency_header_middleware import IdempotencyHeaderMiddleware
    from idempotency_header_middleware.backends.redis import RedisBackend
    from redis.asyncio import Redis

    backend = RedisBackend(Redis.from_url(os.environ["PEER_REDIS"]))
    # A dataclass of positional fields, which Starlette's Middleware type does not take.
    middleware = [Middleware(IdempotencyHeaderMiddleware, backend=backend)]  # type: ignore[arg-type]


async def _no_state(scope, receive, send):  # type: ignore[no-untyped-def]
    """The plain app and the peer's give the route no attempt: an empty one, as a route
    written for idemctl reads ``request.state.idempotency``."""
    scope.setdefault("state", {}).setdefault("idempotency", None)
    await inner(scope, receive, send)


inner = Starlette(routes=routes, middleware=middleware)
app = inner if which == "idemctl" else _no_state
