"""The DynamoDB store's sparse index of keys in progress (stores/dynamodb/inprogress.py) on
moto's server, beyond tests/stores/test_dynamodb_inprogress.py: the mark against the items
and the index after every write path; no Scan for any in-progress read, filters and pages
included, and one DescribeTable per store; pages and cursors; ``unlock_stale``'s cutoff,
batches and its conditional write against a reading the index no longer holds; stats
approximate against exact; provisioning an older table (dry run, marking, a key changed
while it is marked, a wait for an index being built, an index of another shape); doctor.

Requests are seen with botocore's ``before-call`` events on the store's own client: once
per operation the store asks for, before botocore's retries."""

from __future__ import annotations

import contextlib
import time
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from idemctl import Acquired, ClaimRequest, Completion, Status
from idemctl.errors import InvalidCursor, StoreError
from idemctl.model import Guard
from idemctl.stores import dynamodb as package
from idemctl.stores.dynamodb import DynamoDBStore, provision
from idemctl.stores.dynamodb.items import ENTITY_PREFIX, INDEX, INDEX_KEYS, SHARDS
from idemctl.stores.queries import stats_of
from tests.backends import expire_lease, expire_retention, unique_table
from tests.servers import MotoServer
from tests.stores.test_dynamodb import LONG, acquire, item, open_ddb


def ended(store: DynamoDBStore, *keys: str) -> None:
    """The leases (in progress) or retentions (finished) of ``keys`` run out: their times
    written into the past (tests/backends.py), not waited for."""
    for key in keys:
        record = store.get(key)
        assert record is not None, key
        if record.status is Status.IN_PROGRESS:
            expire_lease(store, key)
        else:
            expire_retention(store, key)


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


@contextlib.contextmanager
def asked(store: DynamoDBStore) -> Iterator[list[str]]:
    """The operations the store asks for inside the block, in order."""
    seen: list[str] = []

    def record(model: Any, **_: Any) -> None:
        seen.append(model.name)

    store.client.meta.events.register("before-call.dynamodb", record)
    try:
        yield seen
    finally:
        store.client.meta.events.unregister("before-call.dynamodb", record)


def make_old_table(raw: Any, table: str, **extra: Any) -> None:
    """The table as an idemctl before the index made it (``schemas/dynamodb.json`` then)."""
    definitions = [{"AttributeName": "key", "AttributeType": "S"}]
    raw.create_table(
        TableName=table,
        AttributeDefinitions=definitions + extra.pop("definitions", []),
        KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
        **extra,
    )


def items_of(raw: Any, table: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
    while True:
        response = raw.scan(**kwargs)
        found += response["Items"]
        if "LastEvaluatedKey" not in response:
            return found
        kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]


def indexed(raw: Any, table: str) -> set[str]:
    """The keys the index holds, every shard read by a plain client."""
    keys: set[str] = set()
    for shard in range(SHARDS):
        kwargs: dict[str, Any] = {
            "TableName": table,
            "IndexName": INDEX,
            "KeyConditionExpression": "ip_shard = :s",
            "ExpressionAttributeValues": {":s": {"S": str(shard)}},
        }
        while True:
            response = raw.query(**kwargs)
            keys |= {i["key"]["S"] for i in response["Items"]}
            if "LastEvaluatedKey" not in response:
                break
            kwargs["ExclusiveStartKey"] = response["LastEvaluatedKey"]
    return keys


def unmark(raw: Any, table: str, key: str) -> None:
    """As an idemctl before the index left a key it claimed: no ip_shard."""
    raw.update_item(TableName=table, Key={"key": {"S": key}}, UpdateExpression="REMOVE ip_shard")


def marks_hold(raw: Any, table: str) -> set[str]:
    """Check that exactly the live keys in progress carry ip_shard, their own shard, and
    that the index holds exactly those; return them."""
    now_ms = time.time() * 1000
    marked: set[str] = set()
    for it in items_of(raw, table):
        key = it["key"]["S"]
        if key.startswith(ENTITY_PREFIX):
            assert "ip_shard" not in it, it
            continue
        live = "expires_at" not in it or int(it["expires_at"]["N"]) > now_ms
        in_progress = it["status"]["S"] == "in_progress" and live
        assert ("ip_shard" in it) == in_progress, it
        if in_progress:
            assert it["ip_shard"]["S"] == str(zlib.crc32(key.encode()) % SHARDS)
            assert "lease_expires_at" in it  # the index's sort key
            marked.add(key)
    assert indexed(raw, table) == marked
    return marked


# The mark, on every write path ---------------------------------------------------------------


def test_every_write_leaves_the_mark_exactly_on_live_keys_in_progress(
    store: DynamoDBStore, raw: Any, table: str
) -> None:
    keys = [f"w-{i}" for i in range(6)]
    held = store.claim_many([ClaimRequest(k) for k in keys], lease=60.0)
    assert all(isinstance(h, Acquired) for h in held)
    assert marks_hold(raw, table) == set(keys)

    a = [h for h in held if isinstance(h, Acquired)]
    assert store.complete_many([Completion(h.key, h.owner, h.fencing_token, h.key) for h in a[:2]])
    store.fail("w-2", a[2].owner, a[2].fencing_token, "permanent", retriable=False)
    store.extend("w-3", a[3].owner, a[3].fencing_token, 120.0)
    store.release("w-4", a[4].owner, a[4].fencing_token, handler_ran=False)
    store.release("w-5", a[5].owner, a[5].fencing_token)
    assert marks_hold(raw, table) == {"w-3", "w-4", "w-5"}

    store.unlock("w-3", force=True)  # freed, still in progress
    again = acquire(store, "w-4")  # a released key claimed anew
    assert marks_hold(raw, table) == {"w-3", "w-4", "w-5"}

    store.fail("w-4", again.owner, again.fencing_token, "later", retriable=True)
    retried = acquire(store, "w-4")  # a retriable failure claimed again
    ended(store, "w-4")
    assert store.unlock_stale() == ["w-4"]
    assert marks_hold(raw, table) == {"w-3", "w-4", "w-5"}

    taken = acquire(store, "w-4")
    assert taken.fencing_token > retried.fencing_token
    ended(store, "w-4")
    over = acquire(store, "w-4")  # a takeover of an ended lease
    assert over.takeover
    store.forget("w-4", force=True)  # a tombstone: past retention, status left as it was
    store.forget("w-0")  # a completed key forgotten
    assert marks_hold(raw, table) == {"w-3", "w-5"}

    renewed = acquire(store, "w-4")  # the forgotten key's next life
    assert renewed.fencing_token > over.fencing_token
    for key in ("short", "gone"):
        s = acquire(store, key)
        store.complete(key, s.owner, s.fencing_token, None, retention=LONG)
    ended(store, "short", "gone")
    acquire(store, "short")  # past retention: a new life of the same item
    assert marks_hold(raw, table) == {"w-3", "w-4", "w-5", "short"}
    assert store.purge() == 2  # w-0's tombstone and gone, past retention
    assert item(raw, table, "w-0") is None and item(raw, table, "gone") is None
    assert marks_hold(raw, table) == {"w-3", "w-4", "w-5", "short"}


# Reads: the index, never a Scan ----------------------------------------------------------------


def test_in_progress_reads_with_filters_pages_and_unlock_never_scan(url: str) -> None:
    with open_ddb(url) as store:
        store.provision()
    with open_ddb(url) as store:  # a store of its own: it has not asked about the index yet
        _reads_never_scan(store)


def _reads_never_scan(store: DynamoDBStore) -> None:
    for i in range(5):
        acquire(store, f"a:stale-{i}")
        acquire(store, f"b:stale-{i}")
    for i in range(3):
        r = acquire(store, f"a:released-{i}")
        store.release(r.key, r.owner, r.fencing_token)
    acquire(store, "a:live")
    done = acquire(store, "a:done")
    store.complete("a:done", done.owner, done.fencing_token, None)
    ended(store, *(f"{side}:stale-{i}" for side in "ab" for i in range(5)))

    def listed(**options: Any) -> list[str]:
        keys, cursor = [], None
        while True:
            page = store.scan(limit=2, cursor=cursor, **options)
            keys += [r.key for r in page.records]
            if page.cursor is None:
                return sorted(keys)
            cursor = page.cursor

    stale = sorted([f"a:stale-{i}" for i in range(5)] + [f"b:stale-{i}" for i in range(5)])
    with asked(store) as seen:
        assert listed(stale_only=True) == stale
        assert listed(stale_only=True, prefix="a:") == [f"a:stale-{i}" for i in range(5)]
        assert listed(stale_only=True, older_than=3600) == []  # none created an hour ago
        assert listed(released_only=True) == [f"a:released-{i}" for i in range(3)]
        assert listed(status=Status.IN_PROGRESS, prefix="a:") == sorted(
            [f"a:stale-{i}" for i in range(5)] + [f"a:released-{i}" for i in range(3)] + ["a:live"]
        )
        stats = store.stats()
        assert (stats.stale, stats.released, stats.by_status[Status.IN_PROGRESS]) == (10, 3, 14)
        assert store.unlock_stale(older_than=3600) == []  # no lease ended an hour ago
        assert store.unlock_stale(dry_run=True) == stale
        assert store.unlock_stale() == stale
        assert listed(stale_only=True) == []
    assert "Scan" not in seen, seen
    assert seen.count("Query") >= 8 * SHARDS  # every listing asked every shard
    # Whether there is an index, asked once for the store; stats' item count.
    assert seen.count("DescribeTable") == 2

    with asked(store) as seen:  # the rest of the table is still scanned, and seen to be
        assert [r.key for r in store.scan(status=Status.COMPLETED).records] == ["a:done"]
        assert store.stats(exact=True).counted_by == "scan"
    assert seen.count("Scan") >= 2 and "Query" not in seen


def test_pages_give_every_key_once_across_shards_while_keys_change_between_pages(
    store: DynamoDBStore,
) -> None:
    keys = [f"p-{i:02d}" for i in range(40)]
    held = {
        h.key: h
        for h in store.claim_many([ClaimRequest(k) for k in keys], lease=LONG)
        if isinstance(h, Acquired)
    }
    assert sorted(held) == keys
    assert len({zlib.crc32(k.encode()) % SHARDS for k in keys}) > SHARDS // 2
    ended(store, *keys)

    def complete(key: str) -> None:
        store.complete(key, held[key].owner, held[key].fencing_token, None)

    seen: list[str] = []
    skipped: set[str] = set()  # completed before their page came
    page = store.scan(stale_only=True, limit=3)
    pages = 1
    while page.cursor is not None:
        assert len(page.records) == 3
        seen += [r.key for r in page.records]
        # The key the cursor stands at leaves the index, and so does one not listed yet:
        # the next page goes on after the cursor's place all the same.
        complete(page.records[-1].key)
        ahead = next((k for k in keys if k not in seen and k not in skipped), None)
        if ahead is not None and pages % 2:
            complete(ahead)
            skipped.add(ahead)
        page = store.scan(stale_only=True, limit=3, cursor=page.cursor)
        pages += 1
    assert 0 < len(page.records) <= 3  # the last page: never an empty one
    seen += [r.key for r in page.records]
    assert len(seen) == len(set(seen))
    assert sorted(seen) == sorted(set(keys) - skipped) and skipped
    assert pages >= (len(keys) - len(skipped)) // 3


@pytest.mark.parametrize(
    "cursor",
    [
        "not json",
        '{"key": {"S": "p-01"}}',  # a cursor of the table's scan, not of the index
        '{"ip": [16, 5, "k"]}',  # no such shard
        '{"ip": [-1, 5, "k"]}',
        '{"ip": ["3", 5, "k"]}',
        '{"ip": [3, "5", "k"]}',
        '{"ip": [3, -5, "k"]}',
        '{"ip": [3, 5, ""]}',
        '{"ip": [3, 5]}',
        '{"ip": [3, 5, "k", 1]}',
        "[3, 5, 7]",
    ],
)
def test_a_cursor_the_index_did_not_give_is_refused(store: DynamoDBStore, cursor: str) -> None:
    acquire(store, "k")
    with pytest.raises(InvalidCursor):
        store.scan(status=Status.IN_PROGRESS, cursor=cursor)


# unlock_stale ------------------------------------------------------------------------------


def test_unlock_stale_frees_in_batches_and_skips_a_key_taken_over_after_the_index_read(
    store: DynamoDBStore, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(package, "ITEMS_PER_BATCH", 3)
    keys = [f"u-{i}" for i in range(8)]
    for key in keys:
        acquire(store, key)
    live = acquire(store, "u-live")
    ended(store, *keys)

    # Another worker takes over u-0 just after the index was read: the index said it is
    # stale, the table no longer does.
    other = open_ddb(url)
    taken: list[Acquired] = []

    def take_over(parsed: dict[str, Any], **_: Any) -> None:
        if not taken and any(i["key"]["S"] == "u-0" for i in parsed.get("Items", [])):
            outcome = other.claim("u-0")
            assert isinstance(outcome, Acquired) and outcome.takeover
            taken.append(outcome)

    store.client.meta.events.register("after-call.dynamodb.Query", take_over)
    batches: list[int] = []
    try:
        freed = store.unlock_stale(progress=batches.append)
    finally:
        store.client.meta.events.unregister("after-call.dynamodb.Query", take_over)
        other.close()
    assert freed == keys[1:]
    assert taken  # after the index gave u-0 as stale
    # Progress counts what each batch looked at, the key left alone included.
    assert sum(batches) == len(keys) and all(0 < b <= 3 for b in batches)
    record = store.get("u-0")
    assert record is not None and record.owner == taken[0].owner  # left to its new owner
    for key in keys[1:]:
        r = store.get(key)
        assert r is not None and r.released()
    r = store.get("u-live")
    assert r is not None and r.owner == live.owner


# stats ---------------------------------------------------------------------------------------


def test_stats_from_the_index_are_exact_where_they_say_and_exact_stats_scan(
    store: DynamoDBStore, raw: Any, table: str
) -> None:
    acquire(store, "s:stale-1")
    acquire(store, "s:stale-2")
    r = acquire(store, "s:released")
    store.release(r.key, r.owner, r.fencing_token)
    held = acquire(store, "s:live")
    for i in range(3):
        d = acquire(store, f"s:done-{i}")
        store.complete(d.key, d.owner, d.fencing_token, i)
    f = acquire(store, "s:failed")
    store.fail(f.key, f.owner, f.fencing_token, "boom")
    # An entity of the sequence guard: an item of the table, counted by DynamoDB's count.
    assert store.guard_many([Guard("order-1", 1, "s:live", held.fencing_token)])
    ended(store, "s:stale-1", "s:stale-2")

    approximate = store.stats()
    exact = store.stats(exact=True)
    assert approximate.counted_by == "approximate" and exact.counted_by == "scan"
    assert dict(approximate.by_status) == {
        Status.IN_PROGRESS: 4,
        Status.COMPLETED: None,
        Status.FAILED: None,
    }
    assert (approximate.stale, approximate.released) == (2, 1)
    assert approximate.past_retention is None
    oldest = store.get("s:stale-1")
    assert oldest is not None and approximate.oldest_in_progress == oldest.created_at
    item_count = raw.describe_table(TableName=table)["Table"]["ItemCount"]
    assert approximate.total == max(item_count, 4)
    for name in ("stale", "released", "oldest_in_progress"):
        assert getattr(approximate, name) == getattr(exact, name), name
    assert approximate.by_status[Status.IN_PROGRESS] == exact.by_status[Status.IN_PROGRESS]

    assert dict(exact.by_status) == {Status.IN_PROGRESS: 4, Status.COMPLETED: 3, Status.FAILED: 1}
    assert (exact.total, exact.stale, exact.released, exact.past_retention) == (8, 2, 1, 0)
    assert exact == stats_of(store.scan(limit=1000).records, datetime.now(UTC))


# Provisioning and doctor -----------------------------------------------------------------------


def test_the_spec_makes_the_index_the_store_reads() -> None:
    with open_ddb("dynamodb://spec-only?region=us-east-1") as s:
        create = s.spec()["CreateTable"]
    (index,) = create["GlobalSecondaryIndexes"]
    assert index["IndexName"] == INDEX and index["KeySchema"] == INDEX_KEYS
    assert index["Projection"] == {"ProjectionType": "ALL"}
    types = {a["AttributeName"]: a["AttributeType"] for a in create["AttributeDefinitions"]}
    assert types == {"key": "S", "ip_shard": "S", "lease_expires_at": "N"}


def test_init_on_an_older_table_dry_run_then_marks_live_keys_in_progress_only(
    url: str, table: str, raw: Any
) -> None:
    make_old_table(raw, table)
    with open_ddb(url) as store:
        for i in range(4):
            acquire(store, f"old-{i}")
        done = acquire(store, "done")
        store.complete("done", done.owner, done.fencing_token, None)
        acquire(store, "forgotten")
        store.forget("forgotten", force=True)  # a tombstone still saying in_progress
        acquire(store, "new")  # claimed by this version: marked already
        for i in range(4):
            unmark(raw, table, f"old-{i}")
        ended(store, *(f"old-{i}" for i in range(4)))
        findings = {f.name: f for f in store.check()}
        assert findings["index"].level == "warn" and "missing" in findings["index"].detail
        assert "idemctl init" in (findings["index"].fix or "")

        before = items_of(raw, table)
        plan = store.provision(dry_run=True)
        assert plan.dry_run and not plan.changed
        assert any("UpdateTable" in step for step in plan.statements)
        assert items_of(raw, table) == before  # nothing marked
        assert not raw.describe_table(TableName=table)["Table"].get("GlobalSecondaryIndexes")
        with asked(store) as scans:  # no index yet: as before it, a scan
            assert len(store.scan(stale_only=True).records) == 4
            assert store.stats().counted_by == "scan"
        assert "Scan" in scans

        # old-1 is taken over by an earlier version's worker (no mark) between the scan
        # that finds it and the write that would mark it: that write must not apply.
        def bump(**_: Any) -> None:
            raw.update_item(
                TableName=table,
                Key={"key": {"S": "old-1"}},
                UpdateExpression="SET fencing_token = fencing_token + :one",
                ExpressionAttributeValues={":one": {"N": "1"}},
            )

        store.client.meta.events.register("after-call.dynamodb.Scan", bump)
        try:
            done_plan = store.provision()
        finally:
            store.client.meta.events.unregister("after-call.dynamodb.Scan", bump)
        assert done_plan.changed
        assert done_plan.statements[-1] == "marked 3 key(s) in progress"
        assert store.index_status() == "ACTIVE"
        assert indexed(raw, table) == {"old-0", "old-2", "old-3", "new"}
        forgotten = item(raw, table, "forgotten")
        assert forgotten is not None and "ip_shard" not in forgotten

        assert {f.name: f for f in store.check()}["index"].level == "ok"
        with asked(store) as scans:  # the same store reads the index from now on
            assert sorted(r.key for r in store.scan(stale_only=True).records) == [
                "old-0",
                "old-2",
                "old-3",
            ]
            assert store.stats().counted_by == "approximate"
        assert "Scan" not in scans and "Query" in scans
        again = store.provision()
        assert not again.changed and again.statements == []


def test_init_waits_for_an_index_being_built_and_says_when_it_gives_up(
    url: str, table: str, raw: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ``init`` stopped after UpdateTable left the index CREATING: the next one only
    waits for it. DynamoDB builds an index for minutes; moto at once, so here the status
    the store reads says CREATING a few times first."""
    make_old_table(raw, table)
    with open_ddb(url) as store:
        store.provision()  # the index, ACTIVE
        real = store._index
        building = iter(["CREATING"] * 3)

        def index(table: dict[str, Any] | None = None) -> dict[str, Any] | None:
            found = real(table)
            status = next(building, None)
            return found if found is None or status is None else {**found, "IndexStatus": status}

        monkeypatch.setattr(store, "_index", index)
        monkeypatch.setattr(provision, "INDEX_POLL", 0.0)
        findings = {f.name: f for f in store.check()}
        assert findings["index"].level == "warn" and "CREATING" in findings["index"].detail
        with asked(store) as calls:
            plan = store.provision()
        assert plan.statements == ["wait until index in_progress is ACTIVE (at most 600 s)"]
        assert "UpdateTable" not in calls and "Scan" not in calls
        assert next(building, None) is None  # it looked until the status said ACTIVE

        building = iter(["CREATING"] * 1000)
        monkeypatch.setattr(provision, "INDEX_WAIT", 0.0)
        with pytest.raises(StoreError, match=r"still CREATING.*idemctl init"):
            store.provision()


def test_an_index_of_that_name_with_other_keys_is_reported_and_not_read(
    url: str, table: str, raw: Any
) -> None:
    make_old_table(
        raw,
        table,
        definitions=[{"AttributeName": "status", "AttributeType": "S"}],
        GlobalSecondaryIndexes=[
            {
                "IndexName": INDEX,
                "KeySchema": [{"AttributeName": "status", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ],
    )
    with open_ddb(url) as store:
        done = store.provision()
        assert not any("UpdateTable" in step for step in done.statements)
        assert any("other keys" in note for note in done.notes)
        finding = {f.name: f for f in store.check()}["index"]
        assert finding.level == "warn" and "other keys" in finding.detail
        acquire(store, "k")
        ended(store, "k")
        with asked(store) as scans:
            assert [r.key for r in store.scan(stale_only=True).records] == ["k"]
            assert store.unlock_stale() == ["k"]
        assert "Scan" in scans


def test_a_store_that_may_not_describe_the_table_reads_by_scanning(
    store: DynamoDBStore,
) -> None:
    """DescribeTable refused (an IAM policy without it): the listings scan, as before."""
    acquire(store, "k")
    ended(store, "k")

    class Refused:
        status_code = 400

    def refuse(**_: Any) -> tuple[Any, dict[str, Any]]:
        error = {"Code": "AccessDeniedException", "Message": "no DescribeTable"}
        return Refused(), {"Error": error, "ResponseMetadata": {"HTTPStatusCode": 400}}

    store._index_active = None
    store.client.meta.events.register("before-call.dynamodb.DescribeTable", refuse)
    try:
        with asked(store) as scans:
            assert [r.key for r in store.scan(stale_only=True).records] == ["k"]
    finally:
        store.client.meta.events.unregister("before-call.dynamodb.DescribeTable", refuse)
    assert "Scan" in scans
