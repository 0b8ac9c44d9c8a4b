"""DynamoDB's sparse index of keys in progress (stores/dynamodb/inprogress.py), on moto's
server: an item carries ``ip_shard`` exactly while its key is in progress; the in-progress
listings and ``unlock_stale`` Query the index and issue no Scan; pages cross the shards
and give every key once; ``init`` adds the index to a table made before it and marks the
keys already in progress."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from idemctl import Acquired, ClaimRequest, Status
from idemctl.stores.dynamodb import DynamoDBStore
from idemctl.stores.dynamodb.items import SHARDS
from tests.backends import unique_table
from tests.servers import MotoServer
from tests.stores.test_dynamodb import acquire, item, open_ddb

EXPIRED = 0.05


@pytest.fixture
def table() -> str:
    return unique_table()


@pytest.fixture
def url(moto_server: MotoServer, table: str) -> str:
    return moto_server.url(table)


@pytest.fixture
def store(url: str) -> Iterator[DynamoDBStore]:
    with open_ddb(url) as s:
        s.provision()
        yield s


@pytest.fixture
def raw(moto_server: MotoServer) -> Iterator[Any]:
    client = moto_server.client()
    yield client
    client.close()


@pytest.fixture
def requests(store: DynamoDBStore) -> Iterator[dict[str, int]]:
    """How many requests of each operation the store sends, from now on."""
    seen: dict[str, int] = {}

    def count(model: Any, **_: Any) -> None:
        seen[model.name] = seen.get(model.name, 0) + 1

    store.client.meta.events.register("before-call.dynamodb.*", count)
    yield seen
    store.client.meta.events.unregister("before-call.dynamodb.*", count)


def test_the_mark_is_there_exactly_while_in_progress(
    store: DynamoDBStore, raw: Any, table: str
) -> None:
    def marked(key: str) -> bool:
        found = item(raw, table, key)
        assert found is not None
        return "ip_shard" in found

    a = acquire(store, "done")
    assert marked("done")
    store.complete("done", a.owner, a.fencing_token, "ok")
    assert not marked("done")

    f = acquire(store, "failed")
    store.fail("failed", f.owner, f.fencing_token, "boom", retriable=True)
    assert not marked("failed")
    acquire(store, "failed")  # a retriable failure claimed again: in progress again
    assert marked("failed")

    r = acquire(store, "released")
    store.release("released", r.owner, r.fencing_token)
    assert marked("released")  # in progress, waiting for its next delivery
    store.unlock("released")
    assert marked("released")

    t = acquire(store, "taken", lease=EXPIRED)
    time.sleep(EXPIRED * 2)
    again = acquire(store, "taken")
    assert again.takeover and again.fencing_token == t.fencing_token + 1
    assert marked("taken")

    store.forget("taken", force=True)  # a tombstone: past retention, in progress no more
    assert not marked("taken")
    acquire(store, "taken")  # its next life
    assert marked("taken")


def test_listings_and_unlock_stale_query_the_index_and_never_scan(
    store: DynamoDBStore, requests: dict[str, int]
) -> None:
    outcomes = store.claim_many([ClaimRequest(f"stale-{i}") for i in range(6)], lease=EXPIRED)
    assert all(isinstance(o, Acquired) for o in outcomes)
    live = acquire(store, "live")
    released = acquire(store, "released")
    store.release("released", released.owner, released.fencing_token)
    done = acquire(store, "done")
    store.complete("done", done.owner, done.fencing_token, None)
    time.sleep(EXPIRED * 2)
    requests.clear()

    stale = store.scan(stale_only=True, limit=100)
    assert sorted(r.key for r in stale.records) == [f"stale-{i}" for i in range(6)]
    assert [r.key for r in store.scan(released_only=True).records] == ["released"]
    in_progress = store.scan(status=Status.IN_PROGRESS).records
    assert sorted(r.key for r in in_progress) == sorted(
        [*(f"stale-{i}" for i in range(6)), "live", "released"]
    )
    assert store.unlock_stale(dry_run=True) == [f"stale-{i}" for i in range(6)]
    assert store.unlock_stale() == [f"stale-{i}" for i in range(6)]
    assert store.scan(stale_only=True).records == []
    stats = store.stats()
    assert stats.counted_by == "approximate"
    assert (stats.by_status[Status.IN_PROGRESS], stats.stale, stats.released) == (8, 0, 7)

    assert requests.get("Scan", 0) == 0, requests
    assert requests["Query"] >= SHARDS  # each listing asks every shard
    assert live.key == "live"


def test_pages_cross_the_shards_and_give_every_key_once(store: DynamoDBStore) -> None:
    keys = [f"k-{i:03d}" for i in range(70)]
    assert all(
        isinstance(o, Acquired)
        for o in store.claim_many([ClaimRequest(k) for k in keys], lease=EXPIRED)
    )
    time.sleep(EXPIRED * 2)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = store.scan(stale_only=True, limit=8, cursor=cursor)
        assert len(page.records) <= 8
        seen += [r.key for r in page.records]
        pages += 1
        if page.cursor is None:
            break
        cursor = page.cursor
    assert sorted(seen) == keys and len(seen) == len(set(seen))
    assert pages >= 70 // 8


def test_init_adds_the_index_to_a_table_made_before_it(url: str, table: str, raw: Any) -> None:
    raw.create_table(  # as an idemctl before the index made it
        TableName=table,
        AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    store = open_ddb(url)
    try:
        for i in range(3):
            acquire(store, f"old-{i}", lease=EXPIRED)
        done = acquire(store, "done")
        store.complete("done", done.owner, done.fencing_token, None)
        for i in range(3):  # an earlier idemctl wrote no mark
            raw.update_item(
                TableName=table, Key={"key": {"S": f"old-{i}"}}, UpdateExpression="REMOVE ip_shard"
            )
        time.sleep(EXPIRED * 2)
        assert store.index_status() is None
        assert len(store.scan(stale_only=True).records) == 3  # by a scan, as before
        findings = {f.name: f for f in store.check()}
        assert findings["index"].warning and "idemctl init" in (findings["index"].fix or "")

        plan = store.provision(dry_run=True)
        assert any("UpdateTable" in step for step in plan.statements)
        assert store.index_status() is None
        done_plan = store.provision()
        assert "marked 3 key(s) in progress" in done_plan.statements
        assert store.index_status() == "ACTIVE"
        assert {f.name: f for f in store.check()}["index"].warning is False
        assert sorted(r.key for r in store.scan(stale_only=True).records) == [
            f"old-{i}" for i in range(3)
        ]
        assert store.stats().counted_by == "approximate"
        assert store.provision().changed is False
    finally:
        store.close()
