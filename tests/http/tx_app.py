"""A Starlette app whose SQL commits with its stored response: the ASGI middleware in
transactional mode on PostgreSQL. ``POST /payments`` inserts one row (the key and the
amount) into the table ``$PAYMENTS`` on the attempt's connection, then answers 201; with
``?fail=1`` it answers 500 after the insert, with ``?raise=1`` it raises after it."""

from __future__ import annotations

import json
import os

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from idemctl.http import Options
from idemctl.http.asgi import IdempotencyMiddleware
from tests.http.payments import insert


async def payments(request: Request) -> Response:
    attempt = request.state.idempotency
    amount = json.loads(await request.body())["amount"]
    await attempt.connection.execute(insert(), (attempt.key, amount))
    if request.query_params.get("raise"):
        raise RuntimeError("the app broke after its insert")
    if request.query_params.get("fail"):
        return JSONResponse({"error": "declined"}, status_code=500)
    return JSONResponse({"key": attempt.key, "amount": amount}, status_code=201)


app = Starlette(
    routes=[Route("/payments", payments, methods=["POST"])],
    middleware=[
        Middleware(
            IdempotencyMiddleware,
            store=os.environ["IDEMCTL_STORE"],
            options=Options(transactional=True),
        )
    ],
)
