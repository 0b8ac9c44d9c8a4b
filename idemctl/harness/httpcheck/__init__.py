"""``idemctl verify --http URL``: a running HTTP API's ``Idempotency-Key`` handling, checked
with the user's own request against the cases of the IETF draft
(draft-ietf-httpapi-idempotency-key-header) and Stripe's rules.

Each point sends the user's request (``HttpTarget``: method, URL, body, headers) with a key of
its own (``verify-`` and a uuid4; as the draft's Structured Field string ``"..."`` unless
``bare_key``) and judges what came back:

- ``missing-key``: without the key header: 400; an API that runs it anyway is reported
  (warn: it does not require keys);
- ``replay``: the same request again: the first answer, status, Content-Type and body byte
  for byte (``Idempotent-Replayed`` noted where the API sends it);
- ``other-payload``: the same key with another body: 422 (another 4xx passes, named);
- ``concurrent``: ``concurrency`` requests at once with one new key: one original, every
  other a 409 or its replay, no second resource; and a request after them: its replay;
- ``server-error``: a request the API answers with a 5xx (``fault_path``, ``fault_body``),
  retried with its key: it runs again or its 5xx is replayed, never is the key left held
  (409) or refused; skipped when no way to make a 5xx is given;
- ``two-callers``: the same key and body from another caller (``second_caller``'s
  headers): an answer of its own, never the first caller's, and each caller's retry its
  own answer; skipped without a second caller;
- ``invalid-key``: a key with a control character (a tab), and one of 256 characters: 400.

``{uuid}`` in the body (and in ``fault_body``) is replaced by a fresh uuid4 for each point
(the same in a point's retries), so an API that refuses a second order of one id still
sees a new order each time; another payload is the body with another ``{uuid}``, else the
body with a member (JSON) or a pair (form) added.

Only the standard library (``http.client`` and threads): the base install has no HTTP
client. No printing: ``check_api`` returns a ``HttpReport``, ``on_point`` hears each point as
it is judged. Header values that may be credentials are kept in the report only masked.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from idemctl.harness.httpcheck.cases import LONG_KEY, PLACEHOLDER, Checker
from idemctl.harness.httpcheck.client import REPLAYED, Answer
from idemctl.harness.httpcheck.report import (
    FAIL,
    PASS,
    SKIP,
    TITLES,
    VERDICTS,
    WARN,
    HttpReport,
    Point,
)
from idemctl.harness.httpcheck.target import HttpTarget, Unreachable, header_pair, masked, merged
from idemctl.urls import redact_url

__all__ = [
    "FAIL",
    "LONG_KEY",
    "PASS",
    "PLACEHOLDER",
    "REPLAYED",
    "SKIP",
    "TITLES",
    "VERDICTS",
    "WARN",
    "Answer",
    "HttpReport",
    "HttpTarget",
    "Point",
    "Unreachable",
    "check_api",
    "header_pair",
    "masked",
    "merged",
]


def check_api(
    target: HttpTarget, on_point: Callable[[Point], None] = lambda point: None
) -> HttpReport:
    """Send every case to the API at ``target.url`` and judge each; Unreachable when its
    host takes no connection (checked first, before any request is sent)."""
    target.check()
    checker = Checker(target)
    checker.reach()
    started = time.monotonic()
    points = []
    for case in (
        checker.missing_key,
        checker.replay,
        checker.other_payload,
        checker.concurrent,
        checker.server_error,
        checker.two_callers,
        checker.invalid_key,
    ):
        point = case()
        points.append(point)
        on_point(point)
    return HttpReport(
        url=redact_url(target.url),
        method=target.method,
        key_header=target.key_header,
        key_form="bare" if target.bare_key else "string",
        headers=tuple((n, masked(n, v)) for n, v in target.headers),
        second_caller=tuple((n, masked(n, v)) for n, v in target.second_caller),
        points=tuple(points),
        marks_replays=checker.marks_replays,
        seconds=time.monotonic() - started,
    )
