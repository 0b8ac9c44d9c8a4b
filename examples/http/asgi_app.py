"""An ASGI payments API guarded by ``Idempotency-Key``: Starlette, with idemctl's ASGI
middleware. From the project root:

    IDEMCTL_STORE=redis://127.0.0.1:6379/0 LEDGER=/tmp/charges \\
        python -m uvicorn examples.http.asgi_app:app

    curl -X POST localhost:8000/charges -H 'Idempotency-Key: "k1"' \\
        -H 'Content-Type: application/json' -d '{"order": "o-1", "amount": 500}'

Send it twice: the second answer is the first one, byte for byte, with
``Idempotent-Replayed: true``, and the ledger has one line.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from examples.http.charges import BadCharge, Flaky, charge, parsed, settings
from idemctl.http.asgi import IdempotencyMiddleware


async def charges(request: Request) -> Response:
    try:
        order, amount = parsed(json.loads(await request.body()))
    except (ValueError, BadCharge) as exc:
        return JSONResponse({"error": str(exc)}, status_code=400)
    delay = float(request.query_params.get("delay", 0))
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


store, options = settings()
app = Starlette(
    routes=[
        Route("/charges", charges, methods=["POST"]),
        Route("/export", export, methods=["POST"]),
    ],
    middleware=[Middleware(IdempotencyMiddleware, store=store, options=options)],
)
