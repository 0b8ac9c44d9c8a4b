"""tests/http/tx_app.py's app under WSGI: Flask, the attempt's connection psycopg's sync one."""

from __future__ import annotations

import os

from flask import Flask, Response, jsonify, request

from idemctl.http import Options
from idemctl.http.wsgi import ATTEMPT, IdempotencyMiddleware
from tests.http.payments import insert

app = Flask(__name__)


@app.post("/payments")
def payments() -> tuple[Response, int]:
    attempt = request.environ[ATTEMPT]
    amount = request.get_json(force=True)["amount"]
    attempt.connection.execute(insert(), (attempt.key, amount))
    if request.args.get("raise"):
        raise RuntimeError("the app broke after its insert")
    if request.args.get("fail"):
        return jsonify({"error": "declined"}), 500
    return jsonify({"key": attempt.key, "amount": amount}), 201


app.wsgi_app = IdempotencyMiddleware(  # type: ignore[method-assign]
    app.wsgi_app, store=os.environ["IDEMCTL_STORE"], options=Options(transactional=True)
)
