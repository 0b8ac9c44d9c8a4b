"""The ``Idempotency-Key`` middleware for ASGI apps (Starlette, FastAPI, Litestar, ...).

    from idemctl.http.asgi import IdempotencyMiddleware
    app = IdempotencyMiddleware(app, store="redis://127.0.0.1:6379/0")
    # Starlette and FastAPI: app.add_middleware(IdempotencyMiddleware, store=...)

A guarded request's body is read whole (for its fingerprint), the key claimed, the app run
with the attempt in ``scope["state"]["idempotency"]``, and its response buffered up to
``max_body``: stored, then sent. What is guarded and answered is ``idemctl.http.policy``'s.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from idemctl.http import policy
from idemctl.http.attempt_aio import attempt
from idemctl.http.policy import Attempt, Options, Problem, Request, Response
from idemctl.http.stats import STATS
from idemctl.http.tracing import observed

if TYPE_CHECKING:
    from idemctl.aio.store import AsyncStore
    from idemctl.stores.base import Store

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[
    [Any, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]
]
"""Any ASGI app, typed as loosely as Starlette's ``Middleware`` passes one."""


class IdempotencyMiddleware:
    """Guards ``app``'s requests with ``Idempotency-Key`` on ``store`` (a URL, a store or
    an async store; None: ``$IDEMCTL_STORE``, else the embedded SQLite default), as
    ``options`` say (``idemctl.http.Options``: the defaults of docs/guides/http.md)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        store: str | Store | AsyncStore | None = None,
        options: Options | None = None,
    ) -> None:
        self.app = app
        self.options = options if options is not None else Options()
        self._given = store
        self._store: AsyncStore | None = None

    @property
    def store(self) -> AsyncStore:
        """The async store, opened on the first guarded request (it connects then)."""
        if self._store is None:
            from idemctl.http import opened_async

            self._store = opened_async(self._given)
        return self._store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = policy.request_path(scope["path"].encode())
        if not self.options.guards(scope["method"], path):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        headers = _headers(scope["headers"])
        key = policy.key_of(self.options, headers.get(self.options.header.lower()))
        if key is None:
            await self.app(scope, receive, send)
            return
        if isinstance(key, Problem):
            await _send(send, key.response(self.options))
            STATS.count(key.outcome, time.perf_counter() - started)
            return
        body = await _read_body(receive)
        if body is None:
            return  # the client went away before sending its body: nothing to run
        request = Request(scope["method"].upper(), path, headers)
        guarded = policy.guarded(self.options, request, key, body)
        capture = _Capture(send, self.options.max_body)
        with observed(guarded, started) as seen:

            async def run_app(a: Attempt) -> Response | None:
                app_started = time.perf_counter()
                state = dict(scope.get("state") or {})
                state["idempotency"] = a
                try:
                    await self.app({**scope, "state": state}, _replayed(body, receive), capture)
                finally:
                    seen.app_seconds = time.perf_counter() - app_started
                return await capture.response()

            result = await attempt(self.store, self.options, guarded, run_app)
            outcome, response = policy.answer(self.options, result, datetime.now(UTC))
            if response is not None:
                await _send(send, response)
            elif capture.last is not None:  # streamed: its end, now that the key is released
                await send(capture.last)
            seen.ended(outcome)


def _headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in raw:
        k, v = name.decode("latin-1").lower(), value.decode("latin-1")
        headers[k] = f"{headers[k]}, {v}" if k in headers else v
    return headers


async def _read_body(receive: Receive) -> bytes | None:
    """The request's whole body; None when the client disconnected first."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replayed(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the app the body read already, then the server's own
    (which says when the client disconnects)."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _send(send: Send, response: Response) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": response.status,
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers],
        }
    )
    await send({"type": "http.response.body", "body": response.body, "more_body": False})


class _Capture:
    """The app's ``send``: buffers its response up to ``limit`` bytes of body. Past the
    limit (or at a message it does not know, such as trailers) the response goes to the
    client as it comes, and is not stored; its last message (``last``) is held back until
    the key is released, so a client that has the whole response never finds its key held."""

    def __init__(self, send: Send, limit: int) -> None:
        self._send, self._limit = send, limit
        self._start: Message | None = None
        self._chunks: list[bytes] = []
        self._size = 0
        self.streaming = False
        self.last: Message | None = None

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        ends = kind == "http.response.body" and not message.get("more_body", False)
        if self.streaming:
            if ends:
                self.last = message
            else:
                await self._send(message)
            return
        if kind == "http.response.start" and not message.get("trailers"):
            self._start = message
            return
        if kind == "http.response.body":
            body = bytes(message.get("body", b""))
            self._chunks.append(body)
            self._size += len(body)
            if self._size > self._limit:
                await self._stream()
                if ends:
                    self.last = {"type": "http.response.body", "body": b"", "more_body": False}
            return
        await self._stream()
        await self._send(message)

    async def _stream(self) -> None:
        self.streaming = True
        if self._start is not None:
            await self._send(self._start)
        body = b"".join(self._chunks)
        self._chunks = []
        if body:
            await self._send({"type": "http.response.body", "body": body, "more_body": True})

    async def response(self) -> Response | None:
        """The buffered response, None when it was streamed."""
        if self.streaming:
            return None
        if self._start is None:
            raise RuntimeError("the app returned without starting a response")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self._start["headers"]]
        return Response(self._start["status"], headers, b"".join(self._chunks))
