"""The ``Idempotency-Key`` middleware for ASGI apps (Starlette, FastAPI, Litestar, ...).

    from idemctl.http.asgi import IdempotencyMiddleware
    app = IdempotencyMiddleware(app, store="redis://127.0.0.1:6379/0")
    # Starlette and FastAPI: app.add_middleware(IdempotencyMiddleware, store=...)

A guarded request's body is read whole (for its fingerprint), the key claimed, the app run
with the attempt in ``scope["state"]["idempotency"]``, and its response buffered up to
``max_body``: stored, then sent, before the app's background work runs. A client's hang-up
neither reaches the app nor frees the key. What is guarded and answered is
``idemctl.http.policy``'s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from idemctl.http import policy
from idemctl.http.attempt_aio import Produced, attempt, body_limit
from idemctl.http.policy import Attempt, Options, Problem, Request, Response, Streamed
from idemctl.http.stats import STATS
from idemctl.http.tracing import observed

if TYPE_CHECKING:
    from idemctl.stores.base import Store
    from idemctl.stores.base_async import AsyncStore

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
        headers, fields = _headers(scope["headers"], self.options.header.lower())
        key = policy.key_of(self.options, headers.get(self.options.header.lower()), fields)
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
        query = bytes(scope.get("query_string", b"")).decode("latin-1")
        request = Request(scope["method"].upper(), path, headers, query)
        guarded = policy.guarded(self.options, request, key, body)
        # The request runs to its end in a task of its own: a server that cancels the
        # request when its client hangs up cancels the wait here, not the app, and the key
        # is completed (or released) when the app really ends.
        flow = asyncio.ensure_future(self._guarded(scope, receive, send, guarded, body, started))
        _RUNNING.add(flow)
        flow.add_done_callback(_RUNNING.discard)
        await asyncio.shield(flow)

    async def _guarded(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        guarded: policy.Guarded,
        body: bytes,
        started: float,
    ) -> None:
        store = self.store
        capture = _Capture(send, body_limit(self.options, store))
        running: asyncio.Task[None] | None = None
        try:
            with observed(guarded, started) as seen:

                async def run_app(a: Attempt) -> Produced:
                    nonlocal running
                    app_started = time.perf_counter()
                    state = dict(scope.get("state") or {})
                    state["idempotency"] = a
                    scoped = {**scope, "state": state}
                    running = asyncio.ensure_future(
                        self.app(scoped, _receive(body, receive, capture), capture)
                    )
                    running.add_done_callback(capture.settle)
                    try:  # until the response has ended, or the app did first
                        await capture.settled
                    finally:
                        seen.app_seconds = time.perf_counter() - app_started
                    if not capture.ended.is_set():  # the app ended before its response did
                        running.result()  # its exception, if it raised
                        raise RuntimeError("the app returned without sending a whole response")
                    return capture.produced()

                result = await attempt(store, self.options, guarded, run_app)
                outcome, response = policy.answer(
                    self.options, result, datetime.now(UTC), guarded.request, seen.typical()
                )
                if capture.streaming:
                    if capture.last is not None:  # its end, now that the key is completed
                        await send(capture.last)
                elif response is not None:
                    await _send(send, response)
                seen.ended(outcome)
        finally:
            # The app's last send returns only now: its background work (Starlette's
            # BackgroundTasks) runs after the response was stored and sent, and what it
            # does or raises changes neither.
            capture.sent.set()
            if running is not None:
                await running


_RUNNING: set[asyncio.Future[None]] = set()
"""Requests under way whose server stopped waiting for them: held here until they end."""


def _headers(raw: list[tuple[bytes, bytes]], counted: str) -> tuple[dict[str, str], int]:
    """The request's headers by lower-case name (repeated ones joined with ``, ``), and how
    many fields named ``counted`` it has."""
    headers: dict[str, str] = {}
    fields = 0
    for name, value in raw:
        k, v = name.decode("latin-1").lower(), value.decode("latin-1")
        headers[k] = f"{headers[k]}, {v}" if k in headers else v
        fields += k == counted
    return headers, fields


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


def _receive(body: bytes, receive: Receive, capture: _Capture) -> Receive:
    """A ``receive`` that gives the app the body read already, then nothing until its
    response has ended: a client's hang-up reaches the app only then, so no framework
    cancels a request its key is held for (Django under ASGI would)."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if given:
            await capture.ended.wait()
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


def _ends(message: Message) -> bool:
    """Whether ``message`` is the last of a response."""
    kind: str = message["type"]
    if kind == "http.response.body":
        return not bool(message.get("more_body", False))
    if kind == "http.response.trailers":
        return not bool(message.get("more_trailers", False))
    return kind == "http.response.pathsend"


class _Capture:
    """The app's ``send``: buffers its response up to ``limit`` bytes of body; ``ended`` is
    set once its last message came. Past the limit (or at a message it does not know, such
    as trailers) the response goes to the client as it comes, and is not stored whole; its
    last message (``last``) is held back until the key is completed, so a client that has
    the whole response never finds its key held."""

    def __init__(self, send: Send, limit: int) -> None:
        self._send, self._limit = send, limit
        self._start: Message | None = None
        self._chunks: list[bytes] = []
        self._size = 0
        self.streaming = False
        self.last: Message | None = None
        self.ended = asyncio.Event()
        """Set when the app has sent its response's last message."""
        self.settled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Done when the response has ended, or the app did before it."""
        self.sent = asyncio.Event()
        """Set when the response was stored (or not) and sent: the app's last send waits
        for it, as a server's send returns once the response went out."""

    def settle(self, *_: object) -> None:
        if not self.settled.done():
            self.settled.set_result(None)

    async def __call__(self, message: Message) -> None:
        if self.ended.is_set():
            raise RuntimeError(f"the app sent {message['type']!r} after its response ended")
        await self._capture(message)
        if self.ended.is_set():
            self.settle()
            await self.sent.wait()

    async def _capture(self, message: Message) -> None:
        kind = message["type"]
        ends = _ends(message)
        if kind == "http.response.body":
            self._size += len(message.get("body", b""))
        if self.streaming:
            if ends:
                self.last = message
                self.ended.set()
            else:
                await self._send(message)
            return
        if kind == "http.response.start" and not message.get("trailers"):
            self._start = message
            return
        if kind == "http.response.body":
            self._chunks.append(bytes(message.get("body", b"")))
            if self._size > self._limit:
                await self._stream()
                if ends:
                    self.last = {"type": "http.response.body", "body": b"", "more_body": False}
            if ends:
                self.ended.set()
            return
        await self._stream()
        if ends:
            self.last = message
            self.ended.set()
        else:
            await self._send(message)

    async def _stream(self) -> None:
        self.streaming = True
        if self._start is not None:
            await self._send(self._start)
        body = b"".join(self._chunks)
        self._chunks = []
        if body:
            await self._send({"type": "http.response.body", "body": body, "more_body": True})

    def _head(self) -> tuple[int, list[tuple[str, str]]]:
        if self._start is None:
            raise RuntimeError("the app returned without starting a response")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in self._start["headers"]]
        return int(self._start["status"]), headers

    def produced(self) -> Produced:
        """The buffered response, or what was sent of it as it streamed."""
        status, headers = self._head()
        if self.streaming:
            return Streamed(status, headers, self._size)
        return Response(status, headers, b"".join(self._chunks))
