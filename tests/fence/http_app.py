"""An API behind idemctl's ASGI middleware whose charge is a call to another service, fenced
(``request.state.idempotency.fence`` sent as headers, a refusal raised as StaleFence), for
tests/fence/test_http_takeover.py:

    IDEMCTL_STORE=... SERVICE_URL=http://... uvicorn tests.fence.http_app:app

``POST /pay`` with ``x-hold: 1`` first touches ``$INSIDE`` and waits for ``$GO`` to exist
(work that takes long), then charges; 201 with the attempt's token.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from idemctl.fence.http import fence_headers, raise_if_stale
from idemctl.http.asgi import IdempotencyMiddleware
from idemctl.http.policy import Options


async def pay(request: Request) -> JSONResponse:
    attempt = request.state.idempotency
    if request.headers.get("x-hold"):
        Path(os.environ["INSIDE"]).touch()
        while not Path(os.environ["GO"]).exists():
            await asyncio.sleep(0.01)
    async with httpx.AsyncClient(base_url=os.environ["SERVICE_URL"], timeout=30) as client:
        answer = await client.post(f"/charges/{attempt.key}", headers=fence_headers(attempt.fence))
    raise_if_stale(answer)  # this attempt lost its key: the middleware answers for it
    answer.raise_for_status()
    return JSONResponse({"charged": attempt.key, "token": attempt.fencing_token}, status_code=201)


app = Starlette(
    routes=[Route("/pay", pay, methods=["POST"])],
    middleware=[
        Middleware(
            IdempotencyMiddleware,
            store=os.environ["IDEMCTL_STORE"],
            options=Options(lease=float(os.environ.get("IDEMCTL_LEASE", "1"))),
        )
    ],
)
