"""The fence's headers and the stale-fence problem, read and written without a server (the
takeover over a real uvicorn is in test_takeover.py)."""

from __future__ import annotations

import json

import httpx
import pytest

from idemctl.errors import LeaseLost, StaleFence
from idemctl.fence import Fence
from idemctl.fence.http import (
    STALE_FENCE,
    BadFenceHeaders,
    fence_from_headers,
    fence_headers,
    raise_if_stale,
    stale_fence_problem,
)


def test_the_headers_carry_the_fence_and_read_back_in_any_case() -> None:
    fence = Fence("9b1deb4d-3b7d-4bad", 42)
    sent = fence_headers(fence)
    assert sent == {"Idempotency-Key": "9b1deb4d-3b7d-4bad", "Fencing-Token": "42"}
    assert fence_from_headers(sent) == fence
    asgi = [(k.lower().encode(), v.encode()) for k, v in sent.items()]  # as ASGI scopes hold them
    assert fence_from_headers(asgi) == fence
    shouted = httpx.Headers({"FENCING-TOKEN": " 42 ", "idempotency-key": fence.key})
    assert fence_from_headers(shouted) == fence


def test_a_request_without_a_token_is_unfenced() -> None:
    assert fence_from_headers({"Idempotency-Key": "k"}) is None
    assert fence_from_headers([]) is None


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        ({"Fencing-Token": "3"}, "without the Idempotency-Key"),
        ({"Idempotency-Key": "k", "Fencing-Token": "-1"}, "not a whole number"),
        ({"Idempotency-Key": "k", "Fencing-Token": "1e3"}, "not a whole number"),
        ({"Idempotency-Key": "k", "Fencing-Token": "٣"}, "not a whole number"),  # not ASCII
        ({"Idempotency-Key": "k", "Fencing-Token": str(2**63)}, "not a whole number"),
        ([(b"fencing-token", b"1"), (b"fencing-token", b"2"), (b"idempotency-key", b"k")], "twice"),
    ],
)
def test_unreadable_fence_headers_are_refused_saying_why(headers: object, says: str) -> None:
    with pytest.raises(BadFenceHeaders, match=says):
        fence_from_headers(headers)  # type: ignore[arg-type]


def test_the_problem_round_trips_into_the_callers_stale_fence() -> None:
    status, headers, body = stale_fence_problem(StaleFence("charges", "pay-1", 3, 4))
    assert status == 409 and headers["content-type"] == "application/problem+json"
    doc = json.loads(body)
    assert doc["type"] == STALE_FENCE and doc["status"] == 409 and doc["title"]
    response = httpx.Response(status, headers=headers, content=body)
    with pytest.raises(StaleFence) as caught:
        raise_if_stale(response)
    stale = caught.value
    assert (stale.resource, stale.key, stale.token, stale.last) == ("charges", "pay-1", 3, 4)
    assert isinstance(stale, LeaseLost)  # the runner's "this attempt lost its key"


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(201, json={"charged": "pay-1"}),
        httpx.Response(409, json={"type": "https://example.com/conflict", "status": 409}),
        httpx.Response(409, content=b"<html>conflict</html>"),
        httpx.Response(500, json={"type": STALE_FENCE}),
    ],
)
def test_other_answers_are_left_to_the_caller(response: httpx.Response) -> None:
    raise_if_stale(response)


def test_a_stale_fence_problem_without_its_fields_still_refuses() -> None:
    with pytest.raises(StaleFence, match="pay-1"):
        raise_if_stale(httpx.Response(409, json={"type": STALE_FENCE, "key": "pay-1"}))
