"""A WSGI payments API guarded by ``Idempotency-Key``: Flask, with idemctl's WSGI
middleware. From the project root:

    IDEMCTL_STORE=redis://127.0.0.1:6379/0 LEDGER=/tmp/charges \\
        python -m gunicorn -w 2 --threads 8 examples.http.wsgi_app:app

The same API as ``examples/http/asgi_app.py``, its test routes included; ``/gz/report``
is compressed by ``Gzipped`` (Flask has no gzip of its own), inside the idemctl middleware.
"""

from __future__ import annotations

import gzip
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import BadRequest

from examples.http.charges import BadCharge, Flaky, charge, parsed, settings
from idemctl.http.wsgi import ATTEMPT, IdempotencyMiddleware

app = Flask(__name__)


@app.post("/charges")
def charges() -> tuple[Response, int]:
    try:
        order, amount = parsed(request.get_json(force=True, silent=False))
    except BadRequest as exc:  # no JSON
        return jsonify({"error": exc.description}), 400
    except BadCharge as exc:
        return jsonify({"error": str(exc)}), 400
    delay = float(request.headers.get("x-delay") or request.args.get("delay") or 0)
    try:
        done = charge(order, amount, delay, request.environ.get(ATTEMPT))
    except Flaky as exc:
        return jsonify({"error": str(exc)}), 500
    return jsonify(done), 201


@app.post("/export")
def export() -> Response:
    """A streamed response: ``chunks`` chunks of ``size`` bytes each."""
    chunks, size = int(request.args["chunks"]), int(request.args["size"])

    def parts() -> Iterator[bytes]:
        for i in range(chunks):
            yield bytes([65 + i % 26]) * size

    return Response(parts(), status=201, mimetype="application/octet-stream")


def _order() -> str:
    """The ``order`` of the request's JSON body (``{"order": "<id>"}``)."""
    body = request.get_json(force=True, silent=True)
    if not isinstance(body, dict) or not isinstance(body.get("order"), str) or not body["order"]:
        raise BadCharge('expected {"order": "<id>"}')
    order: str = body["order"]
    return order


def _charged(order: str, amount: int) -> dict[str, Any]:
    return charge(order, amount, 0, request.environ.get(ATTEMPT))


def later(order: str, seconds: float, fail: bool) -> None:
    """The background work of ``/background``: a wait, the line ``bg:<order>``, maybe a
    failure (after the client has its response)."""
    time.sleep(seconds)
    charge(f"bg:{order}", 0, 0, None)
    if fail:
        raise RuntimeError(f"order {order}: the background work failed")


@app.post("/background")
def background() -> tuple[Response, int]:
    """201, then the work in ``call_on_close``: run once the server closes the response."""
    order = _order()
    seconds, fail = float(request.args.get("bg", 0)), request.args.get("bg_fail") == "1"
    response = jsonify(_charged(order, 0))
    response.call_on_close(lambda: later(order, seconds, fail))
    return response, 201


@app.post("/gz/report")
def report() -> tuple[Response, int]:
    """About 2 KB of JSON: compressed by ``Gzipped``."""
    order = _order()
    lines = [{"line": i, "text": f"item {i} of order {order}"} for i in range(40)]
    return jsonify({**_charged(order, 0), "lines": lines}), 201


@app.post("/upload")
def upload() -> tuple[Response, int]:
    order, file = request.form.get("order"), request.files.get("file")
    if not order or file is None:
        return jsonify({"error": "expected the fields order and file"}), 400
    size = len(file.read())
    return jsonify({**_charged(order, size), "size": size}), 201


@app.post("/query-charges")
def query_charges() -> tuple[Response, int]:
    return jsonify(_charged(_order(), int(request.args["amount"]))), 201


@app.post("/big")
def big() -> Response:
    """``size`` bytes after one charge: one body, or (``chunk``) streamed in chunks."""
    order = _order()
    size, chunk = int(request.args["size"]), int(request.args.get("chunk", 0))
    _charged(order, size)
    if not chunk:
        return Response(b"b" * size, status=201, mimetype="application/octet-stream")

    def parts() -> Iterator[bytes]:
        for start in range(0, size, chunk):
            yield b"b" * min(chunk, size - start)

    return Response(parts(), status=201, mimetype="application/octet-stream")


@app.post("/validated")
def validated() -> tuple[Response, int]:
    """A framework's validation failure (FastAPI's shape), before the endpoint charges: 422."""
    body = request.get_json(force=True, silent=True)
    if not isinstance(body, dict) or not isinstance(body.get("order"), str):
        missing = {"type": "missing", "loc": ["body", "order"], "msg": "Field required"}
        return jsonify({"detail": [missing]}), 422
    return jsonify(_charged(body["order"], int(body.get("amount", 0)))), 201


WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class Gzipped:
    """Compresses the responses of ``app`` under ``prefix`` for a client that accepts gzip
    (``minimum_size`` bytes and more), with ``Vary: Accept-Encoding``, as Starlette's
    ``GZipMiddleware`` does; other paths pass through untouched."""

    def __init__(self, app: WSGIApp, prefix: str, minimum_size: int = 256) -> None:
        self.app, self.prefix, self.minimum_size = app, prefix, minimum_size

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if not environ.get("PATH_INFO", "").startswith(self.prefix):
            return self.app(environ, start_response)
        started: list[Any] = []
        chunks: list[bytes] = []

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            started[:] = [status, headers]
            return chunks.append

        result = self.app(environ, capture)
        try:
            chunks.extend(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        status, headers = started
        body = b"".join(chunks)
        headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        headers.append(("Vary", "Accept-Encoding"))
        if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", "") and len(body) >= self.minimum_size:
            body = gzip.compress(body)
            headers.append(("Content-Encoding", "gzip"))
        start_response(status, [*headers, ("Content-Length", str(len(body)))])
        return [body]


@app.errorhandler(BadCharge)
def bad_charge(exc: BadCharge) -> tuple[Response, int]:
    return jsonify({"error": str(exc)}), 400


store, options = settings()
app.wsgi_app = IdempotencyMiddleware(  # type: ignore[method-assign]
    Gzipped(app.wsgi_app, "/gz/"), store=store, options=options
)
