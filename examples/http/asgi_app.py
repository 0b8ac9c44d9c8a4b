"""An ASGI payments API guarded by ``Idempotency-Key``: Starlette, with idemctl's ASGI
middleware. From the project root:

    IDEMCTL_STORE=redis://127.0.0.1:6379/0 LEDGER=/tmp/charges \\
        python -m uvicorn examples.http.asgi_app:app

    curl -X POST localhost:8000/charges -H 'Idempotency-Key: "k1"' \\
        -H 'Content-Type: application/json' -d '{"order": "o-1", "amount": 500}'

Send it twice: the second answer is the first one, byte for byte, with
``Idempotent-Replayed: true``, and the ledger has one line.

The other routes are what tests/http/test_findings.py tries a user's cases with (each
charges ``order``, one ledger line, unless said):

- ``POST /background?bg=S&bg_fail=1``: answers 201, then (a Starlette background task)
  sleeps S seconds, writes the line ``bg:<order>`` and, with ``bg_fail=1``, raises.
- ``POST /gz/report``: 201 with about 2 KB of JSON, through Starlette's ``GZipMiddleware``
  mounted inside the idemctl middleware (the other routes are not compressed).
- ``POST /upload``: a ``multipart/form-data`` form, the field ``order`` and a ``file``;
  201 with the file's size.
- ``POST /query-charges?amount=N``: ``{"order": ...}``, the amount from the query string.
- ``POST /big?size=N`` (``&chunk=K``: streamed in K-byte chunks): 201 with N bytes.
- ``POST /validated``: 422 (FastAPI's shape) for a body without ``order``, before charging.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.datastructures import UploadFile
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route

from examples.http.charges import BadCharge, Flaky, charge, parsed, settings
from idemctl.http.asgi import IdempotencyMiddleware


async def charges(request: Request) -> Response:
    try:
        order, amount = parsed(json.loads(await request.body()))
    except (ValueError, BadCharge) as exc:
        return JSONResponse({"error": str(exc)}, status_code=400)
    delay = float(request.headers.get("x-delay") or request.query_params.get("delay") or 0)
    attempt = request.state.idempotency
    try:  # the charge blocks (a file lock, a sleep): a thread, as a real client call would
        done = await asyncio.to_thread(charge, order, amount, delay, attempt)
    except Flaky as exc:
        return JSONResponse({"error": str(exc)}, status_code=500)
    return JSONResponse(done, status_code=201)


async def export(request: Request) -> Response:
    """A streamed response: ``chunks`` chunks of ``size`` bytes each."""
    chunks, size = int(request.query_params["chunks"]), int(request.query_params["size"])

    async def parts() -> AsyncIterator[bytes]:
        for i in range(chunks):
            yield bytes([65 + i % 26]) * size
            await asyncio.sleep(0)

    return StreamingResponse(parts(), status_code=201, media_type="application/octet-stream")


def _order(body: Any) -> str:
    """The ``order`` of a JSON body (``{"order": "<id>"}``); BadCharge for another body."""
    if not isinstance(body, dict) or not isinstance(body.get("order"), str) or not body["order"]:
        raise BadCharge('expected {"order": "<id>"}')
    order: str = body["order"]
    return order


async def _charged(request: Request, order: str, amount: int) -> dict[str, Any]:
    return await asyncio.to_thread(charge, order, amount, 0, request.state.idempotency)


def later(order: str, seconds: float, fail: bool) -> None:
    """The background work of ``/background``: a wait, the line ``bg:<order>``, maybe a
    failure (after the client has its response)."""
    time.sleep(seconds)
    charge(f"bg:{order}", 0, 0, None)
    if fail:
        raise RuntimeError(f"order {order}: the background work failed")


async def background(request: Request) -> Response:
    order = _order(json.loads(await request.body()))
    seconds = float(request.query_params.get("bg", 0))
    fail = request.query_params.get("bg_fail") == "1"
    done = await _charged(request, order, 0)
    return JSONResponse(done, 201, background=BackgroundTask(later, order, seconds, fail))


async def report(request: Request) -> Response:
    """About 2 KB of JSON: compressed by the GZipMiddleware of ``/gz``."""
    order = _order(json.loads(await request.body()))
    done = await _charged(request, order, 0)
    lines = [{"line": i, "text": f"item {i} of order {order}"} for i in range(40)]
    return JSONResponse({**done, "lines": lines}, 201)


async def upload(request: Request) -> Response:
    async with request.form() as form:
        order, file = form.get("order"), form.get("file")
        if not isinstance(order, str) or not order or not isinstance(file, UploadFile):
            return JSONResponse({"error": "expected the fields order and file"}, 400)
        size = len(await file.read())
    done = await _charged(request, order, size)
    return JSONResponse({**done, "size": size}, 201)


async def query_charges(request: Request) -> Response:
    order = _order(json.loads(await request.body()))
    done = await _charged(request, order, int(request.query_params["amount"]))
    return JSONResponse(done, 201)


async def big(request: Request) -> Response:
    """``size`` bytes after one charge: one body, or (``chunk``) streamed in chunks."""
    order = _order(json.loads(await request.body()))
    size, chunk = int(request.query_params["size"]), int(request.query_params.get("chunk", 0))
    await _charged(request, order, size)
    if not chunk:
        return Response(b"b" * size, 201, media_type="application/octet-stream")

    async def parts() -> AsyncIterator[bytes]:
        for start in range(0, size, chunk):
            yield b"b" * min(chunk, size - start)
            await asyncio.sleep(0)

    return StreamingResponse(parts(), status_code=201, media_type="application/octet-stream")


async def validated(request: Request) -> Response:
    """FastAPI's own validation failure, before the endpoint charges: 422."""
    body = json.loads(await request.body() or b"null")
    if not isinstance(body, dict) or not isinstance(body.get("order"), str):
        missing = {"type": "missing", "loc": ["body", "order"], "msg": "Field required"}
        return JSONResponse({"detail": [missing]}, 422)
    return JSONResponse(await _charged(request, body["order"], int(body.get("amount", 0))), 201)


async def bad_charge(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": str(exc)}, status_code=400)


gzipped = Starlette(
    routes=[Route("/report", report, methods=["POST"])],
    middleware=[Middleware(GZipMiddleware, minimum_size=256)],
    exception_handlers={BadCharge: bad_charge},
)
"""``/gz``: GZip inside the idemctl middleware (it sees the compressed response)."""

store, options = settings()
app = Starlette(
    routes=[
        Route("/charges", charges, methods=["POST"]),
        Route("/export", export, methods=["POST"]),
        Route("/background", background, methods=["POST"]),
        Route("/upload", upload, methods=["POST"]),
        Route("/query-charges", query_charges, methods=["POST"]),
        Route("/big", big, methods=["POST"]),
        Route("/validated", validated, methods=["POST"]),
        Mount("/gz", app=gzipped),
    ],
    exception_handlers={BadCharge: bad_charge},
    middleware=[Middleware(IdempotencyMiddleware, store=store, options=options)],
)
