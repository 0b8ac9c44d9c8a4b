"""A WSGI payments API guarded by ``Idempotency-Key``: Flask, with idemctl's WSGI
middleware. From the project root:

    IDEMCTL_STORE=redis://127.0.0.1:6379/0 LEDGER=/tmp/charges \\
        python -m gunicorn -w 2 --threads 8 examples.http.wsgi_app:app

The same API as ``examples/http/asgi_app.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

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
    delay = float(request.args.get("delay", 0))
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


store, options = settings()
app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, store=store, options=options)  # type: ignore[method-assign]
