"""The index the operator's commands read on Redis (lua/_lib.lua, stores/redis/index.py):
its counts equal a full scan's after races, takeovers, forgets, purges and expiries, on one
server and on a cluster; ``init`` counts the records written before it; and once it is
ready, stats, the in-progress and failed listings, unlock --stale and purge read no key
they do not report (no SCAN)."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idemctl import Acquired, ClaimRequest, Completion, Status
from idemctl.errors import IdemctlError
from idemctl.model import Guard, Settle, Stats, Verdict
from idemctl.stores import open_store
from idemctl.stores.redis import RedisStore
from tests.backends import expire_lease, unique_prefix
from tests.polling import wait_until
from tests.servers import RedisCluster, RedisServer

KEYS = 40
ENTITIES = 8
OPERATIONS = {"redis": 2000, "cluster": 25}
"""Each chaos worker's operations: a count, not a time, so that a loaded machine does as
much chaos as a quiet one (4 workers, on 2 cores: about 3 s on one server, 4 on the
cluster, whose purges and stale sweeps walk every node; many times SHORT either way)."""
SHORT = 0.4
"""Lease and short retention in the chaos: records expire by TTL while it runs."""
LONG = 120.0


def url_of(where: RedisServer | RedisCluster, prefix: str) -> str:
    if isinstance(where, RedisCluster):
        return f"redis+cluster://127.0.0.1:{where.port}?prefix={prefix}"
    return f"redis://127.0.0.1:{where.port}/0?prefix={prefix}"


@pytest.fixture(params=["redis", "redis-cluster"])
def where(request: pytest.FixtureRequest) -> RedisServer | RedisCluster:
    name = "redis_server" if request.param == "redis" else "redis_cluster"
    server: RedisServer | RedisCluster = request.getfixturevalue(name)
    return server


def ready_store(url: str) -> RedisStore:
    store = open_store(url)
    assert isinstance(store, RedisStore)
    store.provision()
    assert store.index_ready()
    return store


def entities_by_scan(store: RedisStore) -> int:
    count, cursor = 0, None
    while True:
        page = store.scan_entities(limit=200, cursor=cursor)
        count += len(page.entities)
        if page.cursor is None:
            return count
        cursor = page.cursor


def comparable(stats: Stats) -> dict[str, Any]:
    return {
        "by_status": dict(stats.by_status),
        "total": stats.total,
        "stale": stats.stale,
        "released": stats.released,
        "past_retention": stats.past_retention,
        "oldest": stats.oldest_in_progress,
    }


def chaos(url: str, seed: int, operations: int, errors: list[BaseException]) -> None:
    """One worker: ``operations`` of every kind there is, at random, on a few keys and entities,
    with leases and retentions short enough that takeovers and expiries happen all the time."""
    rng = random.Random(seed)
    store = open_store(url)
    try:
        for _ in range(operations):
            key = f"k{rng.randrange(KEYS)}"
            retention = rng.choice([SHORT, LONG])
            op = rng.random()
            try:
                if op < 0.08:
                    store.forget(key, force=rng.random() < 0.5)
                elif op < 0.11:
                    store.unlock(key, force=True)
                elif op < 0.13:
                    store.unlock_stale()
                elif op < 0.15:
                    store.purge()
                elif op < 0.17:
                    store.forget_entity(f"e{rng.randrange(ENTITIES)}", force=True)
                else:
                    claimed = store.claim_many([ClaimRequest(key)], lease=SHORT)[0]
                    if not isinstance(claimed, Acquired):
                        continue
                    token = claimed.fencing_token
                    then = rng.random()
                    if then < 0.15:
                        continue  # abandoned: its lease ends, a takeover or the TTL follows
                    if then < 0.25:
                        store.release(key, claimed.owner, token)
                    elif then < 0.35:
                        store.extend(key, claimed.owner, token, SHORT)
                        store.fail(key, claimed.owner, token, "boom", rng.random() < 0.5, retention)
                    elif then < 0.55:
                        entity = f"e{rng.randrange(ENTITIES)}"
                        seq = rng.randrange(1, 1000)
                        verdict = store.guard_many([Guard(entity, seq, key, token)], SHORT)[0]
                        if verdict.verdict is Verdict.GO:
                            store.settle_many([Settle(entity, seq, key, token, True)], retention)
                        store.complete(key, claimed.owner, token, {"n": seq}, retention)
                    else:
                        store.complete(key, claimed.owner, token, None, retention)
            except IdemctlError:
                pass  # a lease lost to a takeover, a key forgotten meanwhile: the races wanted
    except BaseException as exc:
        errors.append(exc)
    finally:
        store.close()


def test_counts_equal_a_full_scan_after_chaos(where: RedisServer | RedisCluster) -> None:
    url = url_of(where, unique_prefix())
    store = ready_store(url)
    try:
        errors: list[BaseException] = []
        ops = OPERATIONS["cluster" if isinstance(where, RedisCluster) else "redis"]
        workers = [
            threading.Thread(target=chaos, args=(url, seed, ops, errors)) for seed in range(4)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join(300)
        assert not errors, errors
        assert not any(w.is_alive() for w in workers)

        # Midway as at the end, the counts agree whenever no record's TTL ends within the
        # second: wait until every short-lived one is gone, and its second over (Redis's own
        # clock: polled, not slept).
        # The pair that agreed is the one checked: read again, a TTL could end in between
        # (CI saw it on a loaded machine).
        read: dict[str, Any] = {}

        def agreed() -> bool:
            read.update(indexed=store.stats(), scanned=store.stats(exact=True))
            return comparable(read["indexed"]) == comparable(read["scanned"])

        wait_until(agreed, "the index's counts agree with a full scan", SHORT * 2 + 30, 0.2)
        indexed, scanned = read["indexed"], read["scanned"]
        assert indexed.counted_by == "index" and scanned.counted_by == "scan"
        assert scanned.total > 0  # the long-retention records are there to count
        wait_until(lambda: store.count_entities() == entities_by_scan(store),
                   "the entities counted agree with a full scan", 30, 0.2)  # fmt: skip

        # What stays in progress (abandoned with a long TTL? no: leases are short, so only
        # released and stale ones whose retention is long) is listed from the index alike.
        def in_progress_agree() -> bool:
            listed = store.scan(status=Status.IN_PROGRESS, limit=1000)
            exact = store.stats(exact=True).by_status[Status.IN_PROGRESS]
            return len(listed.records) == exact

        wait_until(in_progress_agree, "the keys listed in progress agree with a scan", 30, 0.2)

        # The failed keys, from FAILED, are those a walk of every key finds failed. Polled:
        # a record whose retention ends between the two reads is in one and not the other
        # (CI saw it once on a loaded machine); they must agree at a moment, not by chance.
        def failed_agree() -> bool:
            failed = keys_of(store, status=Status.FAILED)
            walked = [r.key for r in records_of(store) if r.status is Status.FAILED]
            exact = store.stats(exact=True).by_status[Status.FAILED]
            return failed == sorted(walked) and len(failed) == exact

        wait_until(failed_agree, "the failed keys listed agree with a walk of every key", 30, 0.2)
    finally:
        store.close()


def records_of(store: RedisStore, **filters: Any) -> list[Any]:
    """Every page's records, a page of 7 at a time."""
    found, cursor = [], None
    for _ in range(10_000):
        page = store.scan(limit=7, cursor=cursor, **filters)
        found += page.records
        if (cursor := page.cursor) is None:
            return found
    raise AssertionError("the pages never ended")


def keys_of(store: RedisStore, **filters: Any) -> list[str]:
    keys = [r.key for r in records_of(store, **filters)]
    assert len(keys) == len(set(keys)), keys
    return sorted(keys)


def test_failed_keys_are_listed_from_the_index_and_leave_it_when_no_longer_failed(
    where: RedisServer | RedisCluster,
) -> None:
    """A key that fails joins FAILED; claimed again (a retriable failure), completed,
    forgotten or past its retention it is no longer listed; an index built before FAILED
    came lacks its failed keys until init puts them there, and until then the listing
    walks every key (and finds them all the same)."""
    prefix = unique_prefix()
    store = ready_store(url_of(where, prefix))
    raw: Any = store._client  # routes each key to its node on a cluster
    nodes = [n.client(decode_responses=True) for n in getattr(where, "nodes", [where])]

    def failed_sets() -> dict[str, tuple[Any, int]]:
        """Each node's FAILED sets (one a slot on a cluster): its node, its size."""
        return {
            k: (node, node.zcard(k)) for node in nodes for k in node.keys(f"{prefix}idx:failed*")
        }

    def failed() -> int:
        return sum(n for _, n in failed_sets().values())

    try:
        assert store.failed_indexed()
        for i in range(6):
            got = store.claim(f"f-{i}", lease=LONG)
            assert isinstance(got, Acquired)
            store.fail(f"f-{i}", got.owner, got.fencing_token, "boom", retriable=i < 2)
        store.claim("other", lease=LONG)
        assert keys_of(store, status=Status.FAILED) == [f"f-{i}" for i in range(6)]
        assert failed() == 6
        # f-0 claimed again, f-1 claimed again and completed, f-2 forgotten.
        assert isinstance(store.claim("f-0", lease=LONG), Acquired)
        again = store.claim("f-1", lease=LONG)
        assert isinstance(again, Acquired)
        store.complete("f-1", again.owner, again.fencing_token, None)
        store.forget("f-2")
        assert failed() == 3
        # f-3's retention ended a minute ago (its record says so; its TTL ends later).
        rkey = f"{prefix}{{f-3}}"
        fields = json.loads(raw.get(rkey))
        fields["expires"] = str(int(time.time() * 1000) - 60_000)
        raw.set(rkey, json.dumps(fields), keepttl=True)
        assert keys_of(store, status=Status.FAILED) == ["f-4", "f-5"]
        assert keys_of(store, status=Status.FAILED, prefix="f-4") == ["f-4"]
        # An index from before FAILED: the listing walks every key until init.
        raw.delete(f"{prefix}idx:ready:failed")
        for key, (node, _) in failed_sets().items():
            node.delete(key)
        assert not store.failed_indexed() and store.index_ready()
        check = {f.name: f for f in store.check()}["index"]
        assert check.warning and "failed" in check.detail
        assert keys_of(store, status=Status.FAILED) == ["f-4", "f-5"]
        assert any("failed" in s for s in store.provision(dry_run=True).statements)
        store.provision()
        assert store.failed_indexed()
        assert failed() == 3  # f-3 too: its record is still there
        assert keys_of(store, status=Status.FAILED) == ["f-4", "f-5"]
        store.stats()  # takes the keys whose retention ended out of FAILED
        assert failed() == 2
    finally:
        store.close()
        for node in nodes:
            node.close()


def test_init_counts_records_written_before_the_index(redis_server: RedisServer) -> None:
    """Records an earlier idemctl wrote (no n, no index keys) are read by scan until init
    counts them; then every count and listing reads the index and agrees."""
    prefix = unique_prefix()
    url = url_of(redis_server, prefix)
    raw = redis_server.client(decode_responses=True)
    store = open_store(url)
    assert isinstance(store, RedisStore)
    try:
        for i in range(30):
            got = store.claim(f"done-{i}")
            store.complete(f"done-{i}", got.owner, got.fencing_token, i)
        for i in range(3):
            store.claim(f"stale-{i}", lease=LONG)
            expire_lease(store, f"stale-{i}")
        failed = store.claim("failed")
        store.fail("failed", failed.owner, failed.fencing_token, "boom", False)
        store.forget("done-0")
        # As an earlier version left them: no n in any record, no index at all.
        for rkey in raw.keys(f"{prefix}{{*"):
            fields = json.loads(raw.get(rkey))
            fields.pop("n", None)
            fields.pop("gone", None)
            raw.set(rkey, json.dumps(fields), keepttl=True)
        raw.delete(*raw.keys(f"{prefix}idx:*"))

        assert not store.index_ready()
        before = store.stats()
        assert before.counted_by == "scan"
        assert before.by_status == {
            Status.IN_PROGRESS: 3, Status.COMPLETED: 29, Status.FAILED: 1
        }  # fmt: skip
        assert (before.stale, before.past_retention) == (3, 1)

        plan = store.provision(dry_run=True)
        assert any("index.lua" in s for s in plan.statements)
        assert not store.index_ready()
        done = store.provision()
        assert any("34 record(s)" in note for note in done.notes), done.notes
        assert store.index_ready()
        assert comparable(store.stats()) == comparable(before)
        assert store.stats().counted_by == "index"
        stale = store.scan(stale_only=True).records
        assert sorted(r.key for r in stale) == ["stale-0", "stale-1", "stale-2"]
        assert store.failed_indexed()
        assert [r.key for r in store.scan(status=Status.FAILED).records] == ["failed"]
        assert store.purge() == 1  # the tombstone forget left, found through the index
        # init again counts nothing twice.
        raw.delete(f"{prefix}idx:ready")
        assert any("0 record(s)" in note for note in store.provision().notes)
        assert comparable(store.stats()) == comparable(store.stats(exact=True))
    finally:
        store.close()
        raw.close()


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of this test's own: INFO commandstats counts only this test's commands."""
    server = RedisServer(tmp_path)
    try:
        server.start()
        yield server
    finally:
        server.stop()


def calls(raw: Any, command: str) -> int:
    stats = raw.info("commandstats").get(f"cmdstat_{command}")
    return int(stats["calls"]) if stats else 0


def test_operator_commands_read_no_key_they_do_not_report(own_server: RedisServer) -> None:
    url = url_of(own_server, unique_prefix())
    raw = own_server.client(decode_responses=True)
    store = ready_store(url)
    try:
        store.complete_many(
            [
                Completion(o.key, o.owner, o.fencing_token, None)
                for o in store.claim_many([ClaimRequest(f"done-{i}") for i in range(2000)])
                if isinstance(o, Acquired)
            ]
        )
        for i in range(5):
            store.claim(f"stale-{i}", lease=LONG)
            expire_lease(store, f"stale-{i}")
        store.claim("live", lease=LONG)
        for i in range(3):
            got = store.claim(f"failed-{i}")
            store.fail(f"failed-{i}", got.owner, got.fencing_token, "boom", False)
        scans, gets = calls(raw, "scan"), calls(raw, "get") + calls(raw, "mget")

        stats = store.stats()
        assert stats.by_status == {
            Status.IN_PROGRESS: 6, Status.COMPLETED: 2000, Status.FAILED: 3
        }  # fmt: skip
        failed = store.scan(status=Status.FAILED).records
        assert sorted(r.key for r in failed) == [f"failed-{i}" for i in range(3)]
        assert stats.stale == 5
        assert sorted(r.key for r in store.scan(stale_only=True).records) == [
            f"stale-{i}" for i in range(5)
        ]
        assert len(store.scan(status=Status.IN_PROGRESS).records) == 6
        assert store.unlock_stale(dry_run=True) == [f"stale-{i}" for i in range(5)]
        assert store.unlock_stale() == [f"stale-{i}" for i in range(5)]
        assert store.purge(dry_run=True) == 0
        assert store.count_entities() == 0

        assert calls(raw, "scan") == scans  # not one SCAN
        # Reads of records: only in-progress and failed ones: a round trip per command or so,
        # and stats' tally.lua reads each of the 6 in progress on the server (a GET each).
        assert calls(raw, "get") + calls(raw, "mget") - gets <= 11 + 6
    finally:
        store.close()
        raw.close()
