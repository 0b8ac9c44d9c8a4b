"""idemctl.http against what real clients and servers do, in one process on the memory store:
fingerprints of re-encoded requests, replays in an encoding the retry accepts, a store that
stops answering, background work after the response, a server that cancels a request, and
Stripe's key scope. tests/http runs these over real servers (uvicorn, gunicorn, Django)."""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
from collections.abc import Iterable, Iterator, MutableMapping
from typing import Any

import pytest
from werkzeug.test import Client

from idemctl.errors import StoreUnavailable
from idemctl.http import Options, Request, policy
from idemctl.http.asgi import IdempotencyMiddleware as ASGIMiddleware
from idemctl.http.wsgi import IdempotencyMiddleware as WSGIMiddleware
from idemctl.model import Status
from idemctl.stores.memory import MemoryStore
from tests.polling import wait_until_async

JSON_TYPE = {"content-type": "application/json"}


def fingerprint(body: bytes, headers: dict[str, str], query: str = "", **options: Any) -> str:
    return policy.fingerprint_of(Options(**options), Request("POST", "/c", headers, query), body)


def multipart(boundary: str, *parts: tuple[str, str | None, bytes]) -> tuple[bytes, dict[str, str]]:
    lines = b""
    for name, filename, data in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        lines += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n".encode()
        if filename:
            lines += b"Content-Type: text/plain\r\n"
        lines += b"\r\n" + data + b"\r\n"
    body = lines + f"--{boundary}--\r\n".encode()
    return body, {"content-type": f"multipart/form-data; boundary={boundary}"}


# Fingerprints ---------------------------------------------------------------------------


def test_a_multipart_form_is_fingerprinted_by_its_parts_not_its_boundary() -> None:
    parts = (("order", None, b"o-1"), ("file", "a.txt", b"hello"))
    one, two = multipart("aaaa1111", *parts), multipart("zz-other-boundary", *parts)
    assert one[0] != two[0]
    assert fingerprint(*one) == fingerprint(*two)
    other = multipart("aaaa1111", ("order", None, b"o-1"), ("file", "a.txt", b"HELLO"))
    renamed = multipart("aaaa1111", ("order", None, b"o-1"), ("file", "b.txt", b"hello"))
    assert len({fingerprint(*one), fingerprint(*other), fingerprint(*renamed)}) == 3
    assert fingerprint(*one, fingerprint="raw") != fingerprint(*two, fingerprint="raw")


def test_json_is_fingerprinted_by_its_canonical_form() -> None:
    a, b = b'{"order": "o-1", "amount": 500}', b'{"amount":500,"order":"o-1"}'
    assert fingerprint(a, JSON_TYPE) == fingerprint(b, JSON_TYPE)
    assert fingerprint(a, JSON_TYPE) != fingerprint(b'{"order": "o-1", "amount": 501}', JSON_TYPE)
    assert fingerprint(a, JSON_TYPE, fingerprint="raw") != fingerprint(
        b, JSON_TYPE, fingerprint="raw"
    )
    assert fingerprint(b"{not json", JSON_TYPE) != fingerprint(b"{not  json", JSON_TYPE)


def test_a_form_and_the_query_are_fingerprinted_by_their_decoded_pairs() -> None:
    form = {"content-type": "application/x-www-form-urlencoded"}
    assert fingerprint(b"a=1&b=x+y", form) == fingerprint(b"b=x%20y&a=1", form)
    assert fingerprint(b"a=1&a=2", form) != fingerprint(b"a=2&a=1", form)  # a list's order
    assert fingerprint(b"", {}, "amount=100") != fingerprint(b"", {}, "amount=999")
    assert fingerprint(b"", {}, "a=1&b=2") == fingerprint(b"", {}, "b=2&a=1")
    assert fingerprint(b"", {}, "amount=100", fingerprint="raw") != fingerprint(
        b"", {}, "amount=999", fingerprint="raw"
    )


def test_scope_key_refuses_a_key_reused_on_another_route() -> None:
    options = Options(scope="key")
    charge, refund = Request("POST", "/charges", {}), Request("POST", "/refunds", {})
    one, two = policy.guarded(options, charge, "k", b""), policy.guarded(options, refund, "k", b"")
    assert one.stored_key == two.stored_key == "http:-:k"
    assert one.fingerprint != two.fingerprint  # so the second is a mismatch: 422


# ASGI helpers -----------------------------------------------------------------------------


def scope(key: bytes = b"k", *more: tuple[bytes, bytes], path: str = "/charges") -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": path,
        "query_string": b"",
        "headers": [(b"idempotency-key", key), *more],
    }


async def call(app: Any, request_scope: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    messages: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        messages.append(message)

    await app(request_scope, receive, send)
    start = messages[0]
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    body = b"".join(m.get("body", b"") for m in messages[1:])
    return start["status"], headers, body


def test_two_key_header_fields_are_refused() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("not run")

    status, _, body = asyncio.run(
        call(ASGIMiddleware(app, store=MemoryStore()), scope(b"a", (b"idempotency-key", b"b")))
    )
    assert status == 400 and json.loads(body)["type"].endswith("/invalid-key")


def test_a_gzip_body_is_replayed_decoded_to_a_client_that_does_not_take_gzip() -> None:
    plain = b'{"charge": "' + b"x" * 500 + b'"}'

    async def gzipping(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        headers = [(b"content-type", b"application/json"), (b"content-encoding", b"gzip")]
        await send(
            {
                "type": "http.response.start",
                "status": 201,
                "headers": [*headers, (b"vary", b"Accept-Encoding")],
            }
        )
        await send({"type": "http.response.body", "body": gzip.compress(plain)})

    app = ASGIMiddleware(gzipping, store=MemoryStore())
    first = asyncio.run(call(app, scope(b"g", (b"accept-encoding", b"gzip"))))
    identity = asyncio.run(call(app, scope(b"g", (b"accept-encoding", b"identity"))))
    again = asyncio.run(call(app, scope(b"g", (b"accept-encoding", b"gzip, br"))))
    assert first[0] == identity[0] == again[0] == 201
    assert identity[2] == plain and "content-encoding" not in identity[1]
    assert "accept-encoding" in identity[1]["vary"].lower()
    assert again[2] == first[2] and again[1]["content-encoding"] == "gzip"
    assert policy.replay is not None


# A store that stops answering -----------------------------------------------------------


class Flaky(MemoryStore):
    """The memory store, silent for its next ``down`` completes (or claims)."""

    def __init__(self) -> None:
        super().__init__()
        self.completes_down = 0
        self.claims_down = False
        self.lost_reply = False

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        if self.claims_down:
            raise StoreUnavailable("the store is down")
        return super().claim(*args, **kwargs)

    def complete(self, *args: Any, **kwargs: Any) -> Any:
        if self.lost_reply:  # done, but the answer never came back
            self.lost_reply = False
            super().complete(*args, **kwargs)
            raise StoreUnavailable("connection reset after the command ran")
        if self.completes_down > 0:
            self.completes_down -= 1
            raise StoreUnavailable("the store is down")
        return super().complete(*args, **kwargs)


class Charges:
    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        self.runs += 1
        start_response("201 Created", [("Content-Type", "application/json")])
        return [b'{"charged": %d}' % self.runs]


def test_a_complete_the_store_does_not_answer_is_asked_again_until_it_does() -> None:
    store, app = Flaky(), Charges()
    store.completes_down = 3
    client = Client(WSGIMiddleware(app, store=store))
    first = client.post("/charges", data=b"{}", headers={"Idempotency-Key": "k"})
    assert first.status_code == 201 and store.completes_down == 0
    again = client.post("/charges", data=b"{}", headers={"Idempotency-Key": "k"})
    assert again.headers["Idempotent-Replayed"] == "true" and again.data == first.data
    assert app.runs == 1


def test_a_complete_whose_answer_was_lost_counts_as_stored() -> None:
    store, app = Flaky(), Charges()
    store.lost_reply = True
    client = Client(WSGIMiddleware(app, store=store))
    assert client.post("/charges", data=b"{}", headers={"Idempotency-Key": "k"}).status_code == 201
    assert store.get("http:-:POST:/charges:k").status is Status.COMPLETED


def test_an_outage_longer_than_the_lease_is_a_503_and_the_key_stays_held() -> None:
    store, app = Flaky(), Charges()
    store.completes_down = 10**6
    client = Client(WSGIMiddleware(app, store=store, options=Options(lease=0.5)))
    answer = client.post("/charges", data=b"{}", headers={"Idempotency-Key": "k"})
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "2"
    assert answer.json["type"].endswith("/store-unavailable") and "ran" in answer.json["detail"]
    record = store.get("http:-:POST:/charges:k")
    assert record.status is Status.IN_PROGRESS and record.owner  # held, never released


def test_a_store_down_before_the_app_runs_is_a_503_and_the_app_is_not_run() -> None:
    store, app = Flaky(), Charges()
    store.claims_down = True
    client = Client(WSGIMiddleware(app, store=store))
    answer = client.post("/charges", data=b"{}", headers={"Idempotency-Key": "k"})
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "2"
    assert answer.headers["Content-Type"] == "application/problem+json"
    assert "not run" in answer.json["detail"] and app.runs == 0


# Background work ---------------------------------------------------------------------------


def test_asgi_background_work_runs_after_the_response_is_stored_and_sent() -> None:
    store = MemoryStore()
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})
        seen.append(store.get("http:-:POST:/charges:b").status)  # the background task
        raise RuntimeError("the background task broke")

    sent: list[MutableMapping[str, Any]] = []

    async def main() -> None:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"{}"}

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message)

        with pytest.raises(RuntimeError, match="background"):
            await ASGIMiddleware(app, store=store)(scope(b"b"), receive, send)

    asyncio.run(main())
    assert seen == [Status.COMPLETED]  # stored before the background work began
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 201
    status, _, body = asyncio.run(call(ASGIMiddleware(app, store=store), scope(b"b")))
    assert (status, body) == (201, b"done")  # replayed: the broken task changed nothing


def test_wsgi_close_callbacks_run_after_the_response_and_change_nothing() -> None:
    store = MemoryStore()
    closed: list[Any] = []

    class Body:
        def __iter__(self) -> Iterator[bytes]:
            yield b"done"

        def close(self) -> None:
            closed.append(store.get("http:-:POST:/charges:c").status)
            raise RuntimeError("the close callback broke")

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        start_response("201 Created", [])
        return Body()

    middleware = WSGIMiddleware(app, store=store)
    answer = middleware(
        {"REQUEST_METHOD": "POST", "PATH_INFO": "/charges", "HTTP_IDEMPOTENCY_KEY": "c",
         "wsgi.input": __import__("io").BytesIO(b"")},
        lambda status, headers, exc_info=None: None,
    )  # fmt: skip
    assert closed == [] and list(answer) == [b"done"]  # not closed before the server sent it
    with pytest.raises(RuntimeError):
        answer.close()  # type: ignore[attr-defined]
    assert closed == [Status.COMPLETED]
    again = Client(WSGIMiddleware(app, store=store)).post(
        "/charges", headers={"Idempotency-Key": "c"}
    )
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true"


# Cancellation and hang-ups -------------------------------------------------------------------


def test_a_cancelled_request_runs_to_its_end_and_is_stored() -> None:
    """A server that cancels a request when its client hangs up: the app goes on, its key is
    completed, the retry replays it."""
    store = MemoryStore()
    release, in_view = threading.Event(), threading.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        in_view.set()
        await asyncio.to_thread(release.wait, 10)  # a sync view in its thread
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"charged"})

    middleware = ASGIMiddleware(app, store=store)

    async def main() -> None:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"{}"}

        async def send(message: MutableMapping[str, Any]) -> None:
            pass

        request = asyncio.ensure_future(middleware(scope(b"x"), receive, send))
        await wait_until_async(in_view.is_set, "the view runs")
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        assert store.get("http:-:POST:/charges:x").status is Status.IN_PROGRESS
        release.set()
        await wait_until_async(
            lambda: store.get("http:-:POST:/charges:x").status is Status.COMPLETED, "completed"
        )

    asyncio.run(main())
    assert store.get("http:-:POST:/charges:x").status is Status.COMPLETED
    status, headers, body = asyncio.run(call(middleware, scope(b"x")))
    assert (status, body, headers["idempotent-replayed"]) == (201, b"charged", "true")


def test_a_hang_up_does_not_reach_the_app_before_its_response_ends() -> None:
    got: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()

        async def listen() -> None:  # as Django's ASGI handler listens for a disconnect
            got.append((await receive())["type"])

        listener = asyncio.ensure_future(listen())
        await asyncio.sleep(0.1)
        got.append("view done")
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        await wait_until_async(lambda: len(got) == 2, "the hang-up reaches the app")
        listener.cancel()

    async def main() -> None:
        messages = iter([{"type": "http.request", "body": b"{}"}])

        async def receive() -> dict[str, Any]:
            return next(messages, {"type": "http.disconnect"})

        async def send(message: MutableMapping[str, Any]) -> None:
            pass

        await ASGIMiddleware(app, store=MemoryStore())(scope(b"d"), receive, send)

    asyncio.run(main())
    assert got == ["view done", "http.disconnect"]


def test_a_status_before_the_endpoint_frees_the_key_for_the_corrected_request() -> None:
    """FastAPI's own 422 for a bad body: nothing ran, so the corrected body with the same key
    runs (a release alone would keep the bad body's fingerprint: 422 key-reused)."""
    runs: list[bytes] = []

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        body = environ["wsgi.input"].read()
        if b"order" not in body:
            start_response("422 Unprocessable Content", [("Content-Type", "application/json")])
            return [b'{"detail": "order is missing"}']
        runs.append(body)
        start_response("201 Created", [])
        return [b"charged"]

    store = MemoryStore()
    client = Client(WSGIMiddleware(app, store=store))
    headers = {"Idempotency-Key": "k", "Content-Type": "application/json"}
    assert client.post("/charges", data=b"{}", headers=headers).status_code == 422
    assert client.post("/charges", data=b'{"order": 1}', headers=headers).status_code == 201
    again = client.post("/charges", data=b'{"order": 1}', headers=headers)
    assert again.headers["Idempotent-Replayed"] == "true" and runs == [b'{"order": 1}']
