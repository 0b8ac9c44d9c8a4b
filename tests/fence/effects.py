"""One charge through each fenced helper, for the takeover tests: ``write(kind, target,
fence)`` lands it, ``landed(kind, target)`` reads back the writes there as (key, token).
Imported by the test and by the holder process it stops (``python -m tests.fence.effects``).

``target`` is JSON: ``{"path": ...}`` (sqlite), ``{"dsn": ...}`` (postgres), ``{"port":
...}`` (redis-*), ``{"endpoint": ...}`` (dynamodb), ``{"url": ..., "path": ...}`` (http:
the service of examples/fence/service.py, its ledger), and ``"name"``, the table, key
or stream of the test's own (http: the service's table, ``charges``, made by the service)."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import sys
import time
from contextlib import closing
from typing import Any

from idemctl.fence import Fence

KINDS = ("sqlite", "postgres", "redis-set", "redis-hset", "redis-xadd", "dynamodb", "http")


def _sql(kind: str, target: dict[str, Any]) -> Any:
    if kind in ("sqlite", "http"):
        return sqlite3.connect(target["path"], isolation_level=None, timeout=30)
    import psycopg

    return psycopg.connect(target["dsn"], autocommit=True)


def _redis(target: dict[str, Any]) -> Any:
    import redis

    return redis.Redis(host="127.0.0.1", port=target["port"], decode_responses=True)


def _dynamodb(target: dict[str, Any]) -> Any:
    import boto3

    return boto3.client("dynamodb", endpoint_url=target["endpoint"], region_name="us-east-1")


def prepare(kind: str, target: dict[str, Any]) -> None:
    """Make the test's table (a charges table with the fence's columns)."""
    name = target["name"]
    if kind in ("sqlite", "postgres"):
        from idemctl.fence.sql import add_fence_columns

        with closing(_sql(kind, target)) as c:
            c.execute(f"CREATE TABLE {name} (payment TEXT PRIMARY KEY, cents INTEGER)")
            add_fence_columns(c, name)
    elif kind == "dynamodb":
        _dynamodb(target).create_table(
            TableName=name,
            KeySchema=[{"AttributeName": "payment", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "payment", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )


def write(kind: str, target: dict[str, Any], fence: Fence) -> None:
    name = target["name"]
    if kind in ("sqlite", "postgres"):
        from idemctl.fence.sql import fenced_insert

        with closing(_sql(kind, target)) as c:
            row = {"payment": fence.key, "cents": 100}
            fenced_insert(c, name, row, fence, unique=["payment"])
    elif kind.startswith("redis-"):
        from idemctl.fence import redis as fr

        with _redis(target) as r:
            if kind == "redis-set":
                fr.fenced_set(r, name, "charged", fence)
            elif kind == "redis-hset":
                fr.fenced_hset(r, name, {"status": "charged", "cents": 100}, fence)
            else:
                fr.fenced_xadd(r, name, {"payment": fence.key, "cents": 100}, fence)
    elif kind == "dynamodb":
        from idemctl.fence.dynamodb import fenced_put_item

        item = {"payment": fence.key, "cents": 100}
        fenced_put_item(_dynamodb(target), item, fence, table=name)
    elif kind == "http":
        import httpx

        from idemctl.fence.http import fence_headers, raise_if_stale

        url = f"{target['url']}/charges/{fence.key}"
        response = httpx.post(url, headers=fence_headers(fence), timeout=30)
        raise_if_stale(response)  # the service refused the token: StaleFence
        response.raise_for_status()
    else:
        raise ValueError(kind)


def landed(kind: str, target: dict[str, Any]) -> list[tuple[str, int]]:
    """The charges there, each as the (key, token) that wrote it."""
    name = target["name"]
    if kind in ("sqlite", "postgres", "http"):
        with closing(_sql(kind, target)) as c:
            rows = c.execute(f"SELECT idemctl_key, idemctl_token FROM {name}").fetchall()
            return [(k, int(t)) for k, t in rows]
    if kind.startswith("redis-"):
        from idemctl.fence.redis import fence_key

        with _redis(target) as r:
            fence = r.hgetall(fence_key(name))
            if kind == "redis-xadd":
                entries = r.xrange(name)
                tokens = {k: int(v.split()[0]) for k, v in fence.items()}
                return [(f["payment"], tokens[f["payment"]]) for _, f in entries]
            present = r.exists(name) and (kind != "redis-hset" or r.hget(name, "cents") == "100")
            return [(fence["key"], int(fence["token"]))] if present else []
    from boto3.dynamodb.types import TypeDeserializer

    items = _dynamodb(target).scan(TableName=name, ConsistentRead=True)["Items"]
    d = TypeDeserializer().deserialize
    return [(d(i["idemctl_key"]), int(d(i["idemctl_token"]))) for i in items]


def main() -> None:
    """The holder: runs ``pay-1`` with a 1 s lease; its handler says when it is in, waits
    for the go file (a stand-in for work that takes long), then charges through the fence."""
    from idemctl import open_store
    from idemctl.runner import run

    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    store_url, kind, target, go = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]

    def charge(ctx: Any) -> str:
        print("running", ctx.attempt, ctx.fencing_token, flush=True)
        while not os.path.exists(go):
            time.sleep(0.01)
        write(kind, target, ctx.fence)
        return "charged"

    with open_store(store_url) as store:
        store.provision()
        result = run(store, "pay-1", charge, lease=1)
    print("outcome", result.outcome.value, flush=True)


if __name__ == "__main__":
    main()
