"""The ``Idempotency-Key`` middleware for WSGI apps (Flask, Django, any PEP 3333 app).

    from idemctl.http.wsgi import IdempotencyMiddleware
    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, store="redis://127.0.0.1:6379/0")

The same policy as the ASGI middleware (``idemctl.http.policy``); the app finds the
attempt in ``environ["idemctl.attempt"]``. Safe under threads and forked workers: the
store is opened in each process on its first guarded request.
"""

from __future__ import annotations

import io
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from idemctl.http import policy
from idemctl.http.attempt import attempt
from idemctl.http.policy import Attempt, Options, Problem, Request, Response
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
        guarded = policy.guarded(self.options, Request(method, path, headers), key, body)
        status_text = ""
        streamed: Iterable[bytes] = ()
        with observed(guarded, started) as seen:

            def run_app(a: Attempt) -> Response | None:
                nonlocal status_text, streamed
                app_started = time.perf_counter()
                environ[ATTEMPT] = a
                environ["wsgi.input"] = io.BytesIO(body)
                environ["CONTENT_LENGTH"] = str(len(body))
                try:
                    response, status_text, streamed = _run(
                        self.app, environ, start_response, self.options.max_body
                    )
                finally:
                    seen.app_seconds = time.perf_counter() - app_started
                return response

            result = attempt(self.store, self.options, guarded, run_app)
            outcome, response = policy.answer(self.options, result, datetime.now(UTC))
            seen.ended(outcome)
        if response is None:
            return streamed
        return _send(start_response, response, status_text)


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


def _run(
    app: WSGIApp, environ: Environ, start_response: StartResponse, limit: int
) -> tuple[Response | None, str, Iterable[bytes]]:
    """Run the app: its response buffered whole with its status line, or, past ``limit``
    bytes of body, None and the response to stream (its headers given to the server)."""
    started: list[Any] = []
    chunks: list[bytes] = []

    def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        if exc_info is not None and started:
            raise exc_info[1].with_traceback(exc_info[2])
        started[:] = [status, headers]
        return chunks.append  # the legacy write(): buffered as the rest

    result = app(environ, capture)
    body = iter(result)
    size = sum(map(len, chunks))
    try:
        for chunk in body:
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                start_response(*started)
                return None, started[0], _Streamed(itertools.chain(chunks, body), result)
    except BaseException:
        _close(result)
        raise
    _close(result)
    if not started:
        raise RuntimeError("the app returned without calling start_response")
    status, headers = started
    return Response(int(status[:3]), list(headers), b"".join(chunks)), status, ()


def _close(result: Iterable[bytes]) -> None:
    close = getattr(result, "close", None)
    if close is not None:
        close()


class _Streamed:
    """A response too big to store, sent as the app gives it; closes the app's iterable."""

    def __init__(self, chunks: Iterator[bytes], result: Iterable[bytes]) -> None:
        self._chunks, self._result = chunks, result

    def __iter__(self) -> Iterator[bytes]:
        return self._chunks

    def close(self) -> None:
        _close(self._result)
