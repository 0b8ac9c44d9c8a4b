"""idemctl.http in one process: the pure policy, and both middlewares driven directly (an
ASGI app called with scope, receive and send; a WSGI app with werkzeug's test client) on
the memory store, for the cases the example apps cannot show: an app that raises,
Set-Cookie, stored 5xx, the legacy write(), a client gone before its body, the metrics.
tests/http runs the same semantics over real servers on every store."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterable, Iterator, MutableMapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from werkzeug.test import Client

from idemctl.errors import ConfigError
from idemctl.http import Attempt, Options, Request, policy
from idemctl.http.asgi import IdempotencyMiddleware as ASGIMiddleware
from idemctl.http.stats import STATS
from idemctl.http.wsgi import ATTEMPT
from idemctl.http.wsgi import IdempotencyMiddleware as WSGIMiddleware
from idemctl.model import Busy, Completed, Failed, Record, Status
from idemctl.stores.memory import MemoryStore

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def request(headers: dict[str, str] | None = None, path: str = "/charges") -> Request:
    return Request("POST", path, headers or {})


# The policy -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ('"abc"', "abc"),
        ('  "8e03978e-40d5-43e8-bc93-6894a57f9324" ', "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        (r'"say \"hi\" \\ twice"', 'say "hi" \\ twice'),
        ("bare-token_1.2:3/4", "bare-token_1.2:3/4"),
        ("9f3c1a2e-6b7d-4e8f-9a0b-1c2d3e4f5a6b", "9f3c1a2e-6b7d-4e8f-9a0b-1c2d3e4f5a6b"),
        ("01ARZ3NDEKTSV4RRFFQ69G5FAV", "01ARZ3NDEKTSV4RRFFQ69G5FAV"),
        ("q83vEjRWeJA+/w==", "q83vEjRWeJA+/w=="),
        ('"abc";v=1', "abc"),
        ('"abc"; v=1;x', "abc"),
        ('"a', '"a'),
        ("a b", "a b"),
        ('"with spaces and ünicode?"', None),
        ("caf\u00e9", None),
        ("tab\there", None),
        ('""', None),
        ("", None),
        ('"' + "x" * 256 + '"', None),
        ("x" * 256, None),
    ],
)
def test_a_key_is_printable_ascii_bare_or_a_structured_field_string(
    raw: str, key: str | None
) -> None:
    found = policy.key_of(Options(), raw)
    if key is None:
        assert isinstance(found, policy.Problem) and found.status == 400
        assert found.name == "invalid-key"
    else:
        assert found == key


def test_a_missing_key_is_a_problem_unless_not_required() -> None:
    found = policy.key_of(Options(), None)
    assert isinstance(found, policy.Problem) and (found.status, found.name) == (400, "missing-key")
    assert policy.key_of(Options(required=False), None) is None


def test_a_problem_is_rfc_9457_json() -> None:
    busy = Busy(record=None)
    name, response = policy.answer_of(Options(problem_base="https://x.test/p/"), busy, NOW)
    assert name == "conflict" and response.status == 409
    headers = dict(response.headers)
    assert headers["content-type"] == "application/problem+json"
    assert headers["retry-after"] == "1" and int(headers["content-length"]) == len(response.body)
    assert json.loads(response.body)["type"] == "https://x.test/p/request-in-progress"


def record(**fields: Any) -> Record:
    base: dict[str, Any] = {
        "key": "k", "status": Status.IN_PROGRESS, "fingerprint": None, "owner": "o",
        "fencing_token": 1, "attempts": 1, "created_at": NOW, "updated_at": NOW,
    }  # fmt: skip
    return Record(**{**base, **fields})


def test_retry_after_estimates_when_the_request_in_flight_ends() -> None:
    """From the route's usual time less how long the holder has run (at least 1 s), never
    the lease's end: a 3 s request is not retried 29 s later."""
    lease_ends = NOW + timedelta(seconds=29)
    busy = Busy(record(created_at=NOW - timedelta(seconds=1), lease_expires_at=lease_ends))

    def after(typical: float | None, outcome: Busy = busy) -> str:
        _, response = policy.answer_of(Options(), outcome, NOW, typical=typical)
        return dict(response.headers)["retry-after"]

    assert after(None) == "1"  # no figures for the route yet
    assert after(3.0) == "2" and after(1.2) == "1"  # ran 1 s of 3; of 1.2
    assert after(600.0) == "29"  # never past the lease's end
    retried = Busy(
        record(
            attempts=2,
            created_at=NOW - timedelta(hours=1),
            updated_at=NOW - timedelta(seconds=2),
            lease_expires_at=lease_ends,
        )
    )
    assert after(5.0, retried) == "3"  # a later attempt: counted from its last write


def test_a_key_failed_for_good_is_422() -> None:
    name, response = policy.answer_of(Options(), Failed(record(status=Status.FAILED)), NOW)
    assert (name, response.status) == ("failed", 422)


def test_methods_and_paths_guarded() -> None:
    options = Options(methods=("post",), paths=("/charges*", "/refunds"))
    assert options.guards("POST", "/charges") and options.guards("post", "/charges/7")
    assert not options.guards("PATCH", "/charges")
    assert not options.guards("POST", "/refunds/7") and not options.guards("GET", "/charges")


def test_the_stored_key_is_scoped_by_caller_method_and_path() -> None:
    options = Options()
    anonymous = policy.stored_key(options, request(), "k")
    alice = policy.stored_key(options, request({"authorization": "Bearer alice"}), "k")
    bob = policy.stored_key(options, request({"authorization": "Bearer bob"}), "k")
    assert anonymous == "http:-:POST:/charges:k"
    assert len({anonymous, alice, bob}) == 3 and "alice" not in alice  # a hash, no secret
    long = policy.stored_key(options, request(path="/" + "p" * 600), "k")
    assert len(long) <= 512 and long.startswith("http:-:POST:#") and long.endswith(":k")
    custom = Options(caller=lambda r: r.headers.get("x-tenant"))
    assert policy.stored_key(custom, request({"x-tenant": "t1"}), "k") == "http:t1:POST:/charges:k"


def test_the_path_has_one_form_on_both_servers() -> None:
    assert policy.request_path("/a b/ü".encode()) == "/a%20b/%C3%BC"
    assert policy.request_path("/a b/ü".encode().decode("latin-1").encode("latin-1")) == (
        "/a%20b/%C3%BC"
    )
    assert policy.request_path(b"/50%") == "/50%25"


def test_the_fingerprint_is_the_body_and_the_chosen_headers() -> None:
    plain = Options()
    by_header = Options(fingerprint_headers=("X-Currency",))
    eur, usd = request({"x-currency": "EUR"}), request({"x-currency": "USD"})
    assert policy.fingerprint_of(plain, eur, b"{}") == policy.fingerprint_of(plain, usd, b"{}")
    assert policy.fingerprint_of(by_header, eur, b"{}") != policy.fingerprint_of(
        by_header, usd, b"{}"
    )
    assert policy.fingerprint_of(plain, eur, b"{}") != policy.fingerprint_of(plain, eur, b"{ }")


def test_what_is_stored_and_replayed() -> None:
    response = policy.Response(
        201,
        [("Content-Type", "application/json"), ("Set-Cookie", "s=1"), ("X-Trace", "t")],
        b"\x00\xffbody",
    )
    stored = policy.stored_form(Options(), request(), response)
    assert isinstance(stored, dict)
    assert stored["headers"] == [["Content-Type", "application/json"]]  # no cookie, no trace
    replayed = policy.replay(stored)
    assert replayed.status == 201 and replayed.body == b"\x00\xffbody"
    assert replayed.headers == [
        ("Content-Type", "application/json"),
        ("Idempotent-Replayed", "true"),
        ("content-length", "6"),
    ]
    listed = Options(replay_headers=(*policy.DEFAULT_REPLAY_HEADERS, "set-cookie"))
    assert policy.stored_form(listed, request(), response)["headers"] == stored["headers"]
    asked = Options(replay_headers=(*policy.DEFAULT_REPLAY_HEADERS, "set-cookie"), drop_headers=())
    kept = policy.stored_form(asked, request(), response)
    assert isinstance(kept, dict) and ["Set-Cookie", "s=1"] in kept["headers"]
    every = policy.stored_form(
        Options(replay_headers=("*",), drop_headers=("x-trace",)), request(), response
    )
    assert every["headers"] == [["Content-Type", "application/json"], ["Set-Cookie", "s=1"]]


def test_the_redaction_hook_shapes_what_is_stored() -> None:
    def masked(r: policy.Response) -> policy.Response:
        return policy.Response(r.status, r.headers, r.body.replace(b"4242", b"****"))

    response = policy.Response(201, [], b'{"card": "4242"}')
    stored = policy.stored_form(Options(redact=masked), request(), response)
    assert policy.replay(stored).body == b'{"card": "****"}'
    assert response.body == b'{"card": "4242"}'  # what the first client gets


def test_5xx_and_statuses_before_the_endpoint_are_not_stored_unless_asked() -> None:
    error = policy.Response(503, [], b"down")
    assert policy.stored_form(Options(), request(), error) is None
    assert policy.stored_form(Options(store_server_errors=True), request(), error) is not None
    invalid = policy.Response(422, [], b"{}")
    assert policy.stored_form(Options(), request(), invalid) is None
    assert policy.stored_form(Options(unstored_statuses=()), request(), invalid) is not None


def test_a_body_over_the_limit_is_kept_as_its_status_alone_and_never_run_again() -> None:
    big = policy.Response(201, [("Content-Type", "text/plain")], b"x" * 11)
    assert policy.stored_form(Options(max_body=11), request(), big)["body"] is not None
    kept = policy.stored_form(Options(max_body=10), request(), big)
    assert kept["too_large"] is True and kept["body"] is None and kept["size"] == 11
    done = Completed(record(status=Status.COMPLETED, result=kept))
    name, answer = policy.answer_of(Options(), done, NOW)
    assert (name, answer.status) == ("too_large", 422)
    problem = json.loads(answer.body)
    assert problem["type"].endswith("/response-too-large") and problem["first_status"] == 201
    assert "succeeded with 201" in problem["detail"]
    assert Options(max_body=1 << 20).body_limit("dynamodb") == 256 << 10
    assert Options(max_body=1000).body_limit("dynamodb") == 1000


@pytest.mark.parametrize(
    "bad",
    [
        {"max_key_length": 0},
        {"max_key_length": 256},
        {"max_body": -1},
        {"wait": 0},
        {"wait": 3601},
        {"retention": 0},
        {"lease": 0},
        {"caller": "nobody"},
    ],
)
def test_bad_options_are_refused_at_once(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        Options(**bad)


# ASGI, in process -----------------------------------------------------------------------


async def call_asgi(
    app: Any, key: str | None, body: bytes = b"{}", *, disconnect: bool = False
) -> tuple[int, dict[str, str], bytes]:
    headers = [(b"content-type", b"application/json")]
    if key is not None:
        headers.append((b"idempotency-key", key.encode()))
    scope = {"type": "http", "method": "POST", "path": "/charges", "headers": headers}
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.disconnect"}] if disconnect else [
        {"type": "http.request", "body": body[:1], "more_body": True},
        {"type": "http.request", "body": body[1:], "more_body": False},
    ]  # fmt: skip

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    if not sent:
        return 0, {}, b""
    start = sent[0]
    out = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return start["status"], out, b"".join(m.get("body", b"") for m in sent[1:])


class Counting:
    """An ASGI app: answers ``status`` with a body counting its runs, or raises."""

    def __init__(self, status: int = 201, raises: bool = False, cookie: bool = False) -> None:
        self.status, self.raises, self.cookie = status, raises, cookie
        self.runs = 0
        self.attempts: list[Attempt] = []
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.runs += 1
        if "state" in scope:  # guarded
            self.attempts.append(scope["state"]["idempotency"])
        self.bodies.append((await receive())["body"])
        if self.raises:
            raise RuntimeError("the app broke")
        headers = [(b"content-type", b"text/plain")]
        if self.cookie:
            headers.append((b"set-cookie", b"session=secret"))
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": b"run ", "more_body": True})
        await send({"type": "http.response.body", "body": str(self.runs).encode()})


def test_asgi_an_app_that_raises_releases_the_key_for_the_retry() -> None:
    store = MemoryStore()
    app = Counting(raises=True)
    guarded = ASGIMiddleware(app, store=store)
    with pytest.raises(RuntimeError, match="the app broke"):
        asyncio.run(call_asgi(guarded, '"k"'))
    held = store.get("http:-:POST:/charges:k")
    assert held is not None and held.status is Status.IN_PROGRESS and held.owner is None
    app.raises = False
    status, _, body = asyncio.run(call_asgi(guarded, '"k"'))
    assert (status, body, app.runs) == (201, b"run 2", 2)
    assert app.attempts[-1].key == "k" and app.attempts[-1].attempt == 2
    assert app.bodies == [b"{}", b"{}"]  # the body read for the fingerprint, given again


def test_asgi_a_5xx_is_stored_when_asked_and_cookies_never_replayed() -> None:
    store = MemoryStore()
    app = Counting(status=502, cookie=True)
    guarded = ASGIMiddleware(app, store=store, options=Options(store_server_errors=True))
    first = asyncio.run(call_asgi(guarded, '"k"'))
    again = asyncio.run(call_asgi(guarded, '"k"'))
    assert first[0] == again[0] == 502 and first[2] == again[2] == b"run 1"
    assert first[1]["set-cookie"] == "session=secret"  # the first caller gets its cookie
    assert "set-cookie" not in again[1] and again[1]["idempotent-replayed"] == "true"
    assert app.runs == 1


def test_asgi_a_client_gone_before_its_body_runs_nothing() -> None:
    store = MemoryStore()
    app = Counting()
    assert asyncio.run(call_asgi(ASGIMiddleware(app, store=store), '"k"', disconnect=True))[0] == 0
    assert app.runs == 0 and store.get("http:-:POST:/charges:k") is None


def test_asgi_other_scopes_and_unguarded_requests_pass_through() -> None:
    app = Counting()
    guarded = ASGIMiddleware(app, store=MemoryStore(), options=Options(paths=("/other",)))
    status, headers, _ = asyncio.run(call_asgi(guarded, None))
    assert status == 201 and app.runs == 1 and "idempotent-replayed" not in headers
    assert app.attempts == []  # passed through: no attempt, no key


# WSGI, in process -----------------------------------------------------------------------


class Legacy:
    """A WSGI app that writes part of its body with the legacy ``write()``, and yields the
    rest from an iterable whose ``close()`` it counts."""

    def __init__(self, raises: bool = False) -> None:
        self.runs = self.closed = 0
        self.raises = raises
        self.attempts: list[Attempt] = []

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        self.runs += 1
        self.attempts.append(environ[ATTEMPT])
        assert environ["wsgi.input"].read() == b'{"a": 1}'
        if self.raises:
            raise RuntimeError("the app broke")
        write = start_response("201 Created", [("Content-Type", "text/plain")])
        write(b"written ")
        return self._rest()

    def _rest(self) -> Iterator[bytes]:
        try:
            yield b"then yielded %d" % self.runs
        finally:
            self.closed += 1


def test_wsgi_legacy_write_is_stored_and_replayed() -> None:
    app = Legacy()
    client = Client(WSGIMiddleware(app, store=MemoryStore()))
    headers = {"Idempotency-Key": '"k"', "Content-Type": "application/json"}
    first = client.post("/charges", data=b'{"a": 1}', headers=headers)
    again = client.post("/charges", data=b'{"a": 1}', headers=headers)
    assert first.status_code == again.status_code == 201
    assert first.data == again.data == b"written then yielded 1"
    assert again.headers["Idempotent-Replayed"] == "true" and app.runs == 1 and app.closed == 1
    assert app.attempts[0].stored_key == "http:-:POST:/charges:k"


def test_wsgi_an_app_that_raises_releases_the_key() -> None:
    store = MemoryStore()
    app = Legacy(raises=True)
    client = Client(WSGIMiddleware(app, store=store))
    headers = {"Idempotency-Key": '"k"'}
    with pytest.raises(RuntimeError):
        client.post("/charges", data=b'{"a": 1}', headers=headers)
    app.raises = False
    assert client.post("/charges", data=b'{"a": 1}', headers=headers).status_code == 201
    assert app.runs == 2


def test_wsgi_a_body_over_the_limit_streams_and_is_never_run_again() -> None:
    app = Legacy()
    client = Client(WSGIMiddleware(app, store=MemoryStore(), options=Options(max_body=10)))
    headers = {"Idempotency-Key": '"k"'}
    first = client.post("/charges", data=b'{"a": 1}', headers=headers)
    assert first.status_code == 201 and first.data == b"written then yielded 1"
    again = client.post("/charges", data=b'{"a": 1}', headers=headers)
    assert again.status_code == 422 and again.json["type"].endswith("/response-too-large")
    assert app.runs == 1 and app.closed == 1


def test_the_outcomes_are_counted_for_prometheus() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from idemctl.metrics import register_http

    registry = CollectorRegistry()
    register_http(registry)
    before = STATS.snapshot()[0]
    client = Client(WSGIMiddleware(Legacy(), store=MemoryStore()))
    client.post("/charges", data=b'{"a": 1}')
    for _ in range(2):
        client.post("/charges", data=b'{"a": 1}', headers={"Idempotency-Key": '"k"'})
    after = STATS.snapshot()[0]
    assert after["missing_key"] - before["missing_key"] == 1
    assert (after["new"] - before["new"], after["replayed"] - before["replayed"]) == (1, 1)
    text = generate_latest(registry).decode()
    assert f'idemctl_http_requests_total{{outcome="replayed"}} {after["replayed"]:.1f}' in text
    assert "idemctl_http_added_seconds_bucket" in text


def test_a_stored_response_is_base64_of_the_bytes() -> None:
    stored = policy.stored_form(Options(), request(), policy.Response(200, [], b"\x80"))
    assert isinstance(stored, dict) and base64.b64decode(str(stored["body"])) == b"\x80"
    assert policy.is_stored_response(stored) and not policy.is_stored_response({"x": 1})


def test_asgi_a_streamed_response_ends_only_once_its_key_is_completed() -> None:
    """Past max_body the response streams, and its key is completed without the body; its
    last message waits for that, so a client holding the whole response never finds its
    key held (409)."""
    store = MemoryStore()
    seen_at_end: list[object] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(3):
            await send({"type": "http.response.body", "body": b"x" * 10, "more_body": i < 2})

    async def main() -> bytes:
        guarded = ASGIMiddleware(app, store=store, options=Options(max_body=15))
        scope = {
            "type": "http", "method": "POST", "path": "/charges",
            "headers": [(b"idempotency-key", b'"s"')],
        }  # fmt: skip
        got: list[bytes] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"{}", "more_body": False}

        async def send(message: MutableMapping[str, Any]) -> None:
            got.append(message.get("body", b""))
            if message["type"] == "http.response.body" and not message.get("more_body"):
                seen_at_end.append(store.get("http:-:POST:/charges:s"))

        await guarded(scope, receive, send)
        return b"".join(got)

    assert asyncio.run(main()) == b"x" * 30
    (record,) = seen_at_end
    assert isinstance(record, Record) and record.status is Status.COMPLETED  # before the end
    assert record.result["too_large"] is True and record.result["size"] == 30
