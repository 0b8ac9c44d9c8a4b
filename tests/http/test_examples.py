"""The example apps as a client sees them, under uvicorn and gunicorn on every store
family: the semantics table of docs/guides/http.md, row by row, over real HTTP."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from idemctl.model import Status
from tests.http.conftest import Served, problem, stored_key, unique

pytestmark = pytest.mark.timeout(240)

REPLAYED = "idempotent-replayed"


def test_a_missing_key_is_400_and_charges_nothing(served: Served) -> None:
    order = unique("nokey")
    problem(served.charge(None, order), 400, "missing-key")
    assert served.charges(order) == 0


@pytest.mark.parametrize(
    "header", ['""', '"' + "k" * 256 + '"', "k" * 256, '"tab\there"', "tab\there"]
)
def test_an_empty_long_or_malformed_key_is_400(served: Served, header: str) -> None:
    order = unique("badkey")
    problem(served.charge(None, order, header=header), 400, "invalid-key")
    assert served.charges(order) == 0


def test_keys_as_clients_send_them_are_taken(served: Served) -> None:
    """Bare, as Stripe's clients send them: a UUID starting with a digit, base64, words."""
    for bare in ("9f3c1a2e-6b7d-4e8f-9a0b-", "q83vEjRWeJA+/w==", "two words", '"unclosed'):
        key, order = bare + unique(""), unique("o")
        first = served.charge(None, order, header=key)
        assert first.status_code == 201, first.text
        again = served.charge(None, order, header=key)
        assert again.headers[REPLAYED] == "true" and again.content == first.content
        assert served.charges(order) == 1


def test_a_completed_request_is_replayed_byte_for_byte(served: Served) -> None:
    key, order = unique("k"), unique("o")
    first = served.charge(key, order)
    assert first.status_code == 201 and REPLAYED not in first.headers
    assert first.json()["order"] == order
    again = served.charge(key, order)
    bare = served.charge(None, order, header=key)  # a bare token names the same key
    for replay in (again, bare):
        assert replay.status_code == 201
        assert replay.content == first.content
        assert replay.headers[REPLAYED] == "true"
        assert replay.headers["content-type"] == first.headers["content-type"]
    assert served.charges(order) == 1


def test_the_same_key_with_another_payload_is_422(served: Served) -> None:
    key, order = unique("k"), unique("o")
    assert served.charge(key, order, 500).status_code == 201
    problem(served.charge(key, order, 501), 422, "key-reused")
    assert served.charges(order) == 1


def test_one_key_from_two_callers_charges_twice(served: Served) -> None:
    key, order = unique("k"), unique("o")
    alice = served.charge(key, order, auth="Bearer alice")
    bob = served.charge(key, order, auth="Bearer bob")
    assert alice.status_code == bob.status_code == 201
    assert alice.json()["id"] != bob.json()["id"]
    assert served.charge(key, order, auth="Bearer alice").content == alice.content
    assert served.charges(order) == 2


def test_one_key_on_two_paths_is_two_keys(served: Served) -> None:
    key, order = unique("k"), unique("o")
    assert served.charge(key, order).status_code == 201
    export = served.client.post(
        "/export", params={"chunks": 2, "size": 10}, headers={"idempotency-key": f'"{key}"'}
    )
    assert export.status_code == 201 and REPLAYED not in export.headers


def test_a_500_is_not_stored_and_the_retry_charges_once(served: Served) -> None:
    key, order = unique("k"), unique("flaky")
    failed = served.charge(key, order)
    assert failed.status_code == 500
    assert served.charges(order) == 0
    retried = served.charge(key, order)
    assert retried.status_code == 201 and REPLAYED not in retried.headers
    assert served.charge(key, order).content == retried.content
    assert served.charges(order) == 1


def test_a_4xx_is_stored(served: Served) -> None:
    key = unique("k")
    first = served.charge(key, "", body=b'{"order": 7}')
    assert first.status_code == 400 and REPLAYED not in first.headers
    again = served.charge(key, "", body=b'{"order": 7}')
    assert again.status_code == 400 and again.headers[REPLAYED] == "true"
    assert again.content == first.content


def test_other_methods_pass_through_untouched(served: Served) -> None:
    answer = served.client.get("/charges")  # no key needed, and the app's own answer
    assert answer.status_code == 405
    assert "problem+json" not in answer.headers.get("content-type", "")


def test_concurrent_identical_requests_charge_once(served: Served) -> None:
    key, order = unique("k"), unique("o")
    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(lambda _: served.charge(key, order, delay=1), range(50)))
    assert served.charges(order) == 1
    ran = [a for a in answers if a.status_code == 201 and REPLAYED not in a.headers]
    assert len(ran) == 1, [a.status_code for a in answers]
    for a in answers:
        if a.status_code == 409:
            problem(a, 409, "request-in-progress")
            assert int(a.headers["retry-after"]) >= 1
        else:
            assert a.status_code == 201 and a.content == ran[0].content
    assert served.charge(key, order).content == ran[0].content


def test_a_streamed_response_is_buffered_and_replayed(served: Served) -> None:
    key = unique("k")
    params, headers = {"chunks": 50, "size": 1000}, {"idempotency-key": f'"{key}"'}
    first = served.client.post("/export", params=params, headers=headers)
    assert first.status_code == 201 and len(first.content) == 50_000
    again = served.client.post("/export", params=params, headers=headers)
    assert again.headers[REPLAYED] == "true" and again.content == first.content


def test_a_response_over_the_limit_is_streamed_and_never_run_again(served: Served) -> None:
    key = unique("k")
    params, headers = {"chunks": 40, "size": 65536}, {"idempotency-key": f'"{key}"'}  # 2.5 MiB
    answer = served.client.post("/export", params=params, headers=headers)
    assert answer.status_code == 201 and len(answer.content) == 40 * 65536
    assert REPLAYED not in answer.headers
    again = served.client.post("/export", params=params, headers=headers)
    assert again.status_code == 422 and again.json()["type"].endswith("/response-too-large")
    assert again.json()["first_status"] == 201
    with served.store() as store:
        record = store.get(stored_key(key, "/export"))
    assert record is not None and record.status is Status.COMPLETED
    assert isinstance(record.result, dict) and record.result["too_large"] is True
    assert record.result["size"] == 40 * 65536 and record.result["body"] is None
    shown = idemctl(served.url, "inspect", stored_key(key, "/export"))
    assert shown.returncode == 0 and "too large to keep" in shown.stdout, shown.stdout


def test_each_store_keeps_a_body_up_to_its_own_limit(served: Served) -> None:
    """300 KiB: under max_body (1 MiB), over what a DynamoDB item holds (256 KiB of body):
    replayed on every other store; on DynamoDB completed without it, and never run twice."""
    key = unique("k")
    params, headers = {"chunks": 300, "size": 1024}, {"idempotency-key": key}
    first = served.client.post("/export", params=params, headers=headers)
    assert first.status_code == 201 and len(first.content) == 300 * 1024
    again = served.client.post("/export", params=params, headers=headers)
    if served.url.startswith("dynamodb"):
        problem(again, 422, "response-too-large")
    else:
        assert again.headers[REPLAYED] == "true" and again.content == first.content


def test_the_record_holds_the_response_readably_for_24_hours(served: Served) -> None:
    key, order = unique("k"), unique("o")
    answer = served.charge(key, order)
    with served.store() as store:
        record = store.get(stored_key(key))
    assert record is not None and record.status is Status.COMPLETED
    result = record.result
    assert isinstance(result, dict)
    assert (result["method"], result["path"], result["status"]) == ("POST", "/charges", 201)
    assert result["size"] == len(answer.content)
    assert base64.b64decode(result["body"]) == answer.content
    assert record.completed_at is not None and record.expires_at is not None
    assert (record.expires_at - record.completed_at).total_seconds() == pytest.approx(86400, abs=2)


def idemctl(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI on ``url``, its lines wide enough that rich folds no body."""
    return subprocess.run(
        [sys.executable, "-m", "idemctl", "--store", url, *args],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "COLUMNS": "250"},
    )  # fmt: skip


def test_the_operator_commands_read_and_free_http_keys(served: Served) -> None:
    key, order = unique("k"), unique("o")
    charged = served.charge(key, order)
    shown = idemctl(served.url, "inspect", stored_key(key))
    assert shown.returncode == 0, shown.stderr
    assert "POST /charges -> 201 Created" in shown.stdout, shown.stdout
    assert charged.json()["id"] in shown.stdout, shown.stdout  # the body, as text
    listed = idemctl(served.url, "list", "--prefix", f"http:-:POST:/charges:{key}", "--json")
    assert listed.returncode == 0, listed.stderr
    listed_keys = [json.loads(line)["key"] for line in listed.stdout.splitlines()]
    assert listed_keys == [stored_key(key)], listed.stdout + listed.stderr
    forgot = idemctl(served.url, "forget", stored_key(key))
    assert forgot.returncode == 0, forgot.stderr
    again = served.charge(key, order)  # forgotten: the request runs again
    assert again.status_code == 201 and REPLAYED not in again.headers
    assert served.charges(order) == 2
