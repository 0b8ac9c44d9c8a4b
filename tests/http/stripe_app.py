"""An imitation of Stripe's ``POST /v1/charges`` behind idemctl's middleware, for
stripe-python to talk to (tests/http/test_stripe.py): ASGI (Starlette, ``asgi``) and WSGI
(Flask, ``wsgi``), from the project root:

    IDEMCTL_STORE=redis://127.0.0.1:6379/0 LEDGER=/tmp/charges \\
        python -m uvicorn tests.http.stripe_app:asgi
    IDEMCTL_STORE=redis://127.0.0.1:6379/0 LEDGER=/tmp/charges \\
        python -m gunicorn -w 2 --threads 8 tests.http.stripe_app:wsgi

The body is Stripe's form encoding: ``amount``, ``currency``, ``source`` or ``customer``,
``metadata[order]=<id>`` (required: the ledger's line) and more ``metadata[...]``. Each
charge appends the order id to ``$LEDGER`` (examples/http/charges.py's ``charge()``, under a
file lock) and answers 200 with a Stripe-shaped charge: ``{"id": "ch_...", "object":
"charge", "amount", "currency", "metadata", ...}``. A bad request gets Stripe's error shape
(``{"error": {"type": "invalid_request_error", ...}}``) with 400. The store is
``$IDEMCTL_STORE``, the middleware's options ``$IDEMCTL_LEASE`` and ``$IDEMCTL_WAIT``
(examples/http/charges.py's ``settings()``).

Faults, chosen per request by ``metadata[fault]``:

- ``slow`` (or ``slow-before``): sleeps ``metadata[sleep]`` seconds (3 unless given), then
  charges; ``slow-after``: charges, then sleeps. Longer than the client's timeout, the
  client gives up and retries with the same key while the first request still runs.
- ``500once``: the first time the app sees the order (any process: a file beside the
  ledger, under the ledger's lock), it answers 500 (``api_error``) without charging; after
  that it charges.
- ``reset``: the app charges and answers 200 (the middleware stores that answer); then,
  the first time the order is charged so, the server resets the TCP connection instead of
  sending the answer: the client sees its connection reset by peer and not one byte of the
  response, as when a network path dies after the charge.

How the reset is made (``Reset``, outside the idemctl middleware, so the answer is stored
before the connection goes): the socket gets ``SO_LINGER`` on with a zero timeout, so that
closing it sends a RST and drops whatever is unsent; then

- under uvicorn, the connection's transport is ``abort()``-ed. The transport is found on
  the ``send`` callable uvicorn hands the app (a bound method of its request-response
  cycle, which holds ``transport``); the wrapper then returns once uvicorn has seen the
  connection lost, so uvicorn sends nothing more;
- under gunicorn, the socket (``environ["gunicorn.socket"]``) is disconnected with
  ``connect(AF_UNSPEC)`` (Linux: ``tcp_disconnect``, which sends a RST on an established
  connection) without closing its descriptor, which stays gunicorn's: its write of the
  empty answer then fails with ECONNRESET, which its worker ignores, and it closes the
  socket as usual (no descriptor is closed under it, so none is reused meanwhile).

Only on Linux; under another server the reset fault raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import io
import os
import socket
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import parse_qsl

from flask import Flask
from flask import Response as FlaskResponse
from flask import request as flask_request
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from examples.http.charges import charge, ledger, settings
from idemctl.http.asgi import IdempotencyMiddleware as AsgiIdempotency
from idemctl.http.wsgi import ATTEMPT
from idemctl.http.wsgi import IdempotencyMiddleware as WsgiIdempotency
from tests.polling import wait_until_async

DEFAULT_SLEEP = 3.0
"""Seconds a ``slow`` charge sleeps unless ``metadata[sleep]`` says."""

JSONDoc = dict[str, Any]


def form_of(body: bytes) -> dict[str, str]:
    """A form-encoded body's fields (the last of a repeated one)."""
    return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))


def metadata_of(form: dict[str, str]) -> dict[str, str]:
    """``metadata[name]=value`` fields as ``{name: value}``."""
    return {
        name[len("metadata[") : -1]: value
        for name, value in form.items()
        if name.startswith("metadata[") and name.endswith("]")
    }


def error(status: int, kind: str, message: str, param: str | None = None) -> tuple[int, JSONDoc]:
    """Stripe's error shape."""
    doc: JSONDoc = {"type": kind, "message": message}
    if param is not None:
        doc["param"] = param
    return status, {"error": doc}


def first_time(tag: str, order: str) -> bool:
    """Whether any process of the app sees (``tag``, ``order``) for the first time: a file
    beside the ledger, read and written under the ledger's lock."""
    path = ledger()
    seen = path.with_name(path.name + ".stripe-seen")
    mark = f"{tag}:{order}"
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        known = seen.read_text().split("\n") if seen.exists() else []
        if mark in known:
            return False
        with seen.open("a") as out:
            out.write(mark + "\n")
    return True


def create_charge(form: dict[str, str], attempt: Any) -> tuple[int, JSONDoc]:
    """``POST /v1/charges`` without the framework: (status, JSON). Blocks (sleeps, a file
    lock): ASGI runs it in a thread."""
    metadata = metadata_of(form)
    order = metadata.get("order", "")
    if not order:
        return error(400, "invalid_request_error", "metadata[order] is required", "metadata")
    amount = form.get("amount", "")
    if not amount.isdigit():
        return error(400, "invalid_request_error", "amount must be an integer", "amount")
    if not form.get("currency"):
        return error(400, "invalid_request_error", "currency is required", "currency")
    if not (form.get("source") or form.get("customer")):
        return error(400, "invalid_request_error", "source or customer is required", "source")
    fault = metadata.get("fault", "")
    sleep = float(metadata.get("sleep", DEFAULT_SLEEP))
    if fault == "500once" and first_time("500once", order):
        return error(500, "api_error", f"order {order}: the card network timed out")
    if fault in ("slow", "slow-before"):
        time.sleep(sleep)
    done = charge(order, int(amount), 0, attempt)
    if fault == "slow-after":
        time.sleep(sleep)
    return 200, {
        "id": done["id"],
        "object": "charge",
        "amount": int(amount),
        "currency": form["currency"],
        "customer": form.get("customer"),
        "source": form.get("source"),
        "paid": True,
        "status": "succeeded",
        "captured": True,
        "livemode": False,
        "created": int(time.time()),
        "metadata": metadata,
        "fencing_token": done["fencing_token"],
    }


def _linger_zero(sock: Any) -> None:
    """Closing (or disconnecting) ``sock`` sends a RST and drops what is unsent."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _disconnect(sock: socket.socket) -> None:
    """``connect(AF_UNSPEC)``: Linux disconnects the TCP socket (a RST to the peer), the
    descriptor left open and its owner's."""
    libc = ctypes.CDLL(None, use_errno=True)
    unspec = struct.pack("=H14x", socket.AF_UNSPEC)  # struct sockaddr, sa_family AF_UNSPEC
    if libc.connect(sock.fileno(), unspec, len(unspec)) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"connect(AF_UNSPEC): {os.strerror(code)}")


def _resets(fault: str, order: str, status: int, replayed: bool) -> bool:
    """Whether this answer is dropped with a reset: a charge's first answer of a ``reset``
    order (a replay, or a refusal, goes out)."""
    return fault == "reset" and status == 200 and not replayed and first_time("reset", order)


# ASGI ----------------------------------------------------------------------------------------


async def charges(request: Request) -> Response:
    form = form_of(await request.body())
    status, doc = await asyncio.to_thread(create_charge, form, request.state.idempotency)
    return JSONResponse(doc, status)


class Reset:
    """ASGI: the ``reset`` fault, around the middleware (see the module's docstring)."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        messages = []
        while True:  # the body, to read its fault, then handed on as it came
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")
        metadata = metadata_of(form_of(body))
        pending = iter(messages)

        async def received() -> dict[str, Any]:
            for message in pending:
                return message  # type: ignore[no-any-return]
            return await receive()  # type: ignore[no-any-return]

        if metadata.get("fault") != "reset":
            await self.app(scope, received, send)
            return
        held: list[dict[str, Any]] = []

        async def hold(message: dict[str, Any]) -> None:
            held.append(message)

        await self.app(scope, received, hold)
        start = next((m for m in held if m["type"] == "http.response.start"), None)
        status = start["status"] if start else 500
        headers = {k.lower(): v for k, v in (start or {}).get("headers", [])}
        replayed = headers.get(b"idempotent-replayed") == b"true"
        if not await asyncio.to_thread(
            _resets, "reset", metadata.get("order", ""), status, replayed
        ):
            for message in held:
                await send(message)
            return
        cycle = getattr(send, "__self__", None)  # uvicorn's RequestResponseCycle
        transport = getattr(cycle, "transport", None)
        if transport is None:
            raise RuntimeError("the reset fault needs uvicorn (its send's transport)")
        _linger_zero(transport.get_extra_info("socket"))
        transport.abort()
        # connection_lost runs soon after abort(): waited for 5 s at most, then on regardless.
        with contextlib.suppress(AssertionError):
            await wait_until_async(lambda: getattr(cycle, "disconnected", True),
                                   "connection_lost", timeout=5, interval=0.005)  # fmt: skip


store, options = settings()
asgi = Reset(
    Starlette(
        routes=[Route("/v1/charges", charges, methods=["POST"])],
        middleware=[Middleware(AsgiIdempotency, store=store, options=options)],
    )
)


# WSGI ----------------------------------------------------------------------------------------

flask_app = Flask(__name__)


@flask_app.post("/v1/charges")
def flask_charges() -> tuple[FlaskResponse, int]:
    form = dict(flask_request.form.items())
    status, doc = create_charge(form, flask_request.environ.get(ATTEMPT))
    response = flask_app.json.response(doc)
    return response, status


flask_app.wsgi_app = WsgiIdempotency(flask_app.wsgi_app, store=store, options=options)  # type: ignore[method-assign]


def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """The Flask app, with the ``reset`` fault around the middleware."""
    if environ.get("REQUEST_METHOD") != "POST":
        return flask_app(environ, start_response)
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    environ["wsgi.input"] = io.BytesIO(body)
    metadata = metadata_of(form_of(body))
    if metadata.get("fault") != "reset":
        return flask_app(environ, start_response)
    started: list[Any] = []

    def hold(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        started[:] = [status, headers, exc_info]
        return lambda data: None

    inner = flask_app(environ, hold)
    try:
        chunks = list(inner)
    finally:
        close = getattr(inner, "close", None)
        if close is not None:
            close()
    status = int(started[0].split()[0]) if started else 500
    replayed = bool(started) and any(
        k.lower() == "idempotent-replayed" and v == "true" for k, v in started[1]
    )
    if not _resets("reset", metadata.get("order", ""), status, replayed):
        start_response(*started)
        return chunks
    sock = environ.get("gunicorn.socket")
    if sock is None:
        raise RuntimeError("the reset fault needs gunicorn (environ['gunicorn.socket'])")
    _linger_zero(sock)
    _disconnect(sock)
    start_response("200 OK", [("content-length", "0")])
    return _nothing()


def _nothing() -> Iterator[bytes]:
    yield from ()
