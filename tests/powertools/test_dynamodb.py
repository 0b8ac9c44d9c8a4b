"""idemctl's library (``idemctl.powertools.open_table``) on the tables Powertools'
DynamoDBPersistenceLayer writes, on moto's server: records written by Powertools itself,
in each layout (``dynamo``: single key ``id``; sort key with a static partition value; every
attribute renamed), judged as Powertools judges them, and repaired so that Powertools'
next call does what the repair promises."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from idemctl.errors import ConfigError, KeyNotFound, Refused
from idemctl.powertools import State, open_table
from idemctl.stores import open_store
from tests.powertools.conftest import LAYOUTS, PtTable, dynamodb_table, enable_ttl
from tests.powertools.states import ALL, STALE_MS, VERDICT, build, powertools_verdicts
from tests.powertools.writers import Job, call, key_of
from tests.servers import MotoServer


def now() -> datetime:
    return datetime.now(UTC)


def by_state(**counts: int) -> dict[State, int]:
    return {state: counts.get(state.value, 0) for state in State}


# Looking ---------------------------------------------------------------------------------------


def test_states_as_powertools_judges_them(dynamo: PtTable, tmp_path: Path) -> None:
    """Five records, the in-progress ones left by a writer SIGKILLed inside the function:
    stats counts each state once, get and scan say each one's state, and Powertools' own
    next call agrees with every verdict."""
    scenario = build(dynamo, tmp_path)
    table = dynamo.open()

    stats = table.stats()
    assert stats.by_state == by_state(completed=1, in_progress=1, stale=1, blocked=1, expired=1)
    assert stats.total == 5
    assert stats.skipped == 0
    assert stats.counted_by == "scan"

    at = now()
    for state, key in scenario.keys.items():
        record = table.get(key)
        assert record is not None, state
        assert record.key == key
        assert record.state(at) is State(state), key
        assert record.problems == ()

    page = table.scan()
    assert [r.key for r in page.records] == sorted(
        k for s, k in scenario.keys.items() if s != "expired"
    )
    assert page.cursor is None
    for state in ALL:
        assert [r.key for r in table.scan(states={State(state)}).records] == [
            scenario.keys[state]
        ], state
    assert [r.key for r in table.scan(states={State.STALE, State.BLOCKED}).records] == sorted(
        [scenario.keys["stale"], scenario.keys["blocked"]]
    )

    assert powertools_verdicts(scenario) == VERDICT


def test_record_fields_are_what_powertools_stored(dynamo: PtTable, tmp_path: Path) -> None:
    scenario = build(dynamo, tmp_path, ("completed", "in_progress"), kill=False)
    table = dynamo.open()
    partition = dynamo.layer.get("static_pk_value")
    for state in ("completed", "in_progress"):
        key = scenario.keys[state]
        raw = dynamo.raw(key)
        record = table.get(key)
        assert raw is not None and record is not None
        assert record.status == raw[dynamo.attr("status_attr")]
        assert record.expiration is not None
        assert int(record.expiration.timestamp()) == raw[dynamo.attr("expiry_attr")]
        assert record.partition == partition
        doc = json.loads(json.dumps(record.to_json(now())))
        assert doc["key"] == key
        assert doc["state"] == state
        assert doc["partition"] == partition
        assert doc["status"] == raw[dynamo.attr("status_attr")]
        assert doc["expiration"].endswith("Z")
        assert doc["problems"] == []
        if dynamo.name == "renamed":  # its jobs validate the payload: a hash is stored
            assert raw[dynamo.attr("validation_key_attr")]
            assert record.validation == raw[dynamo.attr("validation_key_attr")]

    done = table.get(scenario.keys["completed"])
    assert done is not None
    stored = dynamo.raw(scenario.keys["completed"])
    assert stored is not None
    assert done.data == json.loads(stored[dynamo.attr("data_attr")])
    assert done.data["order"] == scenario.payload("completed")
    assert done.in_progress_expiration is None or done.state(now()) is State.COMPLETED

    live = table.get(scenario.keys["in_progress"])
    raw_live = dynamo.raw(scenario.keys["in_progress"])
    assert live is not None and raw_live is not None
    assert live.in_progress_expiration is not None
    ms = int(raw_live[dynamo.attr("in_progress_expiry_attr")])
    assert abs(int(live.in_progress_expiration.timestamp() * 1000) - ms) <= 1
    assert live.data is None


def test_scan_pages_and_prefix(single: PtTable) -> None:
    a = [single.job({"n": i}, key_prefix="orders-a") for i in range(3)]
    b = [single.job({"n": i}, key_prefix="orders-b") for i in range(2)]
    for job in a + b:
        assert call(job).kind == "ran"
    keys_a = sorted(key_of(j) for j in a)
    keys = sorted(keys_a + [key_of(j) for j in b])
    table = single.open()

    assert [r.key for r in table.scan(prefix="orders-a#").records] == keys_a
    first = table.scan(limit=2)
    assert [r.key for r in first.records] == keys[:2]
    assert first.cursor is not None
    second = table.scan(limit=2, cursor=first.cursor)
    assert [r.key for r in second.records] == keys[2:4]
    third = table.scan(limit=2, cursor=second.cursor)
    assert [r.key for r in third.records] == keys[4:]
    assert third.cursor is None


def test_other_items_are_skipped_not_counted(single: PtTable, moto_server: MotoServer) -> None:
    assert call(single.job({"n": 1})).kind == "ran"
    moto_server.client().put_item(
        TableName=single.store.table, Item={"id": {"S": "not-powertools"}, "x": {"N": "1"}}
    )
    table = single.open()
    stats = table.stats()
    assert stats.by_state == by_state(completed=1)
    assert stats.skipped == 1
    assert [r.key for r in table.scan(states=set(State)).records] == [key_of(single.job({"n": 1}))]


def test_sort_key_table_partitions(moto_server: MotoServer, tmp_path: Path) -> None:
    """Two functions' partitions in one sort-key table: a URL without static_pk_value reads
    both, and refuses a single key (which partition?); with one it reads its own."""
    layer = LAYOUTS["sort"]
    orders = dynamodb_table(moto_server, tmp_path, "sort", layer)
    refunds_layer = {**layer, "static_pk_value": "idempotency#refunds"}
    refunds = replace(
        orders,
        url=moto_server.url(orders.store.table, layout="powertools", **refunds_layer),
        store=replace(orders.store, layer=refunds_layer),
        opened=[],
    )
    try:
        mine = orders.job({"order": 1})
        theirs = refunds.job({"refund": 1})
        assert call(mine).kind == "ran"
        assert call(theirs).kind == "ran"
        everything = orders.open(
            moto_server.url(orders.store.table, layout="powertools", sort_key_attr="sk")
        )
        assert everything.stats().by_state == by_state(completed=2)
        listed = {r.key: r.partition for r in everything.scan().records}
        assert listed == {
            key_of(mine): "idempotency#orders",
            key_of(theirs): "idempotency#refunds",
        }
        with pytest.raises(ConfigError, match="static_pk_value"):
            everything.get(key_of(mine))

        own = orders.open()
        assert own.stats().by_state == by_state(completed=1)
        assert [r.key for r in own.scan().records] == [key_of(mine)]
        assert own.get(key_of(theirs)) is None
        got = refunds.open().get(key_of(theirs))
        assert got is not None and got.partition == "idempotency#refunds"
    finally:
        orders.close()
        refunds.close()


def test_bare_hash_in_static_pk_value_is_refused(moto_server: MotoServer) -> None:
    url = moto_server.url("t", layout="powertools", sort_key_attr="sk", static_pk_value="a#b")
    assert "%23" in url
    with pytest.raises(ConfigError, match="%23"):
        open_table(url.replace("%23", "#"))


@pytest.mark.parametrize(
    "options",
    [
        {"expiry_atr": "exp"},  # a typo: no such option
        {"sort_key_attr": "id"},  # Powertools' constructor refuses a sort key named as the key
        {"layout": "idemctl"},
    ],
    ids=["typo", "sort-key-is-the-key", "other-layout"],
)
def test_bad_url_options_are_refused(moto_server: MotoServer, options: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        open_table(moto_server.url("orders", **{"layout": "powertools", **options}))


def test_own_protocol_is_refused(single: PtTable) -> None:
    with pytest.raises(ConfigError, match="owertools"):
        open_store(single.url)


# Repairing -------------------------------------------------------------------------------------


def test_unlock_stale_frees_exactly_the_stale(dynamo: PtTable, tmp_path: Path) -> None:
    scenario = build(dynamo, tmp_path, ("completed", "in_progress", "stale", "blocked"), kill=False)
    stale = scenario.keys["stale"]
    table = dynamo.open()
    before = {s: dynamo.raw(k) for s, k in scenario.keys.items()}
    assert all(before.values())

    assert table.unlock_stale(older_than=60) == []  # its in-progress expiry is 1 s past
    assert table.unlock_stale(dry_run=True) == [stale]
    assert dynamo.raw(stale) == before["stale"]
    assert table.unlock_stale() == [stale]
    assert dynamo.raw(stale) is None
    for state, key in scenario.keys.items():
        if state != "stale":
            assert dynamo.raw(key) == before[state], state
    assert table.unlock_stale() == []
    assert table.stats().by_state == by_state(completed=1, in_progress=1, blocked=1)

    runs = scenario.runs("stale")
    assert call(scenario.jobs["stale"]).kind == "ran"
    assert scenario.runs("stale") == runs + 1
    after = dynamo.raw(stale)
    assert after is not None and after[dynamo.attr("status_attr")] == "COMPLETED"
    assert call(scenario.jobs["stale"]).kind == "replayed"
    assert scenario.runs("stale") == runs + 1


def test_unlock_blocked_needs_force(dynamo: PtTable, tmp_path: Path) -> None:
    scenario = build(dynamo, tmp_path, ("blocked",), kill=False)
    key, job = scenario.keys["blocked"], scenario.jobs["blocked"]
    table = dynamo.open()
    before = dynamo.raw(key)

    with pytest.raises(Refused, match="blocked"):
        table.unlock(key)
    assert dynamo.raw(key) == before
    assert call(job).kind == "in_progress"  # Powertools still refuses the payload

    runs = scenario.runs("blocked")
    freed = table.unlock(key, force=True)
    assert freed.key == key
    assert freed.state(now()) is State.BLOCKED
    assert dynamo.raw(key) is None
    assert call(job).kind == "ran"
    assert scenario.runs("blocked") == runs + 1
    done = dynamo.raw(key)
    assert done is not None and done[dynamo.attr("status_attr")] == "COMPLETED"
    assert call(job).kind == "replayed"
    assert scenario.runs("blocked") == runs + 1


def test_unlock_live_needs_force(dynamo: PtTable, tmp_path: Path) -> None:
    scenario = build(dynamo, tmp_path, ("in_progress",), kill=False)
    key = scenario.keys["in_progress"]
    table = dynamo.open()
    before = dynamo.raw(key)

    with pytest.raises(Refused, match="live"):
        table.unlock(key)
    assert dynamo.raw(key) == before
    assert table.unlock_stale() == []
    assert dynamo.raw(key) == before

    freed = table.unlock(key, force=True)
    assert freed.state(now()) is State.IN_PROGRESS
    assert dynamo.raw(key) is None


def test_unlock_refuses_completed_and_absent(single: PtTable) -> None:
    job = single.job({"n": 1})
    assert call(job).kind == "ran"
    key = key_of(job)
    table = single.open()
    with pytest.raises(Refused, match="forget"):
        table.unlock(key)
    with pytest.raises(Refused):
        table.unlock(key, force=True)  # --force frees any INPROGRESS record, not a completed one
    assert single.raw(key) is not None
    with pytest.raises(KeyNotFound):
        table.unlock(key_of(single.job({"n": 2})))


def test_forget_completed_runs_again(dynamo: PtTable) -> None:
    job = dynamo.job({"order_id": "o-1", "amount": 3})
    assert call(job).kind == "ran"
    key = key_of(job)
    table = dynamo.open()

    forgotten = table.forget(key)
    assert forgotten.key == key
    assert forgotten.state(now()) is State.COMPLETED
    assert dynamo.raw(key) is None
    assert call(job).kind == "ran"
    assert dynamo.runs(job.payload) == 2
    assert call(job).kind == "replayed"
    assert dynamo.runs(job.payload) == 2
    with pytest.raises(KeyNotFound):
        table.forget(key_of(dynamo.job({"order_id": "never"})))


def test_forget_in_progress_needs_force(dynamo: PtTable, tmp_path: Path) -> None:
    scenario = build(dynamo, tmp_path, ("in_progress", "blocked"), kill=False)
    table = dynamo.open()
    for state in ("in_progress", "blocked"):
        key = scenario.keys[state]
        with pytest.raises(Refused):
            table.forget(key)
        assert dynamo.raw(key) is not None
        assert table.forget(key, force=True).key == key
        assert dynamo.raw(key) is None


def test_unlock_key_and_purge_of_ended_records(dynamo: PtTable, tmp_path: Path) -> None:
    """``unlock KEY`` without force frees a record whose invocation is over: stale, or in
    progress and past expiration; ``purge`` deletes exactly the expired ones."""
    gone = dynamo.job({"order_id": "blocked-then-expired"}, expires_after_seconds=1)
    assert call(replace(gone, mode="crash")).kind == "crashed"  # blocked until it expires
    dynamo.backdate(key_of(gone), **{dynamo.attr("expiry_attr"): int(time.time()) - 10})
    scenario = build(dynamo, tmp_path, ("completed", "stale", "blocked", "expired"), kill=False)
    keys = scenario.keys
    table = dynamo.open()
    record = table.get(key_of(gone))
    assert record is not None and record.status == "INPROGRESS"
    assert record.state(now()) is State.EXPIRED
    assert table.stats().by_state == by_state(completed=1, stale=1, blocked=1, expired=2)

    for key in (keys["stale"], key_of(gone)):
        assert table.unlock(key).key == key
        assert dynamo.raw(key) is None

    assert table.purge(older_than=3600) == 0
    assert table.purge(dry_run=True) == 1
    assert dynamo.raw(keys["expired"]) is not None
    assert table.purge() == 1
    assert dynamo.raw(keys["expired"]) is None
    assert dynamo.raw(keys["completed"]) is not None
    assert dynamo.raw(keys["blocked"]) is not None
    assert table.stats().by_state == by_state(completed=1, blocked=1)
    assert call(scenario.jobs["expired"]).kind == "ran"


# doctor --------------------------------------------------------------------------------------


def test_check_good_table(single: PtTable, moto_server: MotoServer) -> None:
    enable_ttl(moto_server, single)
    assert call(single.job({"n": 1})).kind == "ran"
    findings = single.open().check()
    assert findings
    assert [(f.name, f.detail) for f in findings if f.level != "ok"] == []


def test_check_reports_blocked_and_missing_ttl(
    single: PtTable, moto_server: MotoServer, tmp_path: Path
) -> None:
    scenario = build(single, tmp_path, ("completed", "blocked"), kill=False)
    findings = single.open().check()
    warnings = [f for f in findings if f.level == "warn"]
    assert not [f for f in findings if f.level == "fail"]
    assert any("ttl" in (f.name + f.detail).lower() for f in warnings), findings
    blocked = [f for f in warnings if "blocked" in (f.name + f.detail).lower()]
    assert blocked, findings
    assert scenario.keys["blocked"] in blocked[0].detail

    enable_ttl(moto_server, single)
    findings = single.open().check()
    assert not any("ttl" in (f.name + f.detail).lower() for f in findings if f.level != "ok")
    assert any("blocked" in (f.name + f.detail).lower() for f in findings if f.level == "warn")


def test_check_ttl_on_another_attribute(moto_server: MotoServer, tmp_path: Path) -> None:
    """TTL on ``expiration`` while the layer writes ``exp_at``: nothing ever expires."""
    table = dynamodb_table(moto_server, tmp_path, "renamed", LAYOUTS["renamed"])
    try:
        moto_server.client().update_time_to_live(
            TableName=table.store.table,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": "expiration"},
        )
        findings = table.open().check()
        assert any("ttl" in (f.name + f.detail).lower() for f in findings if f.level == "warn")
        enable_ttl(moto_server, table)
        findings = table.open().check()
        assert [(f.name, f.detail) for f in findings if f.level != "ok"] == []
    finally:
        table.close()


def test_check_wrong_key_schema_fails(single: PtTable, moto_server: MotoServer) -> None:
    url = moto_server.url(single.store.table, layout="powertools", key_attr="pk")
    findings = single.open(url).check()
    assert any(f.level == "fail" for f in findings), findings


def test_every_partition_of_a_sort_key_table(moto_server: MotoServer, tmp_path: Path) -> None:
    """Without static_pk_value, unlock_stale and purge free the records of every
    partition (each under the partition it is in)."""
    layer = LAYOUTS["sort"]
    orders = dynamodb_table(moto_server, tmp_path, "sort", layer)
    refunds = replace(orders, store=replace(orders.store, layer={**layer, "static_pk_value": "r"}))
    try:
        jobs = [t.job({"n": t.store.layer["static_pk_value"]}) for t in (orders, refunds)]
        past = int(time.time()) - 10
        for job in jobs:
            assert call(replace(job, mode="crash", remaining_ms=STALE_MS)).kind == "crashed"
            backdate(moto_server, job, in_progress_expiration=past * 1000)
        for t in (orders, refunds):
            expired = t.job({"e": t.store.layer["static_pk_value"]}, expires_after_seconds=1)
            assert call(expired).kind == "ran"
            backdate(moto_server, expired, expiration=past)
        scenario = build(orders, tmp_path, ("expired", "blocked"), kill=False)
        table = orders.open(
            moto_server.url(orders.store.table, layout="powertools", sort_key_attr="sk")
        )
        assert table.stats().by_state == by_state(stale=2, expired=3, blocked=1)
        assert sorted(table.unlock_stale()) == sorted(key_of(j) for j in jobs)
        assert table.purge() == 3
        assert table.stats().by_state == by_state(blocked=1)
        assert [r.key for r in table.scan().records] == [scenario.keys["blocked"]]
    finally:
        orders.close()


def backdate(server: MotoServer, job: Job, **attributes: int) -> None:
    """Move ``job``'s record's expiries into the past, on a sort-key table's partition
    (``static_pk_value``) of the job's own layer."""
    layer = job.store.layer
    key = {"id": {"S": layer["static_pk_value"]}, layer["sort_key_attr"]: {"S": key_of(job)}}
    names = {f"#a{i}": name for i, name in enumerate(attributes)}
    values = {f":v{i}": {"N": str(v)} for i, v in enumerate(attributes.values())}
    server.client().update_item(
        TableName=job.store.table, Key=key, ExpressionAttributeNames=names,
        ExpressionAttributeValues=values,
        UpdateExpression="SET " + ", ".join(f"#a{i} = :v{i}" for i in range(len(names))),
    )  # fmt: skip
