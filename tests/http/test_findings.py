"""Issue 58's findings 4, 6, 7, 8, 9, 10 and 11 as a user meets them: the example apps
(examples/http) under uvicorn (Starlette) and gunicorn (Flask) on Redis, each finding one
test of what the client sees and what the ledger says was charged.

- 4: background work (Starlette's ``BackgroundTask``, Flask's ``call_on_close``) runs after
  the response, and one that raises leaves the client's 201 and its replay.
- 6: a 409's ``Retry-After`` estimates the request in flight, not the lease's end.
- 7: a gzip response (GZip inside the middleware) is replayed decoded to a client that does
  not accept gzip, with ``Vary: Accept-Encoding``.
- 8: the same request sent again (a multipart form with a new boundary, JSON with its keys
  in another order) is a replay, not another payload.
- 9: a response too large to store is never run twice: the retry gets 422
  ``response-too-large``.
- 10: the query string is part of the fingerprint.
- 11: a validation failure before the endpoint runs (422) is not stored: the corrected
  request with the same key runs.
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import requests

from idemctl.model import Status
from tests.http.conftest import SERVERS, Served, problem, serve, store_url, stored_key, unique
from tests.polling import wait_until

pytestmark = pytest.mark.timeout(240)

REPLAYED = "idempotent-replayed"
DEADLINE = 60.0
"""Seconds a test waits for something that happens on its own (background work, a claim)."""


@pytest.fixture(scope="module", params=SERVERS)
def api(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """The example app under uvicorn or gunicorn on a Redis store of its own."""
    kind = request.param
    directory = tmp_path_factory.mktemp(f"findings-{kind}")
    with serve(kind, store_url(request, "redis", directory), directory) as running:
        yield running


def keyed(key: str, **headers: str) -> dict[str, str]:
    return {"idempotency-key": f'"{key}"', **headers}


def post(api: Served, path: str, key: str, body: dict[str, Any], **kw: Any) -> httpx.Response:
    """POST ``body`` as JSON to ``path`` with ``key``."""
    return api.client.post(path, json=body, headers=keyed(key), **kw)


def connection(api: Served) -> httpx.Client:
    """A client of its own to ``api``'s server (a connection of its own)."""
    return httpx.Client(base_url=api.server.base_url, timeout=90)


def held(api: Served, key: str) -> bool:
    """Whether a request holds ``key`` now (the store says so)."""
    with api.store() as store:
        record = store.get(key)
    return record is not None and record.status is Status.IN_PROGRESS and bool(record.owner)


# 4: background work ---------------------------------------------------------------------


def test_4_background_work_runs_after_the_response(api: Served) -> None:
    key, order = unique("k"), unique("bg")
    first = post(api, "/background", key, {"order": order}, params={"bg": 2})
    ran_already = api.charges(f"bg:{order}")  # read the moment the client has its answer
    assert first.status_code == 201, first.text
    assert ran_already == 0, "the response waited for the 2 s background task"
    assert api.charges(order) == 1
    wait_until(lambda: api.charges(f"bg:{order}") == 1, "the background task ran")
    again = post(api, "/background", key, {"order": order}, params={"bg": 2})
    assert again.status_code == 201 and again.headers.get(REPLAYED) == "true"
    assert again.content == first.content
    assert api.charges(order) == 1


def test_4_a_background_task_that_raises_leaves_the_201(api: Served) -> None:
    key, order = unique("k"), unique("bgfail")
    params, body = {"bg": 0.2, "bg_fail": 1}, {"order": order}
    # Each request on a connection of its own: the server closes the first one when the
    # app raises after its response (uvicorn and gunicorn do so without idemctl too), so a
    # request sent on it meanwhile would be reset.
    with connection(api) as client:
        first = client.post("/background", json=body, headers=keyed(key), params=params)
    assert first.status_code == 201, first.text
    assert REPLAYED not in first.headers
    wait_until(lambda: api.charges(f"bg:{order}") == 1, "the failing background task ran")
    with connection(api) as client:
        again = client.post("/background", json=body, headers=keyed(key), params=params)
    assert again.status_code == 201, again.text
    assert again.headers.get(REPLAYED) == "true" and again.content == first.content
    assert api.charges(order) == 1


# 6: Retry-After -------------------------------------------------------------------------


def test_6_a_409_says_to_retry_when_the_request_may_be_done(api: Served) -> None:
    key, order = unique("k"), unique("busy")
    answers: list[httpx.Response] = []
    first = threading.Thread(target=lambda: answers.append(api.charge(key, order, delay=3)))
    first.start()
    try:
        wait_until(lambda: held(api, stored_key(key)), "the first request holds its key")
        busy = api.charge(key, order, delay=3)  # the same request: its query string too
        problem(busy, 409, "request-in-progress")
        retry_after = int(busy.headers["retry-after"])
        # the first request ends about 3 s after it began; its lease (30 s) much later
        assert 1 <= retry_after <= 5, f"Retry-After: {retry_after} (the lease's end?)"
    finally:
        first.join(DEADLINE)
    assert answers and answers[0].status_code == 201
    assert api.charge(key, order, delay=3).content == answers[0].content
    assert api.charges(order) == 1


# 7: encodings ---------------------------------------------------------------------------


def raw_post(
    api: Served, path: str, key: str, body: bytes, encoding: str
) -> tuple[httpx.Headers, int, bytes]:
    """POST with ``Accept-Encoding: encoding``: the headers, status and body as sent (not
    decoded by httpx)."""
    headers = keyed(key, **{"content-type": "application/json", "accept-encoding": encoding})
    with api.client.stream("POST", path, content=body, headers=headers) as answer:
        return answer.headers, answer.status_code, b"".join(answer.iter_raw())


def varies_by_encoding(headers: httpx.Headers) -> bool:
    named = ",".join(headers.get_list("vary")).lower().split(",")
    return "accept-encoding" in {name.strip() for name in named}


def test_7_a_gzip_response_is_replayed_decoded_to_a_client_without_gzip(api: Served) -> None:
    key, order = unique("k"), unique("gz")
    body = json.dumps({"order": order}).encode()
    headers, status, raw = raw_post(api, "/gz/report", key, body, "gzip")
    assert status == 201 and headers.get("content-encoding") == "gzip"  # GZip ran inside
    plain = gzip.decompress(raw)
    assert json.loads(plain)["order"] == order and len(plain) > 1000

    headers, status, raw = raw_post(api, "/gz/report", key, body, "identity")
    assert status == 201 and headers.get(REPLAYED) == "true"
    assert headers.get("content-encoding", "identity") == "identity", headers
    assert raw == plain, raw[:40]
    assert varies_by_encoding(headers), headers

    headers, status, raw = raw_post(api, "/gz/report", key, body, "gzip")
    assert status == 201 and headers.get(REPLAYED) == "true"
    assert headers.get("content-encoding") == "gzip" and gzip.decompress(raw) == plain
    assert varies_by_encoding(headers), headers
    assert api.charges(order) == 1


# 8: fingerprints of what the request means ----------------------------------------------


def test_8_the_same_form_sent_again_is_replayed_whatever_its_boundary(api: Served) -> None:
    key, order = unique("k"), unique("form")
    url, data = api.client.base_url.join("/upload"), {"order": order}
    content = bytes(range(256)) * 40

    def files() -> dict[str, tuple[str, bytes, str]]:
        return {"file": ("scan.bin", content, "application/octet-stream")}

    sent: list[bytes] = []
    answers: list[tuple[int, dict[str, str], bytes]] = []
    with requests.Session() as session:
        for _ in range(2):  # requests, twice: a new boundary each time
            prepared = requests.Request(
                "POST", str(url), data=data, files=files(), headers=keyed(key)
            ).prepare()
            assert isinstance(prepared.body, bytes)
            sent.append(prepared.body)
            answer = session.send(prepared, timeout=90)
            answers.append((answer.status_code, dict(answer.headers), answer.content))
    built = api.client.build_request(
        "POST", "/upload", data=data, files=files(), headers=keyed(key)
    )
    sent.append(built.read())
    replayed = api.client.send(built)  # httpx: its own boundary
    answers.append((replayed.status_code, dict(replayed.headers), replayed.content))

    assert len(set(sent)) == 3, "each client drew a boundary of its own"
    status, _, first = answers[0]
    assert status == 201 and json.loads(first)["size"] == len(content)
    for status, headers, body in answers[1:]:
        assert status == 201, body
        assert {k.lower(): v for k, v in headers.items()}.get(REPLAYED) == "true"
        assert body == first
    assert api.charges(order) == 1


def test_8_the_same_json_with_its_keys_in_another_order_is_replayed(api: Served) -> None:
    key, order = unique("k"), unique("json")
    first = api.charge(key, order, body=b'{"order": "%s", "amount": 500}' % order.encode())
    assert first.status_code == 201
    again = api.charge(key, order, body=b'{\n  "amount": 500,\n  "order": "%s"\n}' % order.encode())
    assert again.status_code == 201, again.text
    assert again.headers.get(REPLAYED) == "true" and again.content == first.content
    assert api.charges(order) == 1


# 9: big responses -----------------------------------------------------------------------

BIG = {
    "one-body-1.5MiB": ("/big", {"size": 3 << 19}, 3 << 19, True),
    "streamed-20MiB": ("/big", {"size": 20 << 20, "chunk": 1 << 16}, 20 << 20, True),
    "export-20MiB": ("/export", {"chunks": 320, "size": 1 << 16}, 20 << 20, False),
}


@pytest.mark.parametrize("case", BIG, ids=list(BIG))
def test_9_a_response_too_large_to_store_is_never_run_twice(api: Served, case: str) -> None:
    path, params, size, charges = BIG[case]
    key, order = unique("k"), unique("big")
    first = post(api, path, key, {"order": order}, params=params)
    assert first.status_code == 201 and len(first.content) == size
    again = post(api, path, key, {"order": order}, params=params)
    assert again.status_code == 422, (  # not the body: megabytes
        f"{again.status_code}, {len(again.content)} bytes, {again.headers}, "
        f"{api.charges(order)} charge(s)"
    )
    doc = problem(again, 422, "response-too-large")
    assert "201" in doc["detail"], doc
    if charges:
        assert api.charges(order) == 1


# 10: the query string -------------------------------------------------------------------


def test_10_the_same_key_with_another_query_string_is_422(api: Served) -> None:
    key, order = unique("k"), unique("query")
    first = post(api, "/query-charges", key, {"order": order}, params={"amount": 100})
    assert first.status_code == 201 and first.json()["amount"] == 100
    again = post(api, "/query-charges", key, {"order": order}, params={"amount": 100})
    assert again.headers.get(REPLAYED) == "true" and again.content == first.content
    other = post(api, "/query-charges", key, {"order": order}, params={"amount": 999})
    problem(other, 422, "key-reused")
    assert api.charges(order) == 1


# 11: a validation failure before the endpoint runs --------------------------------------


def test_11_a_validation_422_is_not_stored_and_the_corrected_request_runs(api: Served) -> None:
    key, order = unique("k"), unique("valid")
    bad = post(api, "/validated", key, {"amount": 500})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "order"]
    assert api.charges(order) == 0
    fixed = post(api, "/validated", key, {"order": order, "amount": 500})
    assert fixed.status_code == 201, fixed.text
    assert REPLAYED not in fixed.headers and fixed.json()["order"] == order
    assert api.charges(order) == 1
    again = post(api, "/validated", key, {"order": order, "amount": 500})
    assert again.headers.get(REPLAYED) == "true" and again.content == fixed.content
    assert api.charges(order) == 1
