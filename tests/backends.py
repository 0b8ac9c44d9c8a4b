"""Every store the suites run on. A new backend joins by adding one entry to KINDS: a
function that takes pytest's request and returns a Backend (starting its server through a
session fixture if it needs one), and its traits, from which every per-backend list of the
suites is drawn (``backends(where)``)."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from idemctl.aio import AsyncStore
from idemctl.model import Entity, Record
from idemctl.stores import open_store
from idemctl.stores.base import Store


@dataclass
class Backend:
    name: str
    url: str
    """Opens the same store from another process; empty for stores that live in one process."""
    open: Callable[[], Store]
    reset: Callable[[], None] = lambda: None
    open_async: Callable[[], AsyncStore] | None = None
    """The store on idemctl.aio; by default ``aio.wrap(open())``."""
    api: str = "sync"
    """Which API the contract suite drives it through: sync, or async (tests/contract/api.py)."""


def _memory(request: pytest.FixtureRequest) -> Backend:
    from idemctl.stores.memory import MemoryStore

    store = MemoryStore()
    return Backend("memory", "", lambda: store)


def _sqlite(request: pytest.FixtureRequest) -> Backend:
    tmp = request.getfixturevalue("tmp_path")
    url = f"sqlite:///{tmp}/contract.db"
    return Backend("sqlite", url, lambda: open_store(url))


def unique_prefix() -> str:
    """A key prefix of its own for one test: tests sharing a server never see each other's keys."""
    return f"t-{uuid.uuid4().hex}:"


def _provisioned(url: str) -> Callable[[], Store]:
    """Opens the store at ``url``, provisioned: on Redis, ``init`` marks the index ready, so
    the operator's operations read it (fakeredis, never provisioned, walks every key)."""

    def open_provisioned() -> Store:
        store = open_store(url)
        store.provision()
        return store

    return open_provisioned


def _redis(request: pytest.FixtureRequest) -> Backend:
    server = request.getfixturevalue("redis_server")
    url = f"redis://127.0.0.1:{server.port}/0?prefix={unique_prefix()}"
    return Backend("redis", url, _provisioned(url))


def _redis_cluster(request: pytest.FixtureRequest) -> Backend:
    cluster = request.getfixturevalue("redis_cluster")
    url = f"redis+cluster://127.0.0.1:{cluster.port}?prefix={unique_prefix()}"
    return Backend("redis-cluster", url, _provisioned(url))


def _fakeredis(request: pytest.FixtureRequest) -> Backend:
    """The Redis store over fakeredis, in this process: its Lua runs in lupa."""
    from tests.conftest import need

    try:
        import fakeredis
        import lupa  # noqa: F401 - fakeredis runs EVAL/EVALSHA only with lupa installed
    except ImportError:
        need(False, "fakeredis[lua] is not installed (pip install -e '.[dev]')")
        raise
    from idemctl.stores.redis import RedisStore

    server = fakeredis.FakeServer()
    prefix = unique_prefix()

    def open_fake() -> Store:
        return RedisStore(
            fakeredis.FakeRedis(server=server, decode_responses=True),
            url="redis://fake",
            prefix=prefix,
        )

    def open_fake_async() -> AsyncStore:
        from idemctl.stores.redis.store_async import AsyncRedisStore

        sync = open_fake()
        assert isinstance(sync, RedisStore)
        return AsyncRedisStore(sync, fakeredis.FakeAsyncRedis(server=server, decode_responses=True))

    return Backend("fakeredis", "", open_fake, open_async=open_fake_async)


def unique_schema() -> str:
    """A PostgreSQL schema of its own for one test (tests share one server)."""
    return f"t_{uuid.uuid4().hex}"


def _postgres(request: pytest.FixtureRequest) -> Backend:
    server = request.getfixturevalue("postgres_server")
    url = server.url(schema=unique_schema())

    def open_provisioned() -> Store:
        store = open_store(url)
        store.provision()
        return store

    def provision() -> None:
        # Before any worker process opens the URL (the race test opens it only there).
        open_provisioned().close()

    return Backend("postgres", url, open_provisioned, provision)


def unique_table() -> str:
    """A DynamoDB table of its own for one test (tests share one moto server)."""
    return f"t-{uuid.uuid4().hex}"


def _dynamodb(request: pytest.FixtureRequest) -> Backend:
    """The DynamoDB store on the session's moto server, in a table of the test's own."""
    server = request.getfixturevalue("moto_server")
    url = server.url(unique_table())

    def open_provisioned() -> Store:
        store = open_store(url)
        store.provision()
        return store

    def provision() -> None:
        # Before any worker process opens the URL (the race test opens it only there).
        open_provisioned().close()

    return Backend("dynamodb", url, open_provisioned, provision)


@dataclass(frozen=True)
class Kind:
    """A backend of the registry, and what the tests may rely on it to be: every
    per-backend list and table of the suites is drawn from these traits."""

    make: Callable[[pytest.FixtureRequest], Backend]
    family: str
    """The store's driver: sqlite, memory, redis, postgres or dynamodb."""
    by_url: bool = True
    """Another process opens it by URL (the CLI, a race's workers): the CLI suites' stores."""
    first_of_family: bool = False
    """Where a suite that runs one store of each family runs this family."""
    slow: bool = False
    """Its server answers slowly (moto): suites that need many round trips leave it out."""
    transactional: bool = False
    """Claim, the handler's SQL and completion can share one transaction."""
    provisions: str = ""
    """What ``idemctl init`` makes, as doctor names it when missing: schema, table, scripts."""
    init_marker: str = ""
    """What ``idemctl init --dry-run`` shows that it would run."""
    readable_bare: bool = False
    """Readable before ``idemctl init`` (Redis keeps its scripts server-wide)."""
    counted_by: str = ""
    """What ``stats`` counts by once provisioned: query, index or scan (approximate)."""
    own_cursor: bool = False
    """Its list cursor is its own encoding (a bad one is a usage error)."""
    durable_here: bool = True
    """Doctor finds it durable as the tests run it (the test redis-server has no
    persistence)."""
    clock: str = "server"
    """Whose clock its leases and retention run on: the server's, or this machine's."""
    counts_by_second: bool = False
    """Its counts drop a record only once the second its retention ends is over."""
    unreachable: Callable[[int], str] | None = None
    """A URL of its kind where nothing listens on ``port`` (and that gives up within a second)."""


_REDIS = Kind(
    _redis,
    "redis",
    first_of_family=True,
    provisions="scripts",
    init_marker="SCRIPT LOAD",
    readable_bare=True,
    counted_by="index",
    own_cursor=True,
    durable_here=False,
    counts_by_second=True,
    unreachable=lambda port: f"redis://127.0.0.1:{port}/0",
)
"""One server; a cluster is the same but for its URL (and is not the family's first)."""

KINDS: dict[str, Kind] = {
    "memory": Kind(_memory, "memory", by_url=False, clock="local"),
    "sqlite": Kind(
        _sqlite,
        "sqlite",
        first_of_family=True,
        provisions="schema",
        init_marker="CREATE TABLE IF NOT EXISTS idem_keys",
        counted_by="query",
        clock="local",
    ),
    "redis": _REDIS,
    "redis-cluster": replace(
        _REDIS,
        make=_redis_cluster,
        first_of_family=False,
        unreachable=lambda port: f"redis+cluster://127.0.0.1:{port}",
    ),
    "fakeredis": Kind(_fakeredis, "redis", by_url=False, counts_by_second=True),
    "postgres": Kind(
        _postgres,
        "postgres",
        first_of_family=True,
        transactional=True,
        provisions="schema",
        init_marker="CREATE TABLE",
        counted_by="query",
        unreachable=lambda port: f"postgresql://app:pw@127.0.0.1:{port}/db?connect_timeout=1s",
    ),
    "dynamodb": Kind(
        _dynamodb,
        "dynamodb",
        first_of_family=True,
        slow=True,
        provisions="table",
        init_marker="CreateTable",
        counted_by="scan",
        own_cursor=True,
        unreachable=lambda port: (
            f"dynamodb://tbl?region=us-east-1&endpoint_url=http://127.0.0.1:{port}"
            "&connect_timeout=1s&max_attempts=1"
        ),
    ),
}

BACKENDS: dict[str, Callable[[pytest.FixtureRequest], Backend]] = {
    name: kind.make for name, kind in KINDS.items()
}


def backends(where: Callable[[Kind], bool] = lambda kind: True) -> list[str]:
    """The names of the backends whose traits ``where`` accepts, in the registry's order."""
    return [name for name, kind in KINDS.items() if where(kind)]


BY_URL = backends(lambda k: k.by_url)
"""The stores another process opens by URL: every CLI command runs on each (memory://
lives in one process, and fakeredis in the test's)."""
FAMILIES = backends(lambda k: k.by_url and k.first_of_family)
"""One store of each family: sqlite, redis, postgres, dynamodb."""
QUICK_FAMILIES = backends(lambda k: k.by_url and k.first_of_family and not k.slow)
"""One store of each family whose server answers quickly: what the consume suites run on."""


# The store's clock, set by the test -----------------------------------------------------------
# A test that needs a lease run out, or a record older than X, writes those times into the
# store (every backend, directly: SQL, a Lua script, UpdateItem, the dict) rather than
# sleeping and hoping that the next step is quick: a loaded machine then changes nothing.

_RECORD_TIMES = {
    "sqlite": ("created_at", "updated_at", "completed_at", "lease_expires_at"),
    "redis": ("created", "updated", "completed", "lease"),
    "dynamodb": ("created_at", "updated_at", "completed_at", "lease_expires_at"),
}
_ENTITY_TIMES = {
    "sqlite": ("applied_at", "updated_at", "lock_expires_at"),
    "redis": ("applied", "updated", "lock"),
    "dynamodb": ("applied_at", "updated_at", "lock_expires_at"),
}

# KEYS[1] a record or an entity, KEYS[2] the index's LIVE set of its slot; ARGV[1] ms to take
# off, then the fields to move. LIVE scores an in-progress record by its lease: moved with it
# (XX: only a key LIVE holds already).
_SHIFT_LUA = """
local text = redis.call('GET', KEYS[1])
if not text then return 0 end
local rec = cjson.decode(text)
local by = tonumber(ARGV[1])
for i = 2, #ARGV do
  local v = rec[ARGV[i]]
  if v ~= nil and v ~= '' then rec[ARGV[i]] = string.format('%d', tonumber(v) - by) end
end
redis.call('SET', KEYS[1], cjson.encode(rec), 'KEEPTTL')
if rec.status == 'in_progress' and rec.lease ~= nil and rec.lease ~= '' then
  redis.call('ZADD', KEYS[2], 'XX', tonumber(rec.lease), KEYS[1])
end
return 1
"""


def _sync(store: Any) -> Store:
    """The sync store under ``store``: itself, or the one an async store (tests/contract/
    api.py's Blocking, ``idemctl.aio``) runs on."""
    inner = getattr(store, "store", store)  # Blocking -> its AsyncStore
    return getattr(inner, "sync", inner)  # type: ignore[no-any-return]


def _shift(store: Any, name: str, seconds: float, *, entity: bool) -> None:
    """Move the times of record (or entity) ``name`` ``seconds`` into the past: created,
    updated, completed (applied) and the lease's (hold's) end. The end of retention stays
    where it is, so stores that expire by TTL (Redis, DynamoDB) and count by it keep their
    counts right: the record reads as made earlier, with a longer retention."""
    from idemctl.stores.dynamodb import DynamoDBStore
    from idemctl.stores.memory import MemoryStore
    from idemctl.stores.postgres import PostgresStore
    from idemctl.stores.redis import RedisStore
    from idemctl.stores.sqlite import SQLiteStore

    target = _sync(store)
    ms = round(seconds * 1000)
    delta = timedelta(milliseconds=ms)
    times = _ENTITY_TIMES if entity else _RECORD_TIMES
    if isinstance(target, MemoryStore):
        with target._lock:
            if entity:
                ent = target._entities[name]
                target._entities[name] = replace(
                    ent, **{f: getattr(ent, f) - delta for f in times["sqlite"] if getattr(ent, f)}
                )
            else:
                rec, result = target._rows[name]
                moved = {f: getattr(rec, f) - delta for f in times["sqlite"] if getattr(rec, f)}
                target._rows[name] = (replace(rec, **moved), result)
    elif isinstance(target, SQLiteStore):
        table, column = ("idem_entities", "entity") if entity else ("idem_keys", "key")
        sets = ", ".join(f"{f} = {f} - :ms" for f in times["sqlite"])
        with sqlite3.connect(target.path) as conn:
            changed = conn.execute(
                f"UPDATE {table} SET {sets} WHERE {column} = :name", {"ms": ms, "name": name}
            ).rowcount
        assert changed == 1, name
    elif isinstance(target, PostgresStore):
        table = target.names.entities_table if entity else target.keys_table
        column = "entity" if entity else "key"
        sets = ", ".join(f"{f} = {f} - %(by)s" for f in times["sqlite"])
        with target.connection() as conn:
            changed = conn.execute(
                f"UPDATE {table} SET {sets} WHERE {column} = %(name)s", {"by": delta, "name": name}
            ).rowcount
        assert changed == 1, name
    elif isinstance(target, RedisStore):
        rkey = target.ops.ekey(name) if entity else target.ops.rkey(name)
        live = target.index_keys(rkey)[0]
        client: Any = target._client
        assert client.eval(_SHIFT_LUA, 2, rkey, live, ms, *times["redis"]) == 1, name
    elif isinstance(target, DynamoDBStore):
        from idemctl.stores.dynamodb.items import ENTITY_PREFIX

        item_key = {"key": {"S": (ENTITY_PREFIX + name) if entity else name}}
        item = target.client.get_item(TableName=target.table, Key=item_key)["Item"]
        present = [f for f in times["dynamodb"] if f in item]
        target.client.update_item(
            TableName=target.table,
            Key=item_key,
            UpdateExpression="SET " + ", ".join(f"#{i} = :{i}" for i in range(len(present))),
            ExpressionAttributeNames={f"#{i}": f for i, f in enumerate(present)},
            ExpressionAttributeValues={
                f":{i}": {"N": str(int(item[f]["N"]) - ms)} for i, f in enumerate(present)
            },
        )
    else:
        raise TypeError(f"no way to set the clock of {type(target).__name__}")


def backdate(store: Any, key: str, seconds: float) -> Record:
    """``key``'s record as if claimed (and finished) ``seconds`` earlier: its created,
    updated and completed times and its lease's end moved back (not its retention's end);
    the record as the store now holds it."""
    _shift(store, key, seconds, entity=False)
    record = store.get(key)
    assert record is not None, key
    return record  # type: ignore[no-any-return]


def expire_lease(store: Any, key: str, ago: float = 60.0) -> Record:
    """``key``'s lease as ended ``ago`` seconds back (by this machine's clock, which every
    test store shares): the whole record moved back by as much (``backdate``), so its times
    stay in order. A test that needs a lease run out claims with a long one and calls this."""
    record = store.get(key)
    assert record is not None and record.lease_expires_at is not None, key
    left = (record.lease_expires_at - datetime.now(UTC)).total_seconds()
    return backdate(store, key, left + ago)


def expire_hold(store: Any, entity: str, ago: float = 60.0) -> Entity:
    """``entity``'s hold as ended ``ago`` seconds back: its times moved back by as much, as
    ``expire_lease`` does for a key (the holder's key keeps its own lease)."""
    found = store.get_entity(entity)
    assert found is not None and found.lock_expires_at is not None, entity
    left = (found.lock_expires_at - datetime.now(UTC)).total_seconds()
    _shift(store, entity, left + ago, entity=True)
    moved = store.get_entity(entity)
    assert moved is not None, entity
    return moved  # type: ignore[no-any-return]


# KEYS[1] a record or an entity, then the index's four keys of its slot; ARGV[1] the end of
# retention, ms. Out of the index as it was, in again as it is now (lua/_lib.lua's uncount,
# count), and gone by the TTL at that end (at once when it is past) as Redis drops it.
_RETENTION_LUA = """
indexed()
local rec = get_record(KEYS[1])
if rec == nil then return 0 end
uncount(KEYS[1], rec)
rec.expires = ARGV[1]
local left = tonumber(ARGV[1]) - now_ms()
redis.call('SET', KEYS[1], cjson.encode(rec), 'PX', math.max(left, 1))
count(KEYS[1], rec)
if left < 1 then redis.call('DEL', KEYS[1]) end
return 1
"""


def expire_retention(store: Any, name: str, ago: float = 60.0, *, entity: bool = False) -> None:
    """The retention of finished record (or entity) ``name`` as ended ``ago`` seconds back:
    past it the store treats it as never seen (Redis drops it by its TTL, as it would; the
    others keep it until purged). A test that needs a record present and then past retention
    finishes it with a long retention and calls this between the two checks."""
    from idemctl.stores.dynamodb import DynamoDBStore
    from idemctl.stores.memory import MemoryStore
    from idemctl.stores.postgres import PostgresStore
    from idemctl.stores.redis import RedisStore
    from idemctl.stores.sqlite import SQLiteStore

    target = _sync(store)
    ended = datetime.now(UTC) - timedelta(seconds=ago)
    ms = round(ended.timestamp() * 1000)
    if isinstance(target, MemoryStore):
        with target._lock:
            if entity:
                target._entities[name] = replace(target._entities[name], expires_at=ended)
            else:
                rec, result = target._rows[name]
                target._rows[name] = (replace(rec, expires_at=ended), result)
    elif isinstance(target, SQLiteStore):
        table, column = ("idem_entities", "entity") if entity else ("idem_keys", "key")
        with sqlite3.connect(target.path) as conn:
            changed = conn.execute(
                f"UPDATE {table} SET expires_at = ? WHERE {column} = ?", (ms, name)
            ).rowcount
        assert changed == 1, name
    elif isinstance(target, PostgresStore):
        table = target.names.entities_table if entity else target.keys_table
        column = "entity" if entity else "key"
        with target.connection() as conn:
            changed = conn.execute(
                f"UPDATE {table} SET expires_at = %s WHERE {column} = %s", (ended, name)
            ).rowcount
        assert changed == 1, name
    elif isinstance(target, RedisStore):
        from idemctl.stores.redis.scripts import LIB

        rkey = target.ops.ekey(name) if entity else target.ops.rkey(name)
        client: Any = target._client
        keys = (rkey, *target.index_keys(rkey))
        assert client.eval(LIB + "\n" + _RETENTION_LUA, len(keys), *keys, ms) == 1, name
    elif isinstance(target, DynamoDBStore):
        from idemctl.stores.dynamodb.items import ENTITY_PREFIX

        target.client.update_item(
            TableName=target.table,
            Key={"key": {"S": (ENTITY_PREFIX + name) if entity else name}},
            UpdateExpression="SET expires_at = :ms, #ttl = :s",
            ConditionExpression="attribute_exists(expires_at)",
            ExpressionAttributeNames={"#ttl": "ttl"},
            ExpressionAttributeValues={":ms": {"N": str(ms)}, ":s": {"N": str(ms // 1000)}},
        )
    else:
        raise TypeError(f"no way to set the clock of {type(target).__name__}")
