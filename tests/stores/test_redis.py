"""The Redis store on real servers (tests/servers.py): what only Redis has, beyond the
contract suite (which runs on "redis", "redis-cluster" and "fakeredis" as well).

Shared servers come from the session fixtures ``redis_server`` and ``redis_cluster``; a
test that kills, restarts or reconfigures a server starts its own and stops it by PID.
Every store gets a prefix of its own, so tests never see each other's keys.
"""

from __future__ import annotations

import json
import re
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from redis.crc import key_slot

from idemctl import (
    Acquired,
    Busy,
    ClaimRequest,
    Completed,
    Completion,
    LeaseLost,
    Status,
    fingerprint,
)
from idemctl.errors import ConfigError, EntityNotFound, IdemctlError, StoreError, StoreUnavailable
from idemctl.model import MAX_SEQUENCE, Guard, Settle, Verdict
from idemctl.stores import open_store
from idemctl.stores.base import Store
from tests.backends import expire_lease, unique_prefix
from tests.killing import claims_across_a_kill
from tests.polling import wait_until
from tests.servers import RedisCluster, RedisServer, free_port

T = TypeVar("T")
HANG = 30.0
"""No single store call may take longer than this: a bound that catches hangs, not speed."""
LONG = 60.0
SCRIPTS = (
    "claim",
    "complete",
    "fail",
    "extend",
    "release",
    "unlock",
    "forget",
    "purge",
    "guard",
    "settle",
    "forget_entity",
    "finish",
    "index",
    "stats",
    "tally",
)


def bounded(fn: Callable[[], T], timeout: float = HANG) -> T:
    """fn() in a thread: its result or its exception, or a failure if it hangs."""
    pool = ThreadPoolExecutor(1)
    try:
        return pool.submit(fn).result(timeout)
    except FutureTimeout:
        pytest.fail(f"store call still running after {timeout}s: it hangs")
    finally:
        pool.shutdown(wait=False)


def redis_url(server: RedisServer, prefix: str, options: str = "") -> str:
    auth = f":{server.password}@" if server.password is not None else ""
    extra = f"&{options}" if options else ""
    return f"redis://{auth}127.0.0.1:{server.port}/0?prefix={prefix}{extra}"


def cluster_url(cluster: RedisCluster, prefix: str, options: str = "") -> str:
    extra = f"&{options}" if options else ""
    return f"redis+cluster://127.0.0.1:{cluster.port}?prefix={prefix}{extra}"


@pytest.fixture
def prefix() -> str:
    return unique_prefix()


@pytest.fixture
def raw(redis_server: RedisServer) -> Iterator[Any]:
    """A plain client on the shared server, to look at what the store wrote."""
    client = redis_server.client(decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def store(redis_server: RedisServer, prefix: str) -> Iterator[Store]:
    s = open_store(redis_url(redis_server, prefix, "retention=120s"))
    yield s
    s.close()


def acquire(store: Store, key: str, lease: float = LONG, fp: str | None = None) -> Acquired:
    outcome = store.claim(key, fp, lease)
    assert isinstance(outcome, Acquired), outcome
    return outcome


def scan_all(store: Store, **filters: Any) -> list[str]:
    keys: list[str] = []
    cursor = None
    for _ in range(10_000):
        page = store.scan(limit=50, cursor=cursor, **filters)
        keys += [r.key for r in page.records]
        cursor = page.cursor
        if cursor is None:
            return sorted(keys)
    raise AssertionError("scan never ended")


# The record's shape -------------------------------------------------------------------------


def test_each_record_is_one_json_string_under_its_hash_tag(
    store: Store, raw: Any, prefix: str
) -> None:
    a = acquire(store, "order-1", fp=fingerprint({"amount": 10}))
    assert raw.keys(f"{prefix}{{*") == [f"{prefix}{{order-1}}"]
    # Beside the records, the index the operator's commands read (see lua/_lib.lua).
    assert raw.zrange(f"{prefix}idx:live", 0, -1) == [f"{prefix}{{order-1}}"]
    rkey = f"{prefix}{{order-1}}"
    assert raw.type(rkey) == "string"
    fields = json.loads(raw.get(rkey))
    assert fields["status"] == "in_progress"
    assert fields["owner"] == a.owner
    assert fields["token"] == str(a.fencing_token)  # text, as every field: no float's exponent
    assert fields["fp"] == fingerprint({"amount": 10})
    # The hash tag: the record hashes to the slot of the idempotency key itself.
    assert key_slot(rkey.encode()) == key_slot(b"order-1")
    store.complete("order-1", a.owner, a.fencing_token, {"charge": "ch_1"})
    assert raw.keys(f"{prefix}{{*") == [rkey]
    assert raw.zrange(f"{prefix}idx:live", 0, -1) == []
    assert raw.hget(f"{prefix}idx:counts", "c") == "1"
    fields = json.loads(raw.get(rkey))
    assert fields["status"] == "completed"
    assert json.loads(fields["result"]) == {"charge": "ch_1"}


@contextmanager
def other_programs_keys(raw: Any, n: int) -> Iterator[None]:
    """``n`` keys of another program on the shared server (SCAN walks them too), deleted
    after."""
    other = unique_prefix()
    pipe = raw.pipeline(transaction=False)
    for i in range(n):
        pipe.set(f"{other}{i}", "x", ex=300)
    pipe.execute()
    try:
        yield
    finally:
        for chunk in range(0, n, 1000):
            raw.delete(*(f"{other}{i}" for i in range(chunk, min(chunk + 1000, n))))


def test_a_full_page_gets_a_cursor_only_when_more_records_follow(
    store: Store, raw: Any, prefix: str
) -> None:
    # Other programs' keys make SCAN take many batches, most with none of ours.
    with other_programs_keys(raw, 5000):
        for n in range(4):
            a = acquire(store, f"e{n}")
            store.complete(f"e{n}", a.owner, a.fencing_token, n)
        whole = store.scan(limit=4)
        assert len(whole.records) == 4 and whole.cursor is None
        keys: list[str] = []
        cursor = None
        for _ in range(4):
            page = store.scan(limit=3, cursor=cursor)
            keys += [r.key for r in page.records]
            cursor = page.cursor
            if cursor is None:
                break
        assert sorted(keys) == ["e0", "e1", "e2", "e3"]
        assert cursor is None


def test_a_page_examines_at_most_walk_keys_and_a_short_page_goes_on(
    store: Store, raw: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page on a prefix few keys match reads a bounded part of the keyspace (WALK_KEYS,
    SCAN_COUNT a call), whatever the store's size: it comes back short, even empty, with a
    cursor that goes on, and the cursors find every match once; keys and entities alike
    (the console's pages on a million keys)."""
    import idemctl.stores.redis as package
    from idemctl.stores.redis import RedisStore

    assert isinstance(store, RedisStore)
    with other_programs_keys(raw, 3000):
        rare = [f"rare:{i}" for i in range(5)]
        for i, key in enumerate([*rare, *(f"common:{i}" for i in range(40))]):
            a = acquire(store, key)
            if key in rare:
                assert go(store, f"rare-e:{i}", 1, a) is Verdict.GO
            store.complete(key, a.owner, a.fencing_token, i)
        monkeypatch.setattr(package, "SCAN_COUNT", 10)
        monkeypatch.setattr(package, "WALK_KEYS", 20)  # two SCAN calls a page
        scanned = store._client.scan  # type: ignore[attr-defined]
        calls: list[int] = []

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            return scanned(*args, **kwargs)

        monkeypatch.setattr(store._client, "scan", counted)  # type: ignore[attr-defined]
        for fetch, want in (
            (lambda c: store.scan(prefix="rare:", limit=100, cursor=c), rare),
            (lambda c: store.scan_entities(prefix="rare-e:", limit=100, cursor=c),
             [f"rare-e:{i}" for i in range(5)]),
        ):  # fmt: skip
            found: list[str] = []
            pages, short, cursor = 0, 0, None
            while True:
                calls.clear()
                page = fetch(cursor)
                assert len(calls) <= 2, len(calls)
                items = page.records if hasattr(page, "records") else page.entities
                found += [getattr(x, "key", None) or x.entity for x in items]
                pages, cursor = pages + 1, page.cursor
                if cursor is None:
                    break
                short += len(items) < 100
                assert pages < 1000
            assert sorted(found) == sorted(want) and len(found) == len(set(found))
            assert pages > 100 and short == pages - 1  # 3,000 keys, 20 a page


def test_keys_under_the_prefix_that_are_not_records_are_left_out(
    store: Store, raw: Any, prefix: str
) -> None:
    a = acquire(store, "mine")
    store.complete("mine", a.owner, a.fencing_token, 1)
    raw.hset(f"{prefix}{{a-hash}}", "status", "completed")
    raw.set(f"{prefix}{{not-json}}", "plain text")
    raw.set(f"{prefix}{{other-json}}", json.dumps({"name": "x"}))
    assert scan_all(store) == ["mine"]
    assert store.stats().total == 1
    assert store.get("not-json") is None and store.get("other-json") is None


def test_scan_prefix_is_literal_not_a_glob(store: Store) -> None:
    for key in ("a*1", "ab1", "a?2", "a[x]3", "a\\4", "b"):
        acquire(store, key)
    assert scan_all(store, prefix="a*") == ["a*1"]
    assert scan_all(store, prefix="a?") == ["a?2"]
    assert scan_all(store, prefix="a[x]") == ["a[x]3"]
    assert scan_all(store, prefix="a\\") == ["a\\4"]
    assert scan_all(store, prefix="a") == ["a*1", "a?2", "a[x]3", "a\\4", "ab1"]


@pytest.mark.clock
def test_cluster_batch_lands_on_every_primary_and_every_operation_works(
    redis_cluster: RedisCluster, prefix: str
) -> None:
    keys = [f"order-{i:03d}" for i in range(200)]
    store = open_store(cluster_url(redis_cluster, prefix))
    nodes = [n.client(decode_responses=True) for n in redis_cluster.nodes]
    try:
        outcomes = store.claim_many([ClaimRequest(k, fingerprint(k)) for k in keys], lease=LONG)
        assert all(isinstance(o, Acquired) for o in outcomes)

        # Which primary holds each record: the one serving the slot of its hash tag.
        ranges = nodes[0].execute_command("CLUSTER SLOTS")
        port_of_slot = {slot: r[2][1] for r in ranges for slot in range(int(r[0]), int(r[1]) + 1)}
        held: dict[int, set[str]] = {}
        for node, server in zip(nodes, redis_cluster.nodes, strict=True):
            rkeys = set(node.scan_iter(match=f"{prefix}{{*", count=1000))
            held[server.port] = rkeys
            for rkey in rkeys:
                key = rkey[len(prefix) + 1 : -1]
                slot = node.execute_command("CLUSTER KEYSLOT", rkey)
                assert slot == node.execute_command("CLUSTER KEYSLOT", key)
                assert port_of_slot[slot] == server.port
        assert all(held[n.port] for n in redis_cluster.nodes), {p: len(k) for p, k in held.items()}
        assert sorted(k for ks in held.values() for k in ks) == sorted(
            f"{prefix}{{{k}}}" for k in keys
        )
        # The index lives beside the records: each in-progress key is listed in its own
        # slot's LIVE, on the primary that holds the record.
        for node, server in zip(nodes, redis_cluster.nodes, strict=True):
            for zkey in node.scan_iter(match=f"{prefix}idx:live{{*", count=1000):
                slot = node.execute_command("CLUSTER KEYSLOT", zkey)
                assert port_of_slot[slot] == server.port
                members = node.zrange(zkey, 0, -1)
                assert members and all(m in held[server.port] for m in members)
                assert {node.execute_command("CLUSTER KEYSLOT", m) for m in members} == {slot}

        # The batch forms across nodes.
        done = store.complete_many(
            [Completion(o.key, o.owner, o.fencing_token, {"k": o.key}) for o in outcomes[:150]]
            + [Completion(o.key, o.owner, o.fencing_token + 1, None) for o in outcomes[150:160]]
        )
        assert done == [True] * 150 + [False] * 10
        replays = store.claim_many([ClaimRequest(k, fingerprint(k)) for k in keys[:150]])
        assert all(
            isinstance(r, Completed) and r.record.result == {"k": k}
            for r, k in zip(replays, keys[:150], strict=True)
        )

        # Admin across nodes: a scan pages through every primary.
        assert scan_all(store) == keys
        assert scan_all(store, status=Status.COMPLETED) == keys[:150]
        assert scan_all(store, prefix="order-19") == keys[190:200]
        stats = store.stats()
        assert stats.total == 200
        assert stats.by_status[Status.COMPLETED] == 150
        assert stats.by_status[Status.IN_PROGRESS] == 50

        # Single forms on keys of every node.
        for o in outcomes[150:153]:
            store.fail(o.key, o.owner, o.fencing_token, "boom", retriable=True)
        for o in outcomes[153:156]:
            store.extend(o.key, o.owner, o.fencing_token, LONG)
            store.release(o.key, o.owner, o.fencing_token)
        again = [acquire(store, o.key) for o in outcomes[150:156]]
        old = outcomes[150:156]
        steps = [a.fencing_token - o.fencing_token for a, o in zip(again, old, strict=True)]
        assert steps == [1] * 6
        short = store.claim_many([ClaimRequest(f"stale-{i}") for i in range(12)], lease=LONG)
        assert all(isinstance(s, Acquired) for s in short)
        for i in range(12):
            expire_lease(store, f"stale-{i}")
        assert store.unlock_stale() == sorted(f"stale-{i}" for i in range(12))
        store.unlock(outcomes[160].key, force=True)
        assert store.forget(keys[0]).status is Status.COMPLETED
        assert store.get(keys[0]) is None
        assert store.purge() == 1  # the forgotten key's tombstone: TTLs do the rest
        assert {f.name for f in store.check()} >= {"appendonly", "maxmemory-policy", "scripts"}
    finally:
        store.close()
        for node in nodes:
            node.close()


# TTLs and the fencing counter ---------------------------------------------------------------


def test_ttl_is_lease_plus_retention_in_progress_and_retention_when_finished(
    store: Store, raw: Any, prefix: str
) -> None:
    retention = 120.0  # the store fixture's URL says retention=120s
    a = acquire(store, "k", lease=30)
    pttl = raw.pttl(f"{prefix}{{k}}")
    assert 30_000 < pttl <= 150_000
    assert pttl == pytest.approx(150_000, abs=5_000)

    store.extend("k", a.owner, a.fencing_token, 300)
    assert raw.pttl(f"{prefix}{{k}}") == pytest.approx(420_000, abs=5_000)

    store.complete("k", a.owner, a.fencing_token, "done")
    assert raw.pttl(f"{prefix}{{k}}") == pytest.approx(retention * 1000, abs=5_000)

    k2 = acquire(store, "k2")
    store.complete("k2", k2.owner, k2.fencing_token, None, retention=45)
    assert raw.pttl(f"{prefix}{{k2}}") == pytest.approx(45_000, abs=5_000)

    f = acquire(store, "k3")
    store.fail("k3", f.owner, f.fencing_token, "nope", retriable=False, retention=75)
    assert raw.pttl(f"{prefix}{{k3}}") == pytest.approx(75_000, abs=5_000)
    # No record is ever left without a TTL (the index's keys have none: see lua/_lib.lua).
    assert all(raw.pttl(k) > 0 for k in raw.keys(f"{prefix}{{*"))


def test_a_retried_complete_returns_the_first_stored_record(store: Store) -> None:
    # A complete whose reply was lost is sent again by the same attempt: it is recognised,
    # and answers with what the first call stored, not with the retry's own result.
    a = acquire(store, "k", fp="fp-1")
    first = store.complete("k", a.owner, a.fencing_token, {"charge": 1})
    again = store.complete("k", a.owner, a.fencing_token, {"charge": 2})
    assert again == first == store.get("k")
    assert again.result == {"charge": 1} and again.fingerprint == "fp-1"


@pytest.mark.clock
def test_fencing_counter_never_goes_backwards(store: Store, raw: Any, prefix: str) -> None:
    rkey = f"{prefix}{{k}}"
    seen: list[int] = []

    def token_now() -> int:
        assert raw.pttl(rkey) > 0  # the record exists, with a TTL
        token = int(json.loads(raw.get(rkey))["token"])
        record = store.get("k")
        assert record is not None and record.fencing_token == token
        assert not seen or token >= seen[-1], (seen, token)
        seen.append(token)
        return token

    tokens = []
    a = acquire(store, "k")
    tokens.append(a.fencing_token)
    token_now()
    store.release("k", a.owner, a.fencing_token)
    token_now()
    b = acquire(store, "k")
    tokens.append(b.fencing_token)
    token_now()
    expire_lease(store, "k")
    c = acquire(store, "k")  # takeover of b's expired lease
    assert c.takeover is True
    tokens.append(c.fencing_token)
    token_now()
    with pytest.raises(LeaseLost):
        store.complete("k", b.owner, b.fencing_token, "zombie")
    token_now()
    store.unlock("k", force=True)
    token_now()
    d = acquire(store, "k")
    tokens.append(d.fencing_token)
    store.fail("k", d.owner, d.fencing_token, "retry me", retriable=True)
    token_now()
    e = acquire(store, "k")
    tokens.append(e.fencing_token)
    store.complete("k", e.owner, e.fencing_token, "done")
    token_now()
    assert [t - tokens[0] for t in tokens] == [0, 1, 2, 3, 4]
    assert seen[-1] == tokens[-1]
    for stale in (a, b, c, d):  # every earlier holder stays fenced out
        with pytest.raises(LeaseLost):
            store.complete("k", stale.owner, stale.fencing_token, "zombie")
    assert token_now() == tokens[-1]


def test_forget_leaves_a_tombstone_with_the_stores_retention(
    store: Store, raw: Any, prefix: str
) -> None:
    rkey = f"{prefix}{{k}}"
    a = acquire(store, "k")
    store.complete("k", a.owner, a.fencing_token, {"charged": 10})
    assert store.forget("k").result == {"charged": 10}  # the record as it was
    tomb = json.loads(raw.get(rkey))
    assert int(tomb["token"]) == a.fencing_token
    assert (tomb["owner"], tomb["lease"], tomb["result"], tomb["done_by"]) == ("", "", "", "")
    assert 110_000 < raw.pttl(rkey) <= 120_000  # the store's retention (retention=120s)
    with pytest.raises(LeaseLost):  # a retried complete cannot bring the key back
        store.complete("k", a.owner, a.fencing_token, {"charged": 10})
    assert store.get("k") is None
    assert acquire(store, "k").fencing_token == a.fencing_token + 1


def test_a_key_expired_by_its_ttl_starts_at_the_servers_clock(
    store: Store, raw: Any, prefix: str
) -> None:
    a = acquire(store, "k")
    store.complete("k", a.owner, a.fencing_token, None, retention=0.05)
    # Gone by PX: Redis's own expiry, on Redis's clock, which no test can move; looked for.
    wait_until(lambda: raw.exists(f"{prefix}{{k}}") == 0, "the record gone by its TTL")
    seconds, micros = raw.time()
    again = acquire(store, "k")
    assert a.fencing_token < seconds * 1_000_000 + micros <= again.fencing_token
    assert again.attempt == 1 and again.takeover is False


# The sequence guard's entities ----------------------------------------------------------------


def go(store: Store, entity: str, sequence: int, a: Acquired, lease: float = LONG) -> Verdict:
    (reply,) = store.guard_many([Guard(entity, sequence, a.key, a.fencing_token)], lease)
    return reply.verdict


def scan_entities_all(store: Store, prefix: str | None = None, limit: int = 3) -> list[str]:
    names: list[str] = []
    cursor = None
    for _ in range(10_000):
        page = store.scan_entities(prefix=prefix, limit=limit, cursor=cursor)
        assert len(page.entities) <= limit
        on_page = [e.entity for e in page.entities]
        assert on_page == sorted(on_page)  # in SCAN order, each page in name order
        names += on_page
        cursor = page.cursor
        if cursor is None:
            assert len(set(names)) == len(names), names
            return names
    raise AssertionError("scan_entities never ended")


def test_each_entity_is_one_json_string_out_of_the_records_namespace(
    store: Store, raw: Any, prefix: str
) -> None:
    retention = 120.0  # the store fixture's URL says retention=120s
    a = acquire(store, "k")
    assert go(store, "acct:1", MAX_SEQUENCE - 1, a, lease=30) is Verdict.GO
    ekey = f"{prefix}entity:{{acct:1}}"
    index = set(raw.keys(f"{prefix}idx:*"))
    assert sorted(set(raw.keys(f"{prefix}*")) - index) == sorted([f"{prefix}{{k}}", ekey])
    assert raw.keys(f"{prefix}{{*") == [f"{prefix}{{k}}"]  # what key scans match
    assert raw.type(ekey) == "string"
    # The hash tag: a cluster routes the entity by its own name.
    assert key_slot(ekey.encode()) == key_slot(b"acct:1")
    held = json.loads(raw.get(ekey))
    assert (held["seq"], held["holder"]) == ("", "k")
    assert held["holder_token"] == str(a.fencing_token)  # text, no float's exponent
    assert int(held["expires"]) - int(held["lock"]) == retention * 1000
    # The TTL ends with the entity's retention: lease + retention while held...
    assert raw.pttl(ekey) == pytest.approx(150_000, abs=5_000)
    assert store.settle_many([Settle("acct:1", MAX_SEQUENCE - 1, "k", a.fencing_token)]) == [True]
    done = json.loads(raw.get(ekey))
    assert done["seq"] == str(MAX_SEQUENCE - 1) and done["key"] == "k"
    assert (done["holder"], done["holder_token"], done["lock"]) == ("", "", "")
    # ... then retention from the settle.
    assert raw.pttl(ekey) == pytest.approx(retention * 1000, abs=5_000)
    entity = store.get_entity("acct:1")
    assert entity is not None and entity.sequence == MAX_SEQUENCE - 1
    assert entity.expires_at is not None and entity.applied_at is not None
    assert (entity.expires_at - entity.applied_at).total_seconds() == retention
    # A let-go keeps the TTL it had: the entity did not change.
    b = acquire(store, "b")
    assert go(store, "acct:1", MAX_SEQUENCE, b, lease=30) is Verdict.GO
    assert store.settle_many([Settle("acct:1", MAX_SEQUENCE, "b", b.fencing_token, False)]) == [
        True
    ]
    assert raw.pttl(ekey) == pytest.approx(150_000, abs=5_000)
    assert json.loads(raw.get(ekey))["seq"] == str(MAX_SEQUENCE - 1)
    # Key scans, stats and purge never see it; every key the store writes has a TTL.
    assert scan_all(store) == ["b", "k"]
    assert store.stats().total == 2
    assert store.purge() == 0
    assert raw.exists(ekey) == 1
    assert all(raw.pttl(k) > 0 for k in set(raw.keys(f"{prefix}*")) - index)


def test_an_entity_past_retention_is_dropped_by_its_ttl(
    store: Store, raw: Any, prefix: str
) -> None:
    a = acquire(store, "k")
    assert go(store, "acct:1", 5, a) is Verdict.GO
    assert store.settle_many([Settle("acct:1", 5, "k", a.fencing_token)], retention=0.05) == [True]
    # Redis's own expiry (PX), on its clock: looked for.
    wait_until(lambda: raw.exists(f"{prefix}entity:{{acct:1}}") == 0, "the entity gone by its TTL")
    assert store.get_entity("acct:1") is None
    assert store.count_entities() == 0
    assert go(store, "acct:1", 1, acquire(store, "late")) is Verdict.GO


def test_keys_in_the_entity_namespace_that_are_not_entities_are_left_out(
    store: Store, raw: Any, prefix: str
) -> None:
    a = acquire(store, "k")
    assert go(store, "mine", 1, a) is Verdict.GO
    raw.hset(f"{prefix}entity:{{a-hash}}", "seq", "1")
    raw.set(f"{prefix}entity:{{not-json}}", "plain text")
    raw.set(f"{prefix}entity:{{a-record}}", json.dumps({"status": "completed", "updated": "1"}))
    assert scan_entities_all(store) == ["mine"]
    assert store.count_entities() == 1
    assert store.get_entity("not-json") is None and store.get_entity("a-record") is None


def test_scan_entities_prefix_is_literal_not_a_glob(store: Store) -> None:
    names = ("a*1", "ab1", "a?2", "a[x]3", "a\\4", "b")
    for i, name in enumerate(names):
        assert go(store, name, 1, acquire(store, f"k{i}")) is Verdict.GO
    assert scan_entities_all(store, prefix="a*") == ["a*1"]
    assert scan_entities_all(store, prefix="a?") == ["a?2"]
    assert scan_entities_all(store, prefix="a[x]") == ["a[x]3"]
    assert scan_entities_all(store, prefix="a\\") == ["a\\4"]
    assert sorted(scan_entities_all(store, prefix="a", limit=2)) == sorted(names[:5])
    assert sorted(scan_entities_all(store, limit=100)) == sorted(names)


def test_guard_and_settle_survive_script_flush(store: Store, raw: Any) -> None:
    keys = [acquire(store, f"k{i}") for i in range(20)]
    raw.script_flush()
    replies = store.guard_many(
        [Guard(f"e{i}", 1, a.key, a.fencing_token) for i, a in enumerate(keys)]
    )
    assert [r.verdict for r in replies] == [Verdict.GO] * 20
    raw.script_flush()
    settles = [Settle(f"e{i}", 1, a.key, a.fencing_token) for i, a in enumerate(keys)]
    assert store.settle_many(settles) == [True] * 20
    raw.script_flush()
    assert store.forget_entity("e0").sequence == 1
    with pytest.raises(EntityNotFound):
        store.forget_entity("e0")


def test_cluster_guards_land_on_every_primary_and_entity_admin_sees_them_all(
    redis_cluster: RedisCluster, prefix: str
) -> None:
    store = open_store(cluster_url(redis_cluster, prefix))
    nodes = [n.client(decode_responses=True) for n in redis_cluster.nodes]
    names = [f"acct:{i:03d}" for i in range(120)]
    try:
        held = [acquire(store, f"k{i}") for i in range(len(names))]
        guards = [Guard(n, 7, a.key, a.fencing_token) for n, a in zip(names, held, strict=True)]
        # The same entity twice in one batch: the second sees the first's hold.
        replies = store.guard_many([*guards, Guard(names[0], 8, "other", 1)])
        assert [r.verdict for r in replies] == [Verdict.GO] * len(names) + [Verdict.BUSY]
        assert replies[-1].holder == "k0"
        on_node = [set(node.scan_iter(match=f"{prefix}entity:*", count=1000)) for node in nodes]
        assert all(on_node), [len(k) for k in on_node]
        assert sorted(k for ks in on_node for k in ks) == sorted(
            f"{prefix}entity:{{{n}}}" for n in names
        )
        settles = [Settle(g.entity, g.sequence, g.key, g.fencing_token) for g in guards]
        assert store.settle_many(settles[:100]) == [True] * 100
        assert store.count_entities() == len(names)
        assert sorted(scan_entities_all(store, limit=7)) == names
        assert sorted(scan_entities_all(store, prefix="acct:11", limit=4)) == names[110:120]
        entity = store.get_entity(names[5])
        assert entity is not None and (entity.sequence, entity.key) == (7, "k5")
        late = store.guard_many([Guard(n, 6, "late", 1) for n in names[:100]])
        assert {r.verdict for r in late} == {Verdict.STALE}
        with pytest.raises(StoreError, match="held"):
            store.forget_entity(names[110])
        assert store.forget_entity(names[110], force=True).holder == "k110"
        assert store.forget_entity(names[0]).sequence == 7
        assert store.count_entities() == len(names) - 2
        assert scan_all(store) == sorted(a.key for a in held)  # no entity among the keys
    finally:
        store.close()
        for node in nodes:
            node.close()


# Scripts: SCRIPT FLUSH and restarts ---------------------------------------------------------


def test_scripts_survive_script_flush_in_single_and_batch_calls(store: Store, raw: Any) -> None:
    a = acquire(store, "one")
    raw.script_flush()
    b = acquire(store, "two")
    raw.script_flush()
    store.complete("one", a.owner, a.fencing_token, 1)
    raw.script_flush()
    outcomes = store.claim_many([ClaimRequest(f"batch-{i}") for i in range(20)], lease=LONG)
    assert all(isinstance(o, Acquired) for o in outcomes)
    raw.script_flush()
    done = store.complete_many(
        [Completion(o.key, o.owner, o.fencing_token, o.key) for o in outcomes]
        + [Completion("two", b.owner, b.fencing_token, 2)]
    )
    assert done == [True] * 21
    raw.script_flush()
    replays = store.claim_many([ClaimRequest(f"batch-{i}") for i in range(20)])
    assert [r.record.result for r in replays if isinstance(r, Completed)] == [
        f"batch-{i}" for i in range(20)
    ]
    raw.script_flush()
    x = acquire(store, "x")
    store.extend("x", x.owner, x.fencing_token, LONG)
    raw.script_flush()
    assert store.unlock("x", force=True).owner is None
    raw.script_flush()
    assert store.forget("one").result == 1


def test_cluster_calls_go_to_each_node_over_connections_of_the_stores_own(
    redis_cluster: RedisCluster, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(cluster_url(redis_cluster, prefix))
    try:
        # The scripts on every node first (`idemctl init`): on a node that lacks one the
        # call goes again through the pipeline, by design, and a cluster fresh from its
        # fixture has none until an earlier test loaded them.
        store.provision()

        def no_pipeline(*args: Any) -> Any:
            raise AssertionError("the cluster call went through redis-py's pipeline")

        monkeypatch.setattr(store.script_runner, "_pipelined", no_pipeline)  # type: ignore[attr-defined]
        keys = [f"own-{i}" for i in range(120)]
        claimed = store.claim_many([ClaimRequest(k, fingerprint(k)) for k in keys], lease=LONG)
        assert all(isinstance(o, Acquired) for o in claimed)
        done = store.complete_many(
            [Completion(o.key, o.owner, o.fencing_token, i) for i, o in enumerate(claimed)]
        )
        assert done == [True] * 120
        again = store.claim_many([ClaimRequest(k, fingerprint(k)) for k in keys])
        assert [o.record.result for o in again if isinstance(o, Completed)] == list(range(120))
        nodes = store.script_runner._nodes  # type: ignore[attr-defined]
        assert len(nodes) == len(redis_cluster.nodes)  # every primary, each its own connection
    finally:
        store.close()


def test_a_slot_moved_to_another_node_is_followed(
    redis_cluster: RedisCluster, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node answers MOVED for a slot it no longer serves: the call goes again through
    redis-py's pipeline, which follows it and refreshes the map; nothing is claimed twice."""
    store = open_store(cluster_url(redis_cluster, prefix))
    scripts: Any = store.script_runner  # type: ignore[attr-defined]
    piped: list[str] = []
    pipelined = scripts._pipelined

    def counted(sha: str, *args: Any) -> Any:
        piped.append(sha)
        return pipelined(sha, *args)

    monkeypatch.setattr(scripts, "_pipelined", counted)
    clients = [n.client(decode_responses=True) for n in redis_cluster.nodes]
    ids = [c.execute_command("CLUSTER MYID") for c in clients]
    key = next(  # a key alone in its slot, so moving the slot moves nothing else
        k
        for k in (f"moved-{i}" for i in range(10_000))
        if not clients[0].execute_command(
            "CLUSTER COUNTKEYSINSLOT", key_slot(f"{prefix}{{{k}}}".encode())
        )
    )
    slot = key_slot(f"{prefix}{{{key}}}".encode())

    def owner() -> int:
        ranges = clients[0].execute_command("CLUSTER SLOTS")
        port = next(r[2][1] for r in ranges if int(r[0]) <= slot <= int(r[1]))
        return [n.port for n in redis_cluster.nodes].index(port)

    def move_to(target: int) -> None:
        for c in [clients[target], *clients]:
            c.execute_command("CLUSTER SETSLOT", slot, "NODE", ids[target])

    first = owner()
    try:
        # The store has its map of the cluster, and the scripts are loaded (an earlier test
        # may have flushed them: NOSCRIPT goes the pipeline's way too).
        store.claim_many([ClaimRequest("warm-up")])
        store.claim_many([ClaimRequest("warm-up-2")])
        piped.clear()
        store.claim_many([ClaimRequest("warm-up-3")])
        assert not piped
        move_to((first + 1) % len(clients))
        claimed = store.claim_many([ClaimRequest(key, "fp"), ClaimRequest("other", "fp")])
        assert all(isinstance(o, Acquired) for o in claimed)
        assert len(piped) == 1  # MOVED: the whole call again, the pipeline's way
        a = claimed[0]
        assert isinstance(a, Acquired)
        assert store.complete_many([Completion(key, a.owner, a.fencing_token, "done")]) == [True]
        holder = clients[(first + 1) % len(clients)]
        assert json.loads(holder.get(f"{prefix}{{{key}}}"))["status"] == "completed"
        replay = store.claim(key, "fp")
        assert isinstance(replay, Completed) and replay.record.result == "done"
        assert len(piped) == 1  # the map was refreshed: straight to the new node since
    finally:
        for c in clients:  # the slot emptied, so it can go back
            for rkey in c.execute_command("CLUSTER GETKEYSINSLOT", slot, 100):
                c.delete(rkey)
        move_to(first)
        store.close()


def test_scripts_survive_script_flush_on_every_cluster_node(
    redis_cluster: RedisCluster, prefix: str
) -> None:
    store = open_store(cluster_url(redis_cluster, prefix))
    try:
        first = store.claim_many([ClaimRequest(f"k-{i}") for i in range(60)], lease=LONG)
        assert all(isinstance(o, Acquired) for o in first)
        for node in redis_cluster.nodes:
            node.cli("SCRIPT", "FLUSH")
        done = store.complete_many(
            [Completion(o.key, o.owner, o.fencing_token, i) for i, o in enumerate(first)]
        )
        assert done == [True] * 60
        redis_cluster.nodes[1].cli("SCRIPT", "FLUSH")  # one node only lost them
        again = store.claim_many([ClaimRequest(f"k-{i}") for i in range(60)])
        assert [o.record.result for o in again if isinstance(o, Completed)] == list(range(60))
        for node in redis_cluster.nodes:
            node.cli("SCRIPT", "FLUSH")
        assert isinstance(store.claim("single"), Acquired)
    finally:
        store.close()


def test_same_store_works_after_a_server_restart(tmp_path: Path, prefix: str) -> None:
    server = RedisServer(tmp_path, "--appendonly", "yes", "--appendfsync", "always")
    try:
        server.start()
        store = open_store(redis_url(server, prefix))
        a = acquire(store, "kept")
        store.complete("kept", a.owner, a.fencing_token, {"n": 1})
        running = acquire(store, "running")
        server.restart()  # SIGTERM, same port, same dir: the AOF is replayed, scripts are not
        replay = bounded(lambda: store.claim("kept"))
        assert isinstance(replay, Completed) and replay.record.result == {"n": 1}
        assert isinstance(bounded(lambda: store.claim("running")), Busy)
        store.complete("running", running.owner, running.fencing_token, "after restart")
        assert isinstance(bounded(lambda: store.claim("new")), Acquired)
        store.close()
    finally:
        server.stop()


# The store's own connections ----------------------------------------------------------------


def _named_clients(raw: Any, name: str) -> int:
    return sum(1 for c in raw.client_list() if c["name"] == name)


def _named_store(server: RedisServer, prefix: str, tag: str) -> tuple[Store, str]:
    """A store whose connections carry a client name of their own, to count them."""
    name = f"{tag}-{prefix.strip(':')}"
    return open_store(redis_url(server, prefix, f"client_name={name}")), name


def test_get_reads_the_record_and_the_clock_in_one_round_trip(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from redis.connection import AbstractConnection

    a = acquire(store, "k")
    store.get("k")  # the client's pool connects (and says HELLO) on its first use
    writes: list[Any] = []
    original = AbstractConnection.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> None:
        writes.append(command)
        original(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)
    record = store.get("k")
    assert record is not None and record.owner == a.owner
    assert store.get("never-claimed") is None
    assert len(writes) == 2  # one per get


def test_script_calls_use_one_connection_per_caller(
    redis_server: RedisServer, raw: Any, prefix: str
) -> None:
    store, name = _named_store(redis_server, prefix, "conns")
    try:
        for i in range(50):
            a = acquire(store, f"k{i}")
            store.complete(f"k{i}", a.owner, a.fencing_token, i)
        store.claim_many([ClaimRequest(f"k{i}") for i in range(50)])
        assert _named_clients(raw, name) == 1
        # Callers at the same time each get one of their own, and give it back.
        with ThreadPoolExecutor(4) as pool:
            outcomes = list(pool.map(lambda i: store.claim(f"t{i}"), range(400)))
        assert all(isinstance(o, Acquired) for o in outcomes)
        assert 1 <= _named_clients(raw, name) <= 4
    finally:
        store.close()
    # The server notices closed sockets on its next loop.
    wait_until(lambda: _named_clients(raw, name) == 0, "every client closed", HANG, 0.01)


def test_an_interrupted_call_leaves_no_reply_behind_for_the_next(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    import idemctl.stores.redis.connections as redis_store

    a = acquire(store, "done")
    store.complete("done", a.owner, a.fencing_token, "result")
    send = redis_store._send

    def interrupted(conn: Any, args: tuple[Any, ...]) -> Any:
        conn.send_packed_command([redis_store._pack(args)])  # the server runs it and replies
        raise KeyboardInterrupt  # ... which nobody reads

    monkeypatch.setattr(redis_store, "_send", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.claim("new")
    monkeypatch.setattr(redis_store, "_send", send)
    # The next call reads its own reply ("completed"), not the unread "acquired" of "new".
    outcome = store.claim("done")
    assert isinstance(outcome, Completed) and outcome.record.result == "result"
    assert isinstance(store.claim("new"), Busy)  # the interrupted claim did run


def test_a_forked_child_gets_connections_of_its_own(
    redis_server: RedisServer, raw: Any, prefix: str
) -> None:
    import os

    store, name = _named_store(redis_server, prefix, "fork")
    try:
        acquire(store, "parent")
        pid = os.fork()
        if pid == 0:  # the child: a claim on the parent's socket would leave 1 connection
            code = 1
            try:
                outcome = store.claim("child")
                code = 0 if isinstance(outcome, Acquired) and _named_clients(raw, name) == 2 else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert isinstance(store.claim("parent"), Busy)  # the parent's connection still works
    finally:
        store.close()


# A server that dies -------------------------------------------------------------------------


def test_killed_server_gives_store_unavailable_and_the_same_store_recovers(
    tmp_path: Path, prefix: str
) -> None:
    server = RedisServer(tmp_path)
    try:
        server.start()
        store = open_store(redis_url(server, prefix, "socket_timeout=3s"))
        claims_across_a_kill(store, server.kill, warmup=100, after=5, hang=HANG, lease=LONG)

        # Other operations fail closed too.
        for call in (
            lambda: store.claim_many([ClaimRequest("a"), ClaimRequest("b")]),
            lambda: store.complete_many([Completion("a", "o", 1, None)]),
            lambda: store.get("k-0"),
            store.stats,
        ):
            with pytest.raises(StoreUnavailable):
                bounded(call)

        server.restart()  # same port, nothing persisted
        outcome = bounded(lambda: store.claim("after-restart"))
        assert isinstance(outcome, Acquired)
        store.complete("after-restart", outcome.owner, outcome.fencing_token, "ok")
        record = store.get("after-restart")
        assert record is not None and record.result == "ok"
        store.close()
    finally:
        server.stop()


def test_a_frozen_server_gives_store_unavailable_not_a_hang(tmp_path: Path, prefix: str) -> None:
    server = RedisServer(tmp_path)
    try:
        server.start()
        store = open_store(redis_url(server, prefix, "socket_timeout=500ms"))
        before = acquire(store, "before")
        server.pause()  # SIGSTOP: connections are accepted, nothing is answered
        with pytest.raises(StoreUnavailable):
            bounded(lambda: store.claim("during"))
        with pytest.raises(StoreUnavailable):
            bounded(lambda: store.complete("before", before.owner, before.fencing_token, 1))
        server.resume()
        # The same store carries on. A call that timed out may still have been applied
        # once the server woke up (its reply was lost): then the key is merely busy.
        after = bounded(lambda: store.claim("during"))
        assert isinstance(after, Acquired | Busy)
        record = store.complete("before", before.owner, before.fencing_token, 1)
        assert record.status is Status.COMPLETED and record.result == 1
        store.close()
    finally:
        server.stop()


def test_nothing_listening_is_store_unavailable(prefix: str) -> None:
    port = free_port()
    store = open_store(f"redis://127.0.0.1:{port}/0?prefix={prefix}")
    with pytest.raises(StoreUnavailable) as info:
        bounded(lambda: store.claim("k"))
    assert str(port) in str(info.value)


# Durability -------------------------------------------------------------------------------------


def test_durable_refuses_a_server_that_cannot_confirm(
    redis_server: RedisServer, raw: Any, prefix: str
) -> None:
    # The shared server runs with appendonly no and has no replicas.
    assert raw.config_get("appendonly")["appendonly"] == "no"
    store = open_store(redis_url(redis_server, prefix, "durable=1"))
    with pytest.raises(StoreError) as info:
        store.claim("k")
    assert not isinstance(info.value, StoreUnavailable)
    message = str(info.value)
    assert "durable" in message
    assert "appendonly" in message or "AOF" in message
    # Nothing was claimed behind the caller's back.
    assert raw.exists(f"{prefix}{{k}}") == 0
    store.close()


def test_durable_works_with_an_fsynced_aof(tmp_path: Path, prefix: str) -> None:
    with RedisServer(tmp_path, "--appendonly", "yes", "--appendfsync", "always") as server:
        store = open_store(redis_url(server, prefix, "durable=1&durable_timeout=1s"))
        a = acquire(store, "k")
        store.complete("k", a.owner, a.fencing_token, "safe")
        outcomes = store.claim_many([ClaimRequest(f"b-{i}") for i in range(10)])
        assert all(isinstance(o, Acquired) for o in outcomes)
        assert (
            store.complete_many(
                [Completion(o.key, o.owner, o.fencing_token, None) for o in outcomes]
            )
            == [True] * 10
        )
        f = acquire(store, "f")
        store.fail("f", f.owner, f.fencing_token, "x")
        g = acquire(store, "g")
        (go,) = store.guard_many([Guard("acct", 1, "g", g.fencing_token)])
        assert go.verdict is Verdict.GO
        assert store.settle_many([Settle("acct", 1, "g", g.fencing_token)]) == [True]
        replay = store.claim("k")
        assert isinstance(replay, Completed) and replay.record.result == "safe"

        # Asking for a replica that does not exist is refused, and says so.
        wants_replica = open_store(
            redis_url(server, prefix, "durable=1&replicas=1&durable_timeout=200ms")
        )
        with pytest.raises(StoreError) as info:
            wants_replica.claim("needs-a-replica")
        assert not isinstance(info.value, StoreUnavailable)
        assert "replica" in str(info.value)
        assert "0 of 1" in str(info.value)
        wants_replica.close()
        store.close()


def test_durable_notices_when_the_server_stops_fsyncing(tmp_path: Path, prefix: str) -> None:
    with RedisServer(tmp_path, "--appendonly", "yes", "--appendfsync", "always") as server:
        store = open_store(redis_url(server, prefix, "durable=1"))
        acquire(store, "before")
        client = server.client()
        client.config_set("appendonly", "no")
        client.close()
        try:
            with pytest.raises(StoreError, match="appendonly"):
                store.claim("after")
        finally:
            store.close()


def test_durable_is_refused_on_a_cluster_url(redis_cluster: RedisCluster, prefix: str) -> None:
    with pytest.raises(ConfigError, match="durable"):
        open_store(cluster_url(redis_cluster, prefix, "durable=1"))


# check() and provision() ------------------------------------------------------------------------


def findings_of(store: Store) -> dict[str, Any]:
    return {f.name: f for f in store.check()}


def test_check_reports_what_the_server_really_has(store: Store, raw: Any) -> None:
    config = raw.config_get("*")
    found = findings_of(store)
    assert {"appendonly", "appendfsync", "replicas", "maxmemory-policy", "scripts"} <= set(found)
    assert config["appendonly"] == "no"
    assert found["appendonly"].ok is False
    assert "no" in found["appendonly"].detail and found["appendonly"].fix
    # everysec (the default) is a trade-off to know, not a failure; it applies once the AOF is on
    assert found["appendfsync"].level == "warn"
    assert config["appendfsync"] in found["appendfsync"].detail
    assert "appendonly is yes" in found["appendfsync"].detail
    assert found["replicas"].ok is True  # none asked for
    assert "0" in found["replicas"].detail
    assert config["maxmemory-policy"] == "noeviction"
    assert found["maxmemory-policy"].ok is True
    assert "noeviction" in found["maxmemory-policy"].detail

    raw.script_flush()
    scripts = findings_of(store)["scripts"]
    assert scripts.level == "warn" and scripts.fix  # each loads on its first use
    store.provision()
    assert findings_of(store)["scripts"].level == "ok"


def test_check_flags_an_evicting_policy_and_accepts_a_good_aof(tmp_path: Path) -> None:
    with RedisServer(
        tmp_path,
        "--maxmemory-policy",
        "allkeys-lru",
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
    ) as server:
        store = open_store(redis_url(server, unique_prefix()))
        found = findings_of(store)
        assert found["maxmemory-policy"].ok is False
        assert "allkeys-lru" in found["maxmemory-policy"].detail
        assert "noeviction" in (found["maxmemory-policy"].fix or "")
        assert found["appendonly"].ok is True
        assert found["appendfsync"].level == "warn"  # the trade-off, explained
        assert found["appendfsync"].detail == "appendfsync everysec"
        assert "last second" in (found["appendfsync"].fix or "")
        assert found["replicas"].ok is True

        replicated = open_store(redis_url(server, unique_prefix(), "durable=1&replicas=2"))
        replicas = findings_of(replicated)["replicas"]
        assert replicas.ok is False and "0" in replicas.detail and replicas.fix
        replicated.close()
        store.close()


def test_provision_dry_run_lists_scripts_and_loads_nothing(store: Store, raw: Any) -> None:
    raw.script_flush()
    plan = store.provision(dry_run=True)
    assert plan.dry_run is True and plan.changed is False
    text = "\n".join(plan.statements)
    for name in SCRIPTS:
        assert name in text
    shas = re.findall(r"\b[0-9a-f]{40}\b", text)
    assert len(set(shas)) == len(SCRIPTS)
    assert raw.script_exists(*shas) == [False] * len(SCRIPTS)

    done = store.provision()
    assert done.changed is True and done.dry_run is False
    assert raw.script_exists(*shas) == [True] * len(SCRIPTS)
    assert store.provision().changed is False
    assert store.provision(dry_run=True).statements == []


def test_provision_loads_on_every_cluster_node(redis_cluster: RedisCluster, prefix: str) -> None:
    store = open_store(cluster_url(redis_cluster, prefix))
    nodes = [n.client(decode_responses=True) for n in redis_cluster.nodes]
    try:
        for node in nodes:
            node.script_flush()
        plan = store.provision(dry_run=True)
        shas = re.findall(r"\b[0-9a-f]{40}\b", "\n".join(plan.statements))
        assert len(set(shas)) == len(SCRIPTS)
        assert all(node.script_exists(*shas) == [False] * len(SCRIPTS) for node in nodes)
        assert store.provision().changed is True
        assert all(node.script_exists(*shas) == [True] * len(SCRIPTS) for node in nodes)
        assert findings_of(store)["scripts"].ok is True
    finally:
        store.close()
        for node in nodes:
            node.close()


# Passwords ---------------------------------------------------------------------------------------


def test_password_works_and_is_never_shown(tmp_path: Path, prefix: str) -> None:
    with RedisServer(tmp_path, password="s3cret") as server:
        url = f"redis://:s3cret@127.0.0.1:{server.port}/0?prefix={prefix}"
        store = open_store(url)
        assert "s3cret" not in store.url and "s3cret" not in repr(store)
        a = acquire(store, "k")
        store.complete("k", a.owner, a.fencing_token, "ok")
        assert all("s3cret" not in f.detail for f in store.check())
        store.close()

        for bad in (
            f"redis://:wr0ngpass@127.0.0.1:{server.port}/0?prefix={prefix}",
            f"redis://127.0.0.1:{server.port}/0?prefix={prefix}",
        ):
            wrong = open_store(bad)
            with pytest.raises(IdemctlError) as info:
                bounded(lambda w=wrong: w.claim("k"))  # type: ignore[misc]
            assert not isinstance(info.value, StoreUnavailable | LeaseLost)
            shown = "".join(traceback.format_exception(info.value))
            assert "wr0ngpass" not in shown and "s3cret" not in shown
            assert re.search(r"(?i)auth|password|credential", str(info.value)), info.value


# URLs ---------------------------------------------------------------------------------------------


def test_a_prefix_with_glob_characters_scans_only_its_own_records(
    redis_server: RedisServer,
) -> None:
    tag = unique_prefix()
    bracket = open_store(redis_url(redis_server, f"{tag}app[1]:"))
    star = open_store(redis_url(redis_server, f"{tag}app*:"))
    try:
        acquire(bracket, "a")
        acquire(star, "z")
        assert scan_all(bracket) == ["a"]
        assert scan_all(star) == ["z"]
        assert star.stats().total == 1
    finally:
        bracket.close()
        star.close()


def test_unknown_url_option_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="prefx"):
        open_store("redis://127.0.0.1:6379/0?prefx=a:")
    with pytest.raises(ConfigError):
        open_store("redis://127.0.0.1:6379/0?lease=soon")


# Clients the store accepts ------------------------------------------------------------------------


def test_a_client_without_decode_responses_sees_its_records(
    redis_server: RedisServer, prefix: str
) -> None:
    """A redis.Redis made by the caller answers bytes unless told otherwise."""
    from idemctl.stores.redis import RedisStore

    store = RedisStore(redis_server.client(), url="redis://127.0.0.1", prefix=prefix)
    a = acquire(store, "k")
    assert store.get("k") is not None
    assert scan_all(store) == ["k"]
    assert store.stats().total == 1
    store.complete("k", a.owner, a.fencing_token, None)
    assert isinstance(store.claim("k"), Completed)
    (reply,) = store.guard_many([Guard("acct", 3, "k", a.fencing_token)])
    assert reply.verdict is Verdict.GO and reply.last is None
    assert store.settle_many([Settle("acct", 3, "k", a.fencing_token)]) == [True]
    entity = store.get_entity("acct")
    assert entity is not None and (entity.sequence, entity.key) == (3, "k")
    assert [e.entity for e in store.scan_entities().entities] == ["acct"]
    assert store.count_entities() == 1
    assert store.forget_entity("acct").sequence == 3
    found = findings_of(store)
    assert found["appendonly"].detail == "appendonly no"
    assert found["maxmemory-policy"].detail == "maxmemory-policy noeviction"
    store.close()


def test_check_on_fakeredis_reports_what_it_cannot_read() -> None:
    """fakeredis has no INFO and no CONFIG GET: check() says so instead of raising."""
    fakeredis = pytest.importorskip("fakeredis")
    from idemctl.stores.redis import RedisStore

    store = RedisStore(
        fakeredis.FakeRedis(decode_responses=True), url="redis://fake", prefix=unique_prefix()
    )
    found = findings_of(store)
    assert found["scripts"].level == "warn"  # not loaded yet: each loads on its first use
    assert not all(f.ok for f in found.values())  # unknown config is not reported as fine
    store.provision()
    assert findings_of(store)["scripts"].level == "ok"
