"""What the fence costs a write: each fenced write of ``idemctl.fence`` against the same
plain write on the same store, in the same run, rounds alternating (plain then fenced, then
fenced then plain) so the machine's drift falls on both alike.

    .venv/bin/python benchmarks/fence.py [--ops 2000] [--rounds 5] [--only sqlite,redis,...]
        [--fsync on|off] [--json]

Pairs, each of ``--ops`` writes of distinct keys a round (an update: of rows made first):

- sqlite (a file, autocommit): ``INSERT ... ON CONFLICT DO UPDATE`` / ``fenced_insert``;
  ``UPDATE ... WHERE`` / ``fenced_update``;
- postgres (psycopg, autocommit; fsync on unless --fsync off): the same two;
- redis: ``SET`` / ``fenced_set``, ``HSET`` / ``fenced_hset``, ``XADD`` / ``fenced_xadd``;
- dynamodb (moto's server over HTTP: its Python dominates both): ``PutItem`` /
  ``fenced_put_item``.

Prints each pair's median µs a write and the ratio fenced / plain (target at most 1.3x).
Starts redis-server, a throwaway PostgreSQL cluster and moto's server on free loopback
ports and stops each by its PID.
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import HOST, BenchError, finish, free_port, stdout_console, stop_on_sigterm
from postgres_claims import own_postgres_server
from redis_claims import own_redis_server

from idemctl.fence import Fence
from idemctl.fence import redis as fr
from idemctl.fence.dynamodb import fenced_put_item
from idemctl.fence.sql import add_fence_columns, fenced_insert, fenced_update

TARGET = 1.3
STORES = ("sqlite", "postgres", "redis", "dynamodb")

Write = Callable[[int, str], None]
"""One write: (the op's number, the round's tag)."""


def timed(write: Write, ops: int, tag: str) -> float:
    started = time.perf_counter()
    for i in range(ops):
        write(i, tag)
    return (time.perf_counter() - started) / ops * 1e6


def pair(name: str, plain: Write, fenced: Write, ops: int, rounds: int) -> dict[str, Any]:
    """Median µs a write of each, over ``rounds`` alternating rounds (each on new keys)."""
    times: dict[str, list[float]] = {"plain": [], "fenced": []}
    timed(plain, min(ops, 200), "warm-p")
    timed(fenced, min(ops, 200), "warm-f")
    for r in range(rounds):
        order = [("plain", plain), ("fenced", fenced)]
        for kind, write in order if r % 2 == 0 else order[::-1]:
            times[kind].append(timed(write, ops, f"{kind[0]}{r}"))
    p, f = statistics.median(times["plain"]), statistics.median(times["fenced"])
    return {"pair": name, "plain_us": p, "fenced_us": f, "ratio": f / p, "rounds": times}


def sql_pairs(conn: Any, mark: str, ops: int, rounds: int) -> list[dict[str, Any]]:
    t = f"bench_{uuid.uuid4().hex[:8]}"
    conn.execute(f"CREATE TABLE {t} (payment TEXT PRIMARY KEY, cents INTEGER)")
    add_fence_columns(conn, t)
    upsert = (
        f"INSERT INTO {t} (payment, cents) VALUES ({mark}, {mark}) "
        "ON CONFLICT (payment) DO UPDATE SET cents = excluded.cents"
    )
    update = f"UPDATE {t} SET cents = {mark} WHERE payment = {mark}"

    def plain_insert(i: int, tag: str) -> None:
        conn.execute(upsert, (f"pi-{tag}-{i}", 100))

    def fenced_ins(i: int, tag: str) -> None:
        key = f"fi-{tag}-{i}"
        fenced_insert(conn, t, {"payment": key, "cents": 100}, Fence(key, 7), unique=["payment"])

    # the updates' rows: made once, each round updating them under a larger token
    rows = [(f"u-{i}", 1) for i in range(ops)]
    for row in rows:
        conn.execute(f"INSERT INTO {t} (payment, cents) VALUES ({mark}, {mark})", row)
    rounds_seen = iter(range(10, 10**6))
    now = [next(rounds_seen)]  # each round writes new values (a token larger than the last)

    def plain_update(i: int, tag: str) -> None:
        if i == 0:
            now[0] = next(rounds_seen)
        conn.execute(update, (now[0], f"u-{i}"))

    def fenced_upd(i: int, tag: str) -> None:
        if i == 0:
            now[0] = next(rounds_seen)
        fence = Fence(f"u-{i}", now[0])
        fenced_update(conn, t, {"cents": now[0]}, {"payment": f"u-{i}"}, fence)

    return [
        pair("insert (ledger row)", plain_insert, fenced_ins, ops, rounds),
        pair("update (a row)", plain_update, fenced_upd, ops, rounds),
    ]


def sqlite_pairs(ops: int, rounds: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="idemctl-bench-fence-") as tmp:
        conn = sqlite3.connect(Path(tmp) / "bench.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        try:
            return sql_pairs(conn, "?", ops, rounds)
        finally:
            conn.close()


def postgres_pairs(ops: int, rounds: int, fsync: bool) -> list[dict[str, Any]]:
    import psycopg

    with own_postgres_server(fsync) as (url, _pid), psycopg.connect(url, autocommit=True) as c:
        return sql_pairs(c, "%s", ops, rounds)


def redis_pairs(ops: int, rounds: int) -> list[dict[str, Any]]:
    import redis

    with own_redis_server() as url, redis.Redis.from_url(url) as r:
        fence = Fence("k", 7)
        fields = {"a": 1, "b": 2}

        def set_(i: int, tag: str) -> None:
            r.set(f"s:{tag}:{i}", "v")

        def fenced_set(i: int, tag: str) -> None:
            fr.fenced_set(r, f"s:{tag}:{i}", "v", fence)

        def hset(i: int, tag: str) -> None:
            r.hset(f"h:{tag}:{i}", mapping=fields)

        def fenced_hset(i: int, tag: str) -> None:
            fr.fenced_hset(r, f"h:{tag}:{i}", fields, fence)

        def xadd(i: int, tag: str) -> None:
            r.xadd(f"x:{tag}", {"payment": f"p{i}"})

        def fenced_xadd(i: int, tag: str) -> None:  # a key appends once: a key an entry
            fr.fenced_xadd(r, f"x:{tag}", {"payment": f"p{i}"}, Fence(f"p{i}", 7))

        return [
            pair("SET", set_, fenced_set, ops, rounds),
            pair("HSET", hset, fenced_hset, ops, rounds),
            pair("XADD", xadd, fenced_xadd, ops, rounds),
        ]


@contextlib.contextmanager
def own_moto_server() -> Iterator[str]:
    port = free_port()
    command = [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://{HOST}:{port}"
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                import socket

                socket.create_connection((HOST, port), timeout=1).close()
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise BenchError("moto's server did not start (pip install 'moto[server]')")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def dynamodb_pairs(ops: int, rounds: int) -> list[dict[str, Any]]:
    import boto3

    with own_moto_server() as url:
        ddb = boto3.client(
            "dynamodb", endpoint_url=url, region_name="us-east-1",
            aws_access_key_id="bench", aws_secret_access_key="bench",
        )  # fmt: skip
        ddb.create_table(
            TableName="charges",
            KeySchema=[{"AttributeName": "payment", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "payment", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )

        def plain(i: int, tag: str) -> None:
            item = {"payment": {"S": f"p-{tag}-{i}"}, "cents": {"N": "100"}}
            ddb.put_item(TableName="charges", Item=item)

        def fenced(i: int, tag: str) -> None:
            key = f"f-{tag}-{i}"
            fenced_put_item(ddb, {"payment": key, "cents": 100}, Fence(key, 7), table="charges")

        return [pair("PutItem", plain, fenced, ops, rounds)]


def work(args: argparse.Namespace) -> dict[str, Any]:
    chosen = args.only.split(",") if args.only else list(STORES)
    unknown = set(chosen) - set(STORES)
    if unknown:
        raise BenchError(f"--only: no store {', '.join(sorted(unknown))} ({', '.join(STORES)})")
    ops, rounds = args.ops, args.rounds
    results: dict[str, list[dict[str, Any]]] = {}
    for store in chosen:
        if store == "sqlite":
            results[store] = sqlite_pairs(ops, rounds)
        elif store == "postgres":
            results[store] = postgres_pairs(ops, rounds, args.fsync == "on")
        elif store == "redis":
            results[store] = redis_pairs(ops, rounds)
        else:
            results[store] = dynamodb_pairs(max(ops // 10, 50), rounds)
    return {"ops": ops, "rounds": rounds, "target": TARGET, "stores": results}


def report(data: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"a fenced write / the same plain write (target <= {TARGET}x)")
    for column in ("store", "write", "plain µs", "fenced µs", "ratio"):
        table.add_column(column, justify="left" if column in ("store", "write") else "right")
    for store, pairs in data["stores"].items():
        for p in pairs:
            ratio = f"{p['ratio']:.2f}x" + ("" if p["ratio"] <= TARGET else " (over)")
            table.add_row(store, p["pair"], f"{p['plain_us']:.1f}", f"{p['fenced_us']:.1f}", ratio)
    stdout_console().print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000, help="writes a round (DynamoDB: a tenth)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="", help=f"some of {','.join(STORES)}")
    parser.add_argument("--fsync", choices=("on", "off"), default="on")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    return finish("fence", lambda: work(args), report, args.json, driver="psycopg")


if __name__ == "__main__":
    sys.exit(main())
