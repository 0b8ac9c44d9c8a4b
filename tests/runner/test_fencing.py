"""A key's fencing token never goes backwards: a key with no record starts at the clock in
microseconds, above every token an earlier life of the key (since deleted) can have had.
Over the row stores with a hand-driven clock; tests/contract runs the same on every store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from idemctl.model import Acquired
from idemctl.stores.machine import first_token
from idemctl.stores.memory import MemoryStore
from idemctl.stores.rows import RowStore
from idemctl.stores.sqlite import SQLiteStore
from tests.runner.test_runner import START, Clock


def test_first_token_is_the_clock_in_microseconds() -> None:
    assert first_token(START) == 1_767_225_600_000_000
    assert first_token(START + timedelta(microseconds=123_456)) == 1_767_225_600_123_456
    assert first_token(datetime(1970, 1, 1, tzinfo=UTC)) == 0
    # Exact in a Lua number (a double) and in JSON for centuries to come.
    assert first_token(datetime(2200, 1, 1, tzinfo=UTC)) < 2**53


@pytest.fixture(params=["memory", "sqlite"])
def row_store(request: pytest.FixtureRequest, tmp_path: Path) -> RowStore:
    clock = Clock()
    if request.param == "memory":
        return MemoryStore(clock=clock)
    return SQLiteStore(str(tmp_path / "fencing.db"), clock=clock)


def claim(store: RowStore, key: str) -> Acquired:
    outcome = store.claim(key, None, 60)
    assert isinstance(outcome, Acquired), outcome
    return outcome


def test_a_new_key_starts_at_the_stores_clock(row_store: RowStore) -> None:
    clock = row_store._clock
    assert isinstance(clock, Clock)
    clock.advance(0.012345)  # the row stores keep milliseconds, their tokens the clock's µs
    assert claim(row_store, "k").fencing_token == first_token(START) + 12_345


def test_purge_and_forget_never_turn_the_counter_back(row_store: RowStore) -> None:
    clock = row_store._clock
    assert isinstance(clock, Clock)
    held = claim(row_store, "k")
    for _ in range(5):
        row_store.unlock("k", force=True)
        held = claim(row_store, "k")
    assert held.fencing_token == first_token(START) + 5

    # forget keeps the counter in a tombstone: the next claim goes on at token + 1 ...
    row_store.forget("k", force=True)
    again = claim(row_store, "k")
    assert again.fencing_token == held.fencing_token + 1
    row_store.complete("k", again.owner, again.fencing_token, "done", retention=1)

    # ... and once purge deleted the record, even a millisecond later, the clock has moved
    # past every token the key had.
    clock.advance(1.001)
    assert row_store.purge() == 1
    assert row_store.get("k") is None
    last = claim(row_store, "k")
    assert last.fencing_token == first_token(clock.now) > again.fencing_token


def test_purge_keeps_a_record_until_the_clock_has_passed_its_tokens(row_store: RowStore) -> None:
    # Three claims with the clock standing still (two forced unlocks): tokens start,
    # start+1, start+2. Had purge deleted the record then, the next claim would have
    # started at `start` again, a token a zombie of the old life still holds.
    clock = row_store._clock
    assert isinstance(clock, Clock)
    held = claim(row_store, "k")
    for _ in range(2):
        row_store.unlock("k", force=True)
        held = claim(row_store, "k")
    row_store.forget("k", force=True)  # a tombstone past retention at once
    assert row_store.purge(dry_run=True) == 0
    assert row_store.purge() == 0
    assert claim(row_store, "k").fencing_token == held.fencing_token + 1

    row_store.forget("k", force=True)
    clock.advance(0.001)  # the clock has passed every token of the key
    assert row_store.purge(dry_run=True) == 1
    assert row_store.purge() == 1
    assert claim(row_store, "k").fencing_token == first_token(clock.now) > held.fencing_token + 1
