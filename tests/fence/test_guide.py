"""The "Fence your effects" guide's blocks that need a server, run as written against the
real one (redis-server, moto's DynamoDB server, the example service under uvicorn); the
guide's SQLite block runs alone in tests/docs/test_blocks.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.blocks import REPO, blocks
from tests.fence.test_dynamodb import make_table
from tests.http.servers import AppServer
from tests.servers import MotoServer, RedisServer

GUIDE = REPO / "docs" / "guides" / "fence.md"


def run_block(test: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """Runs the guide's block that names ``test`` as its own, in an empty directory."""
    (block,) = [b for b in blocks(GUIDE) if b.options.get("tested-by", "").endswith(f"::{test}")]
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__docs__"}
    exec(compile(block.text, block.where, "exec", dont_inherit=True), namespace)
    return namespace


def test_the_redis_block_runs_on_redis_server(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import redis

    url = f"redis://127.0.0.1:{redis_server.port}/3"
    with redis.Redis.from_url(url) as r:
        r.flushdb()
    monkeypatch.setenv("REDIS_URL", url)
    run_block("test_the_redis_block_runs_on_redis_server", tmp_path, monkeypatch)
    with redis.Redis.from_url(url) as r:
        assert r.xlen("shipments") == 1 and r.hget("order:7", "status") == b"shipped"
        assert 0 < r.pttl("shipment:7") <= 86_400_000


def test_the_dynamodb_block_runs_on_motos_server(
    moto_server: MotoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = moto_server.client()
    table = make_table(client)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.endpoint_url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("CHARGES_TABLE", table)
    try:
        run_block("test_the_dynamodb_block_runs_on_motos_server", tmp_path, monkeypatch)
        got = client.get_item(TableName=table, Key={"payment": {"S": "pay-9"}})["Item"]
        assert got["idemctl_token"] == {"N": "8"} and got["refunded"] == {"BOOL": False}
    finally:
        client.delete_table(TableName=table)


def test_the_http_block_runs_against_the_example_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3

    ledger = tmp_path / "service.db"
    app = "examples.fence.service:app"
    with AppServer("uvicorn", "memory://", ledger, tmp_path, app=app) as service:
        monkeypatch.setenv("CHARGES_URL", service.base_url)
        ran = run_block(
            "test_the_http_block_runs_against_the_example_service", tmp_path, monkeypatch
        )
    token = ran["done"].fencing_token  # type: ignore[attr-defined]
    with sqlite3.connect(ledger) as db:
        rows = db.execute("SELECT payment, idemctl_key, idemctl_token FROM charges").fetchall()
    assert rows == [("pay-3", "pay-3", token)]
