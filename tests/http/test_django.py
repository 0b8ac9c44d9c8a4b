"""Django and Django REST framework behind idemctl's Django middleware
(``idemctl.http.django``), as a client sees them: the example shop
(examples/http/django_shop) under gunicorn (WSGI) and uvicorn (ASGI) on Redis.

``POST /charges`` is a plain view marked ``idempotent()``, ``POST /drf/charges`` a DRF
APIView with ``IdempotentMixin``, ``POST /async/charges`` an async view; ``/export`` is
guarded by the settings' paths, ``/notes`` not at all. Issue 58's finding 5 is here too:
under uvicorn, a client that hangs up mid-request cancels Django's task, and the view,
still running in its thread (or, async, in its task), must charge once and leave its
response for the retry (under gunicorn too).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from idemctl.model import Status
from tests.http.conftest import Served, problem, serve, store_url, stored_key, unique
from tests.http.hangup import hang_up, settled

pytestmark = pytest.mark.timeout(240)

REPLAYED = "idempotent-replayed"
APPS = {
    "gunicorn": "examples.http.django_shop.wsgi:application",
    "uvicorn": "examples.http.django_shop.asgi:application",
}
VIEWS = ("/charges", "/drf/charges", "/async/charges")
"""The decorated function view, the DRF view and an async view: the same API."""


@pytest.fixture(scope="module", params=sorted(APPS))
def shop(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """The Django shop under gunicorn or uvicorn, on a Redis store of its own."""
    kind = request.param
    directory = tmp_path_factory.mktemp(f"django-{kind}")
    url = store_url(request, "redis", directory)
    with serve(kind, url, directory, app=APPS[kind]) as running:
        yield running


@pytest.mark.parametrize("path", VIEWS)
def test_a_completed_charge_is_replayed_byte_for_byte(shop: Served, path: str) -> None:
    key, order = unique("k"), unique("o")
    first = shop.client.post(
        path, json={"order": order, "amount": 500}, headers={"idempotency-key": f'"{key}"'}
    )
    assert first.status_code == 201, first.text
    assert REPLAYED not in first.headers and first.json()["order"] == order
    assert first.json()["fencing_token"] > 0  # the view saw request.idempotency
    again = shop.client.post(
        path, json={"order": order, "amount": 500}, headers={"idempotency-key": key}
    )
    assert again.status_code == 201
    assert again.content == first.content
    assert again.headers[REPLAYED] == "true"
    assert again.headers["content-type"] == first.headers["content-type"]
    assert shop.charges(order) == 1
    with shop.store() as store:
        record = store.get(stored_key(key, path))
    assert record is not None and record.status is Status.COMPLETED


@pytest.mark.parametrize("path", VIEWS)
def test_the_same_key_with_another_payload_is_422(shop: Served, path: str) -> None:
    key, order = unique("k"), unique("o")
    headers = {"idempotency-key": f'"{key}"'}
    assert (
        shop.client.post(path, json={"order": order, "amount": 500}, headers=headers).status_code
        == 201
    )
    other = shop.client.post(path, json={"order": order, "amount": 501}, headers=headers)
    problem(other, 422, "key-reused")
    assert shop.charges(order) == 1


@pytest.mark.parametrize("path", VIEWS)
def test_a_missing_key_is_400_and_charges_nothing(shop: Served, path: str) -> None:
    order = unique("nokey")
    problem(shop.client.post(path, json={"order": order, "amount": 1}), 400, "missing-key")
    assert shop.charges(order) == 0


@pytest.mark.parametrize("path", VIEWS)
def test_a_500_is_not_stored_and_the_retry_charges_once(shop: Served, path: str) -> None:
    key, order = unique("k"), unique("flaky")
    headers = {"idempotency-key": f'"{key}"'}
    body = {"order": order, "amount": 500}
    assert shop.client.post(path, json=body, headers=headers).status_code == 500
    retried = shop.client.post(path, json=body, headers=headers)
    assert retried.status_code == 201 and REPLAYED not in retried.headers
    assert shop.client.post(path, json=body, headers=headers).content == retried.content
    assert shop.charges(order) == 1


def test_a_view_neither_marked_nor_matched_passes_through(shop: Served) -> None:
    answer = shop.client.post("/notes", content=b"hello")
    assert answer.status_code == 200 and answer.json() == {"note": "hello"}
    assert "problem+json" not in answer.headers.get("content-type", "")


def test_other_methods_pass_through_to_django(shop: Served) -> None:
    answer = shop.client.get("/charges")  # require_POST's own 405, no key asked for
    assert answer.status_code == 405
    assert "problem+json" not in answer.headers.get("content-type", "")


def test_the_settings_paths_guard_an_unmarked_streaming_view(shop: Served) -> None:
    key = unique("k")
    params, headers = {"chunks": 50, "size": 1000}, {"idempotency-key": f'"{key}"'}
    problem(shop.client.post("/export", params=params), 400, "missing-key")
    first = shop.client.post("/export", params=params, headers=headers)
    assert first.status_code == 201 and len(first.content) == 50_000
    again = shop.client.post("/export", params=params, headers=headers)
    assert again.headers[REPLAYED] == "true" and again.content == first.content


@pytest.mark.parametrize("path", VIEWS)
def test_a_client_that_hangs_up_mid_request_is_charged_once(shop: Served, path: str) -> None:
    """Finding 5: under uvicorn Django cancels the request's task when its client hangs
    up; the view runs on in its thread. The key must not be freed meanwhile: the retry,
    sent after the view ended, gets the stored response, and the ledger has one line."""
    key, order = unique("k"), unique("hangup")
    body = b'{"order": "%s", "amount": 500}' % order.encode()
    target = f"{path}?delay=2"
    hang_up(shop, target, key, body, stored_key(key, path))
    record = settled(shop, stored_key(key, path), order)
    assert record.status is Status.COMPLETED, record
    retry = shop.client.post(
        target,
        content=body,
        headers={"content-type": "application/json", "idempotency-key": f'"{key}"'},
    )
    assert retry.status_code == 201, retry.text
    assert retry.headers.get(REPLAYED) == "true"
    assert retry.json()["order"] == order
    assert shop.charges(order) == 1


@pytest.fixture(scope="module")
def wrapped(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """Django's ASGI application inside idemctl's ASGI middleware (no Django middleware):
    the set-up finding 5 was found with, under uvicorn on Redis."""
    directory = tmp_path_factory.mktemp("django-wrapped")
    url = store_url(request, "redis", directory)
    with serve("uvicorn", url, directory, app="tests.http.django_wrapped:application") as running:
        yield running


def test_django_inside_the_asgi_middleware_survives_a_hang_up(wrapped: Served) -> None:
    key, order = unique("k"), unique("hangup")
    body = b'{"order": "%s", "amount": 500}' % order.encode()
    hang_up(wrapped, "/charges?delay=2", key, body, stored_key(key))
    record = settled(wrapped, stored_key(key), order)
    assert record.status is Status.COMPLETED, record
    retry = wrapped.client.post(
        "/charges?delay=2",
        content=body,
        headers={"content-type": "application/json", "idempotency-key": f'"{key}"'},
    )
    assert retry.status_code == 201 and retry.headers.get(REPLAYED) == "true", retry.text
    assert wrapped.charges(order) == 1
