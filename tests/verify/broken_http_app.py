"""A payments API that is not idempotent, for ``idemctl verify --http`` to fail: Starlette
without idemctl's middleware. ``POST /charges`` charges every request (a line in ``$LEDGER``)
and answers 201 with a new charge id, whatever its ``Idempotency-Key``; ``POST /fail``
answers 500 and stores nothing. Run from the project root:

    LEDGER=/tmp/charges python -m uvicorn tests.verify.broken_http_app:app
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


async def charges(request: Request) -> JSONResponse:
    try:
        order = json.loads(await request.body())["order"]
    except (ValueError, KeyError, TypeError):
        return JSONResponse({"error": 'expected {"order": "<id>"}'}, status_code=400)
    with Path(os.environ.get("LEDGER", "charges.ledger")).open("a") as ledger:
        ledger.write(f"{order}\n")
    return JSONResponse({"id": "ch_" + secrets.token_hex(8), "order": order}, status_code=201)


async def fail(request: Request) -> JSONResponse:
    return JSONResponse({"error": "the payment provider timed out"}, status_code=500)


app = Starlette(
    routes=[Route("/charges", charges, methods=["POST"]), Route("/fail", fail, methods=["POST"])]
)
