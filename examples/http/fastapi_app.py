"""A FastAPI payments API with per-route ``Idempotency-Key``: ``IdempotentRoute`` and the
``idempotent`` decorator (idemctl's ASGI middleware around the marked routes only). From
the project root:

    IDEMCTL_STORE=redis://127.0.0.1:6379/0 LEDGER=/tmp/charges \\
        python -m uvicorn examples.http.fastapi_app:app

- ``POST /charges`` (``?delay=S`` or ``X-Delay: S`` sleeps first): ``{"order": str,
  "amount": int}``, a pydantic model, so a bad body gets FastAPI's own 422 before the
  endpoint runs (not stored: the corrected body with the same key runs);
- ``POST /export?chunks=N&size=K``: a streamed response, guarded too (the same store);
- ``POST /notes``: not marked, not guarded.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field, StrictInt

from examples.http.charges import Flaky, charge, settings
from idemctl.http.fastapi import IdempotentRoute, idempotent


class Charge(BaseModel):
    order: str = Field(min_length=1)
    amount: StrictInt


store, options = settings()
router = APIRouter(route_class=IdempotentRoute)


@router.post("/charges", status_code=201)
@idempotent(store, options=options)
async def charges(body: Charge, request: Request, delay: float = 0) -> Any:
    seconds = float(request.headers.get("x-delay") or delay)
    attempt = request.state.idempotency
    try:  # the charge blocks (a file lock, a sleep): a thread, as a real client call would
        return await asyncio.to_thread(charge, body.order, body.amount, seconds, attempt)
    except Flaky as exc:
        return JSONResponse({"error": str(exc)}, status_code=500)


@router.post("/export")
@idempotent(store, options=options)
async def export(chunks: int, size: int) -> Response:
    """A streamed response: ``chunks`` chunks of ``size`` bytes each."""

    async def parts() -> AsyncIterator[bytes]:
        for i in range(chunks):
            yield bytes([65 + i % 26]) * size
            await asyncio.sleep(0)

    return StreamingResponse(parts(), status_code=201, media_type="application/octet-stream")


@router.post("/notes")
async def notes(request: Request) -> dict[str, str]:
    """Not marked: no key needed, each call runs."""
    return {"note": (await request.body()).decode()}


app = FastAPI()
app.include_router(router)
