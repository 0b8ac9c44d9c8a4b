"""Transactional mode over HTTP on PostgreSQL, under uvicorn (tests/http/tx_app.py, psycopg's
async connection) and gunicorn (tests/http/tx_wsgi_app.py, its sync one): the claim, the
app's INSERT on the attempt's connection and the stored response commit together, or none
of them does."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from psycopg import sql

from idemctl.model import Status
from tests.http.conftest import Served, serve, store_url, stored_key
from tests.servers import PostgresServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(
    params=[("uvicorn", "tests.http.tx_app:app"), ("gunicorn", "tests.http.tx_wsgi_app:app")],
    ids=["uvicorn", "gunicorn"],
)
def payments(
    request: pytest.FixtureRequest, postgres_server: PostgresServer, tmp_path: Path
) -> Iterator[tuple[Served, str]]:
    kind, app = request.param
    table = f"payments_{uuid.uuid4().hex[:12]}"
    with postgres_server.connect() as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (key text, amount int)").format(sql.Identifier(table))
        )
    url = store_url(request, "postgres", tmp_path)
    with serve(kind, url, tmp_path, app=app, env={"PAYMENTS": table}) as running:
        yield running, table


def rows(postgres_server: PostgresServer, table: str, key: str) -> int:
    with postgres_server.connect() as conn:
        query = sql.SQL("SELECT count(*) FROM {} WHERE key = %s").format(sql.Identifier(table))
        row = conn.execute(query, (key,)).fetchone()
    assert row is not None
    return int(row[0])


def pay(served: Served, key: str, **params: str) -> httpx.Response:
    return served.client.post(
        "/payments",
        content=b'{"amount": 7}',
        params=params,
        headers={"idempotency-key": f'"{key}"'},
    )


def test_the_apps_row_commits_with_the_stored_response(
    payments: tuple[Served, str], postgres_server: PostgresServer
) -> None:
    served, table = payments
    first = pay(served, "k1")
    assert first.status_code == 201 and first.json() == {"key": "k1", "amount": 7}
    again = pay(served, "k1")
    assert again.headers["idempotent-replayed"] == "true" and again.content == first.content
    assert rows(postgres_server, table, "k1") == 1
    with served.store() as store:
        record = store.get(stored_key("k1", "/payments"))
    assert record is not None and record.status is Status.COMPLETED


@pytest.mark.parametrize("how", ["fail", "raise"])
def test_a_response_not_stored_rolls_back_the_apps_row_and_the_key(
    payments: tuple[Served, str], postgres_server: PostgresServer, how: str
) -> None:
    served, table = payments
    assert pay(served, "k2", **{how: "1"}).status_code == 500
    assert rows(postgres_server, table, "k2") == 0
    with served.store() as store:
        assert store.get(stored_key("k2", "/payments")) is None
    assert pay(served, "k2").status_code == 201  # the retry runs, once
    assert rows(postgres_server, table, "k2") == 1
