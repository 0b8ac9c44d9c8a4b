"""idemctl's library (``idemctl.powertools.open_table``) on the records Powertools'
RedisCachePersistenceLayer (CachePersistenceLayer) writes on a real redis-server: each a
string key holding JSON, with the Redis TTL at ``expiration``; and the ``KEY:lock`` helper
keys Powertools leaves when it takes a record over, which idemctl never lists, counts or
deletes."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from idemctl.errors import ConfigError, KeyNotFound, Refused
from idemctl.powertools import State, open_table
from idemctl.stores import open_store
from tests.cli.helpers import on
from tests.fixtures_redis import REDIS_PASSWORD
from tests.powertools.conftest import DB, PtTable
from tests.powertools.states import STALE_MS, VERDICT, build, powertools_verdicts
from tests.powertools.writers import call, key_of
from tests.servers import RedisServer

LOCK_TTL = 10
"""Seconds Powertools' ``_acquire_lock`` keeps ``KEY:lock`` (min(10, expires_after))."""


def now() -> datetime:
    return datetime.now(UTC)


def by_state(**counts: int) -> dict[State, int]:
    return {state: counts.get(state.value, 0) for state in State}


def test_states_as_powertools_judges_them(
    redis_pt: PtTable, redis_client: Any, tmp_path: Path
) -> None:
    """Completed, live, stale and blocked records (the in-progress ones left by a writer
    SIGKILLed inside the function), and an expired one that Redis has not deleted yet
    (PERSIST: as a record whose TTL Redis has not acted on)."""
    scenario = build(redis_pt, tmp_path, keep=redis_client.persist)
    table = redis_pt.open()

    stats = table.stats()
    assert stats.by_state == by_state(completed=1, in_progress=1, stale=1, blocked=1, expired=1)
    assert stats.skipped == 0
    assert (stats.total, stats.counted_by) == (5, "scan")
    at = now()
    for state, key in scenario.keys.items():
        record = table.get(key)
        assert record is not None, state
        assert record.state(at) is State(state), key
        assert record.partition is None
        raw = redis_pt.raw(key)
        assert raw is not None
        assert record.status == raw["status"]
        assert record.expiration is not None
        assert int(record.expiration.timestamp()) == raw["expiration"]
    done = table.get(scenario.keys["completed"])
    assert done is not None and done.data["order"] == scenario.payload("completed")

    assert [r.key for r in table.scan().records] == sorted(
        k for s, k in scenario.keys.items() if s != "expired"
    )
    assert [r.key for r in table.scan(states={State.STALE}).records] == [scenario.keys["stale"]]
    assert [r.key for r in table.scan(states={State.EXPIRED}).records] == [scenario.keys["expired"]]

    assert powertools_verdicts(scenario) == VERDICT


def test_lock_keys_are_never_listed_counted_or_deleted(
    redis_pt: PtTable, redis_client: Any
) -> None:
    """Powertools takes a stale record over through ``_acquire_lock`` (``SET KEY:lock True
    EX 10 NX``, left behind on purpose); a second lock is set as Powertools sets one. No
    look or repair of idemctl's shows or touches either."""
    taken, left = (redis_pt.job({"order_id": n}, remaining_ms=STALE_MS) for n in ("a", "b"))
    for job in (taken, left):
        assert call(replace(job, mode="crash")).kind == "crashed"
    past_ms = int(datetime.now().timestamp() * 1000) - 10_000  # their in-progress expiry passed
    for job in (taken, left):
        redis_pt.backdate(key_of(job), in_progress_expiration=past_ms)
    assert call(taken).kind == "ran"  # takes the stale record over
    lock = key_of(taken) + ":lock"
    assert redis_client.get(lock) == "True"
    assert 0 < redis_client.ttl(lock) <= LOCK_TTL

    done = redis_pt.job({"order_id": "c"})
    assert call(done).kind == "ran"
    other_lock = key_of(done) + ":lock"
    assert redis_client.set(other_lock, "True", ex=LOCK_TTL, nx=True)
    locks = {lock, other_lock}

    table = redis_pt.open()
    stats = table.stats()
    assert stats.by_state == by_state(completed=2, stale=1)
    assert stats.skipped == 0
    listed = {r.key for r in table.scan(states=set(State)).records}
    assert listed == {key_of(taken), key_of(left), key_of(done)}

    assert table.unlock_stale(dry_run=True) == [key_of(left)]
    assert table.unlock_stale() == [key_of(left)]
    assert table.purge() == 0
    assert table.forget(key_of(done)).key == key_of(done)
    for key in sorted(locks):
        for repair in (table.unlock, table.forget):
            with pytest.raises((Refused, KeyNotFound, ConfigError)):
                repair(key, force=True)
    assert {k for k in locks if redis_client.get(k) == "True"} == locks
    assert set(redis_client.keys("*")) == locks | {key_of(taken)}


def test_unlock_blocked_needs_force(redis_pt: PtTable, tmp_path: Path) -> None:
    scenario = build(redis_pt, tmp_path, ("blocked",), kill=False)
    key, job = scenario.keys["blocked"], scenario.jobs["blocked"]
    table = redis_pt.open()
    before = redis_pt.raw(key)

    with pytest.raises(Refused, match="blocked"):
        table.unlock(key)
    assert redis_pt.raw(key) == before
    assert call(job).kind == "in_progress"

    runs = scenario.runs("blocked")
    assert table.unlock(key, force=True).state(now()) is State.BLOCKED
    assert redis_pt.raw(key) is None
    assert call(job).kind == "ran"
    assert scenario.runs("blocked") == runs + 1
    assert call(job).kind == "replayed"
    assert scenario.runs("blocked") == runs + 1


def test_unlock_live_needs_force(redis_pt: PtTable, tmp_path: Path) -> None:
    scenario = build(redis_pt, tmp_path, ("in_progress", "completed"), kill=False)
    key = scenario.keys["in_progress"]
    table = redis_pt.open()
    before = redis_pt.raw(key)
    with pytest.raises(Refused, match="live"):
        table.unlock(key)
    assert table.unlock_stale() == []
    assert redis_pt.raw(key) == before
    with pytest.raises(Refused, match="forget"):
        table.unlock(scenario.keys["completed"])
    assert table.unlock(key, force=True).state(now()) is State.IN_PROGRESS
    assert redis_pt.raw(key) is None
    assert redis_pt.raw(scenario.keys["completed"]) is not None
    with pytest.raises(KeyNotFound):
        table.unlock(key)


def test_forget_completed_runs_again(redis_pt: PtTable) -> None:
    job = redis_pt.job({"order_id": "o-1"})
    assert call(job).kind == "ran"
    table = redis_pt.open()
    assert table.forget(key_of(job)).state(now()) is State.COMPLETED
    assert redis_pt.raw(key_of(job)) is None
    assert call(job).kind == "ran"
    assert redis_pt.runs(job.payload) == 2
    assert call(job).kind == "replayed"
    assert redis_pt.runs(job.payload) == 2


def test_other_keys_are_skipped(redis_pt: PtTable, redis_client: Any) -> None:
    job = redis_pt.job({"order_id": "o-1"})
    assert call(job).kind == "ran"
    redis_client.hset("someone:else", mapping={"a": "1"})
    redis_client.set("plain", "not json")
    redis_client.set("json-but-not-a-record", json.dumps({"x": 1}))
    table = redis_pt.open()
    stats = table.stats()
    assert stats.by_state == by_state(completed=1)
    assert stats.skipped == 3
    assert [r.key for r in table.scan(states=set(State)).records] == [key_of(job)]
    assert table.unlock_stale() == []
    assert table.purge() == 0
    assert redis_client.exists("someone:else", "plain", "json-but-not-a-record") == 3


@pytest.mark.parametrize(
    "option", ["key_attr=pk", "sort_key_attr=sk", "static_pk_value=idempotency%23f"]
)
def test_dynamodb_key_options_are_refused(redis_server: RedisServer, option: str) -> None:
    with pytest.raises(ConfigError):
        open_table(redis_server.url(f"/{DB}", f"layout=powertools&{option}"))


def test_own_protocol_is_refused(redis_pt: PtTable) -> None:
    with pytest.raises(ConfigError, match="owertools"):
        open_store(redis_pt.url)


def test_check(redis_pt: PtTable, tmp_path: Path) -> None:
    assert call(redis_pt.job({"order_id": "o-1"})).kind == "ran"
    good = redis_pt.open().check()
    assert good
    assert [(f.name, f.detail) for f in good if f.level != "ok"] == []

    scenario = build(redis_pt, tmp_path, ("blocked",), kill=False)
    findings = redis_pt.open().check()
    assert not [f for f in findings if f.level == "fail"]
    blocked = [f for f in findings if f.level == "warn" and "blocked" in f.name + f.detail]
    assert blocked, findings
    assert scenario.keys["blocked"] in blocked[0].detail


def test_password_is_redacted(redis_with_password: RedisServer) -> None:
    url = redis_with_password.url(f"/{DB}", "layout=powertools")
    assert REDIS_PASSWORD in url
    with open_table(url) as table:
        assert REDIS_PASSWORD not in table.url
        assert REDIS_PASSWORD not in repr(table)
        assert table.stats().total == 0
    result = on(url, "stats")
    assert result.exit_code == 0, result.stderr
    assert REDIS_PASSWORD not in result.stdout + result.stderr
