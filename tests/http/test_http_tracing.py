"""The HTTP middleware's span, ``idemctl.http``, read back from OpenTelemetry's SDK in a
process of its own: one per guarded request, with the outcome, the hashed key, the method
and path; none for a request passed through."""

from __future__ import annotations

import hashlib

from tests.traces import spans_of

BODY = r"""
from werkzeug.test import Client
from idemctl.http.wsgi import IdempotencyMiddleware
from idemctl.stores.memory import MemoryStore

def app(environ, start_response):
    start_response("201 Created", [("Content-Type", "text/plain")])
    return [b"ok"]

client = Client(IdempotencyMiddleware(app, store=MemoryStore()))
for _ in range(2):
    client.post("/charges", data=b"{}", headers={"Idempotency-Key": '"k1"'})
client.get("/charges")  # not guarded: no span
"""


def test_each_guarded_request_has_a_span_with_its_outcome() -> None:
    spans = [s for s in spans_of(BODY) if s["name"] == "idemctl.http"]
    assert [s["attributes"]["idemctl.outcome"] for s in spans] == ["new", "replayed"]
    digest = hashlib.sha256(b"http:-:POST:/charges:k1").hexdigest()[:16]
    for span in spans:
        assert span["attributes"]["idemctl.key"] == digest  # hashed: a key may be personal
        assert span["attributes"]["http.request.method"] == "POST"
        assert span["attributes"]["url.path"] == "/charges"
