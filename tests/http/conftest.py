"""The example apps (examples/http) under uvicorn and gunicorn, on a store of each family.

``served``: one server per (server, store) for a test module, its ledger shared by the
module's tests (each test charges orders of its own and counts their lines).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from idemctl import open_store
from idemctl.stores.base import Store
from tests.backends import BACKENDS
from tests.http.servers import AppServer

SERVERS = ("uvicorn", "gunicorn")
MATRIX = [
    *((server, family) for server in SERVERS for family in ("sqlite", "redis")),
    ("uvicorn", "postgres"),
    ("gunicorn", "dynamodb"),
]
"""Both servers on SQLite and Redis; PostgreSQL and DynamoDB under one server each (the
server changes nothing the store sees, and every family runs in CI's time)."""


def store_url(request: pytest.FixtureRequest, family: str, directory: Path) -> str:
    """A store of ``family`` of its own, provisioned (any scope: SQLite in ``directory``)."""
    url = f"sqlite:///{directory}/http.db" if family == "sqlite" else BACKENDS[family](request).url
    with open_store(url) as store:
        store.provision()
    return url


@dataclass
class Served:
    """An example app running, and what a test asks of it."""

    server: AppServer
    client: httpx.Client
    url: str

    def charge(
        self,
        key: str | None,
        order: str,
        amount: int = 500,
        *,
        delay: float = 0,
        auth: str | None = None,
        header: str | None = None,
        body: bytes | None = None,
    ) -> httpx.Response:
        """POST /charges with ``key`` as a Structured Field string (``header``: the raw
        header value instead)."""
        headers = {"content-type": "application/json"}
        if header is not None:
            headers["idempotency-key"] = header
        elif key is not None:
            headers["idempotency-key"] = f'"{key}"'
        if auth is not None:
            headers["authorization"] = auth
        content = (
            body
            if body is not None
            else b'{"order": "%s", "amount": %d}'
            % (
                order.encode(),
                amount,
            )
        )
        if delay:  # a header: a retry without it is still the same request (the query is not)
            headers["x-delay"] = str(delay)
        return self.client.post("/charges", content=content, headers=headers)

    def charges(self, order: str) -> int:
        """How many times ``order`` was charged (its lines in the ledger)."""
        ledger = self.server.ledger
        lines = ledger.read_text().splitlines() if ledger.exists() else []
        return lines.count(order)

    def store(self) -> Store:
        return open_store(self.url)


def stored_key(key: str, path: str = "/charges", caller: str = "-") -> str:
    return f"http:{caller}:POST:{path}:{key}"


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:10]}"


def problem(response: httpx.Response, status: int, name: str) -> dict[str, Any]:
    """The response's RFC 9457 problem, checked to be ``name`` with ``status``."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    doc: dict[str, Any] = response.json()
    assert doc["type"].endswith("/" + name), doc
    assert doc["status"] == status and doc["title"] and doc["detail"]
    return doc


@contextmanager
def serve(
    kind: str,
    url: str,
    directory: Path,
    *,
    app: str = "",
    ledger: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[Served]:
    """``kind`` serving the example app (or ``app``) on the store at ``url``, with ``env``
    in its environment."""
    directory.mkdir(parents=True, exist_ok=True)
    ledger = ledger or directory / f"{kind}.ledger"
    server = AppServer(kind, url, ledger, directory, app=app, **(env or {}))
    server.start(timeout=60)
    try:
        with httpx.Client(base_url=server.base_url, timeout=90) as client:
            yield Served(server, client, url)
    finally:
        server.stop()


@pytest.fixture(
    scope="module",
    params=MATRIX,
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    kind, family = request.param
    directory = tmp_path_factory.mktemp(f"http-{kind}-{family}")
    with serve(kind, store_url(request, family, directory), directory) as running:
        yield running
