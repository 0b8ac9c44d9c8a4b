"""The ``Idempotency-Key`` middleware for WSGI apps (Flask, Django, any PEP 3333 app).

    from idemctl.http.wsgi import IdempotencyMiddleware
    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, store="redis://127.0.0.1:6379/0")

The same policy as the ASGI middleware (``idemctl.http.policy``); the app finds the
attempt in ``environ["idemctl.attempt"]``. Safe under threads and forked workers: the
store is opened in each process on its first guarded request.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from idemctl.http import policy
from idemctl.http.attempt import Produced, attempt, body_limit
from idemctl.http.policy import Attempt, Options, Problem, Ran, Request, Response, Streamed
from idemctl.http.stats import STATS
from idemctl.http.tracing import observed

if TYPE_CHECKING:
    from idemctl.stores.base import Store

Environ = dict[str, Any]
StartResponse = Callable[..., Callable[[bytes], object]]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]
ATTEMPT = "idemctl.attempt"
"""The environ key the app finds its ``idemctl.http.Attempt`` under."""


class IdempotencyMiddleware:
    """Guards ``app``'s requests with ``Idempotency-Key`` on ``store`` (a URL or a store;
    None: ``$IDEMCTL_STORE``, else the embedded SQLite default), as ``options`` say
    (``idemctl.http.Options``: the defaults of docs/guides/http.md)."""

    def __init__(
        self,
        app: WSGIApp,
        *,
        store: str | Store | None = None,
        options: Options | None = None,
    ) -> None:
        self.app = app
        self.options = options if options is not None else Options()
        self._given = store
        self._store: Store | None = None
        self._opening = threading.Lock()

    @property
    def store(self) -> Store:
        """The store, opened on the first guarded request (it connects then)."""
        if self._store is None:
            with self._opening:
                if self._store is None:
                    from idemctl.http import opened

                    self._store = opened(self._given)
        return self._store

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        method = environ["REQUEST_METHOD"].upper()
        whole = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
        path = policy.request_path(whole.encode("latin-1"))
        if not self.options.guards(method, path):
            return self.app(environ, start_response)
        started = time.perf_counter()
        headers = _headers(environ)
        key = policy.key_of(self.options, headers.get(self.options.header.lower()))
        if key is None:
            return self.app(environ, start_response)
        if isinstance(key, Problem):
            STATS.count(key.outcome, time.perf_counter() - started)
            return _send(start_response, key.response(self.options))
        body = _read_body(environ)
        request = Request(method, path, headers, environ.get("QUERY_STRING", ""))
        guarded = policy.guarded(self.options, request, key, body)
        store = self.store
        run = _Run(self.app, environ, start_response, body_limit(self.options, store))
        with observed(guarded, started) as seen:

            def run_app(a: Attempt) -> Produced:
                app_started = time.perf_counter()
                environ[ATTEMPT] = a
                environ["wsgi.input"] = io.BytesIO(body)
                environ["CONTENT_LENGTH"] = str(len(body))
                try:
                    return run(a)
                finally:
                    seen.app_seconds = time.perf_counter() - app_started

            try:
                result = attempt(store, self.options, guarded, run_app)
            except BaseException:
                run.close()
                raise
            outcome, response = policy.answer(
                self.options, result, datetime.now(UTC), guarded.request, seen.typical()
            )
            seen.ended(outcome)
        # The app's iterable is closed once the server has sent the response: background
        # work there (Flask's call_on_close) runs after the response was stored and sent.
        if run.streamed or response is None:
            return _Closing([], run)
        status = run.status if isinstance(result, Ran) else ""
        return _Closing(_send(start_response, response, status), run)


def _headers(environ: Environ) -> dict[str, str]:
    headers = {
        name[5:].replace("_", "-").lower(): str(value)
        for name, value in environ.items()
        if name.startswith("HTTP_")
    }
    for name in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        if environ.get(name):
            headers[name.replace("_", "-").lower()] = environ[name]
    return headers


def _read_body(environ: Environ) -> bytes:
    stream = environ["wsgi.input"]
    length = environ.get("CONTENT_LENGTH")
    if length:
        return bytes(stream.read(int(length)))
    if environ.get("wsgi.input_terminated"):  # chunked: the server ends the stream
        return bytes(stream.read())
    return b""


def _send(start_response: StartResponse, response: Response, status: str = "") -> list[bytes]:
    start_response(status or policy.status_line(response.status), response.headers)
    return [response.body]


class _Run:
    """Runs the app once: its response buffered whole with its status line or, past
    ``limit`` bytes of body, sent to the client as it comes (through the server's
    ``write()``, so the key is completed once it has all gone). The app's iterable is
    closed by ``close()``, after the response was stored and sent."""

    def __init__(
        self, app: WSGIApp, environ: Environ, start_response: StartResponse, limit: int
    ) -> None:
        self._app, self._environ, self._start_response = app, environ, start_response
        self._limit = limit
        self._result: Iterable[bytes] | None = None
        self.status = ""
        self.streamed = False

    def __call__(self, a: Attempt) -> Produced:
        started: list[Any] = []
        chunks: list[bytes] = []

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            if exc_info is not None and started:
                raise exc_info[1].with_traceback(exc_info[2])
            started[:] = [status, headers]
            return chunks.append  # the legacy write(): buffered as the rest

        self._result = self._app(self._environ, capture)
        size = sum(map(len, chunks))
        write: Callable[[bytes], object] | None = None
        for chunk in self._result:
            size += len(chunk)
            if write is not None:
                write(chunk)
                continue
            chunks.append(chunk)
            if size > self._limit:
                self.streamed = True
                write = self._start_response(*started)
                for part in chunks:
                    write(part)
                chunks = []
        if not started:
            raise RuntimeError("the app returned without calling start_response")
        self.status, headers = started
        if self.streamed:
            return Streamed(int(self.status[:3]), list(headers), size)
        return Response(int(self.status[:3]), list(headers), b"".join(chunks))

    def close(self) -> None:
        result, self._result = self._result, None
        close = getattr(result, "close", None)
        if close is not None:
            close()


class _Closing:
    """The response's body for the server; closing it closes the app's iterable."""

    def __init__(self, body: list[bytes], run: _Run) -> None:
        self._body, self._run = body, run

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        self._run.close()
