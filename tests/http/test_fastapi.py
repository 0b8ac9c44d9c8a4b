"""FastAPI with per-route ``Idempotency-Key`` (``idemctl.http.fastapi``: ``IdempotentRoute``
and ``idempotent``), as a client sees it: examples/http/fastapi_app.py under uvicorn on
Redis. Its router is included in the app, so each route runs as FastAPI builds an included
route (the case the route class must wrap at ``handle``, not at ``self.app``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from idemctl.http.fastapi import shared_store
from idemctl.model import Status
from tests.http.conftest import Served, problem, serve, store_url, stored_key, unique
from tests.http.hangup import hang_up, settled

pytestmark = pytest.mark.timeout(240)

REPLAYED = "idempotent-replayed"
APP = "examples.http.fastapi_app:app"


@pytest.fixture(scope="module")
def api(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """The FastAPI example under uvicorn, on a Redis store of its own."""
    directory = tmp_path_factory.mktemp("fastapi")
    with serve("uvicorn", store_url(request, "redis", directory), directory, app=APP) as running:
        yield running


def post(
    api: Served, key: str | None, body: dict[str, Any], path: str = "/charges"
) -> httpx.Response:
    headers = {} if key is None else {"idempotency-key": f'"{key}"'}
    return api.client.post(path, json=body, headers=headers)


def test_a_completed_charge_is_replayed_byte_for_byte(api: Served) -> None:
    key, order = unique("k"), unique("o")
    first = post(api, key, {"order": order, "amount": 500})
    assert first.status_code == 201, first.text
    assert REPLAYED not in first.headers and first.json()["order"] == order
    assert first.json()["fencing_token"] > 0  # the endpoint saw request.state.idempotency
    again = post(api, key, {"order": order, "amount": 500})
    assert again.status_code == 201
    assert again.content == first.content and again.headers[REPLAYED] == "true"
    assert again.headers["content-type"] == first.headers["content-type"]
    assert api.charges(order) == 1
    with api.store() as store:
        record = store.get(stored_key(key))
    assert record is not None and record.status is Status.COMPLETED


def test_the_same_key_with_another_payload_is_422(api: Served) -> None:
    key, order = unique("k"), unique("o")
    assert post(api, key, {"order": order, "amount": 500}).status_code == 201
    problem(post(api, key, {"order": order, "amount": 501}), 422, "key-reused")
    assert api.charges(order) == 1


def test_a_missing_key_is_400_and_charges_nothing(api: Served) -> None:
    order = unique("nokey")
    problem(post(api, None, {"order": order, "amount": 500}), 400, "missing-key")
    assert api.charges(order) == 0


def test_a_bad_body_gets_fastapis_422_and_the_corrected_body_runs(api: Served) -> None:
    """FastAPI's own validation failure comes before the endpoint: not stored (the core's
    ``unstored_statuses``), so the corrected body with the same key is charged, once."""
    key, order = unique("k"), unique("valid")
    bad = post(api, key, {"order": order, "amount": "five hundred"})
    assert bad.status_code == 422, bad.text
    assert bad.json()["detail"][0]["loc"] == ["body", "amount"]  # FastAPI's, no problem
    assert api.charges(order) == 0
    fixed = post(api, key, {"order": order, "amount": 500})
    assert fixed.status_code == 201, fixed.text
    assert REPLAYED not in fixed.headers and fixed.json()["order"] == order
    again = post(api, key, {"order": order, "amount": 500})
    assert again.headers.get(REPLAYED) == "true" and again.content == fixed.content
    assert api.charges(order) == 1


def test_a_500_is_not_stored_and_the_retry_charges_once(api: Served) -> None:
    key, order = unique("k"), unique("flaky")
    assert post(api, key, {"order": order, "amount": 500}).status_code == 500
    retried = post(api, key, {"order": order, "amount": 500})
    assert retried.status_code == 201 and REPLAYED not in retried.headers
    assert api.charges(order) == 1


def test_a_route_not_marked_passes_through(api: Served) -> None:
    answer = api.client.post("/notes", content=b"hello")
    assert answer.status_code == 200 and answer.json() == {"note": "hello"}


def test_other_methods_get_fastapis_own_answer(api: Served) -> None:
    answer = api.client.get("/charges")
    assert answer.status_code == 405
    assert "problem+json" not in answer.headers.get("content-type", "")


def test_a_second_marked_route_streams_and_is_replayed(api: Served) -> None:
    key = unique("k")
    params, headers = {"chunks": 50, "size": 1000}, {"idempotency-key": f'"{key}"'}
    first = api.client.post("/export", params=params, headers=headers)
    assert first.status_code == 201 and len(first.content) == 50_000
    again = api.client.post("/export", params=params, headers=headers)
    assert again.headers[REPLAYED] == "true" and again.content == first.content
    with api.store() as store:
        record = store.get(stored_key(key, "/export"))
    assert record is not None and record.status is Status.COMPLETED


def test_a_client_that_hangs_up_mid_request_is_charged_once(api: Served) -> None:
    key, order = unique("k"), unique("hangup")
    body = b'{"order": "%s", "amount": 500}' % order.encode()
    hang_up(api, "/charges?delay=2", key, body, stored_key(key))
    record = settled(api, stored_key(key), order)
    assert record.status is Status.COMPLETED, record
    retry = api.client.post(
        "/charges?delay=2",
        content=body,
        headers={"content-type": "application/json", "idempotency-key": f'"{key}"'},
    )
    assert retry.status_code == 201 and retry.headers.get(REPLAYED) == "true", retry.text
    assert api.charges(order) == 1


def test_routes_given_one_store_share_it(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """One store per URL (None: ``$IDEMCTL_STORE``) or per store object, opened once."""
    url = f"sqlite:///{tmp_path}/shared.db"
    monkeypatch.setenv("IDEMCTL_STORE", url)
    assert shared_store(url) is shared_store(url) is shared_store(None)
    assert shared_store(f"sqlite:///{tmp_path}/other.db") is not shared_store(url)
