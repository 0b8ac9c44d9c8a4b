"""A client that hangs up mid-request (issue 58, finding 5), and the waits around it: a raw
socket sends a whole guarded request, waits until the server holds its key (the view has
begun), and closes. The tests then wait, with deadlines, for the view to end and its key to
settle, and retry."""

from __future__ import annotations

import socket

from idemctl.model import Record, Status
from tests.http.conftest import Served
from tests.polling import wait_until

DEADLINE = 60.0
"""Seconds a test waits for something that happens on its own (a claim, a view's end)."""


def record(served: Served, stored_key: str) -> Record | None:
    with served.store() as store:
        return store.get(stored_key)


def held(served: Served, stored_key: str) -> bool:
    """Whether a request holds ``stored_key`` now (the store says so)."""
    found = record(served, stored_key)
    return found is not None and found.status is Status.IN_PROGRESS and bool(found.owner)


def hang_up(served: Served, target: str, key: str, body: bytes, stored_key: str) -> None:
    """POST ``body`` to ``target`` (a path and query) with ``key``, and close the
    connection once the server holds the key, before any answer."""
    host, port = served.server.base_url.removeprefix("http://").split(":")
    head = (
        f"POST {target} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f'Content-Type: application/json\r\nIdempotency-Key: "{key}"\r\n'
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode("latin-1")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head + body)
        wait_until(lambda: held(served, stored_key), f"a request holds {stored_key}")
        sock.shutdown(socket.SHUT_RDWR)


def settled(served: Served, stored_key: str, order: str) -> Record:
    """Wait until the hung-up request's view has charged ``order`` and its key is held no
    more (completed, or released): the record then."""
    wait_until(lambda: served.charges(order) >= 1, f"the view charged {order}")
    wait_until(lambda: not held(served, stored_key), f"{stored_key} held no more")
    found = record(served, stored_key)
    assert found is not None
    return found
