"""SQLite-specific: the embedded default is often created by several processes at once
(two `idemctl consume` started together on a new file)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest

from idemctl import Acquired, Completion, open_store

PROCESSES = 8
ROUNDS = 8


def _first_use(url: str, barrier: Any, out: Any) -> None:
    store = open_store(url)
    barrier.wait()
    try:
        outcomes = [store.claim(f"k-{i}") for i in range(5)]
        out.put(sum(isinstance(o, Acquired) for o in outcomes))
    except Exception as exc:
        out.put(f"{type(exc).__name__}: {exc}")


@pytest.mark.slow  # a multi-process race, on the standard library's sqlite3 alone
def test_processes_creating_one_database_at_once_all_work(tmp_path: Path) -> None:
    """Each round, 8 processes open a database that does not exist yet and claim the same
    5 keys at once: none fails (a file turning to WAL under it, a stale view of the schema),
    and each key is acquired exactly once."""
    ctx = multiprocessing.get_context("spawn")
    for round_ in range(ROUNDS):
        url = f"sqlite:///{tmp_path}/round-{round_}.db"
        barrier, out = ctx.Barrier(PROCESSES), ctx.Queue()
        procs = [ctx.Process(target=_first_use, args=(url, barrier, out)) for _ in range(PROCESSES)]
        for p in procs:
            p.start()
        try:
            answers = [out.get(timeout=60) for _ in procs]
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
        errors = [a for a in answers if isinstance(a, str)]
        assert errors == [], f"round {round_}"
        assert sum(answers) == 5, f"round {round_}: {answers}"


def test_reads_pushed_into_sql_agree_with_reading_every_row(tmp_path: Path) -> None:
    """stats, count_entities, scan_entities and prefix scans, each answered by SQL of its
    own (indexes, no full read into Python), agree with the generic answers computed in
    Python from every row: keys of each status live and past retention (a forgotten key in
    progress, completed and failed keys past theirs), entities live and past retention, and
    prefixes whose last character is the highest code point or sorts next to others."""
    from datetime import UTC, datetime, timedelta

    from idemctl.model import ClaimRequest, Guard, Settle, Status
    from idemctl.stores.queries import RecordFilter, stats_of
    from idemctl.stores.rows import RowStore
    from idemctl.stores.sqlite import SQLiteStore

    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    store = SQLiteStore(str(tmp_path / "k.db"), clock=lambda: now[0])
    top = chr(0x10FFFF)
    names = ["a", "a/1", "a/2", "a0", f"a{top}", f"a{top}x", "b\ud7ff", "b\ue000", "é/1", "é0"]
    held = {}
    for i, name in enumerate(names):
        got = store.claim(name, lease=1 if i % 3 == 0 else 3600)
        assert isinstance(got, Acquired)
        held[name] = got
    store.complete("a", held["a"].owner, held["a"].fencing_token, retention=5)
    store.complete("a/1", held["a/1"].owner, held["a/1"].fencing_token)
    store.fail("a/2", held["a/2"].owner, held["a/2"].fencing_token, "no", retention=5)
    store.fail("a0", held["a0"].owner, held["a0"].fencing_token, "no", retriable=False)
    store.release("é/1", held["é/1"].owner, held["é/1"].fencing_token)
    store.forget(f"a{top}x", force=True)
    for n in range(12):
        key = f"g-{n}"
        (got,) = store.claim_many([ClaimRequest(key)])
        assert isinstance(got, Acquired)
        entity = f"acct:{top if n == 11 else ''}{n:02d}"
        store.guard_many([Guard(entity, 1, key, got.fencing_token)])
        store.finish_many(
            [Completion(key, got.owner, got.fencing_token)],
            [Settle(entity, 1, key, got.fencing_token)],
            retention=5 if n % 4 == 0 else None,
        )
    for step in (0, 2, 10):  # leases end at 1 s, retentions at 5 s
        now[0] += timedelta(seconds=step)
        with store._transaction(write=False) as tx:
            every = tx.select(RecordFilter())
            entities = tx.select_entities(None, None, None)
        expected = stats_of(every, now[0])
        got_stats = store.stats()
        assert (got_stats.total, dict(got_stats.by_status), got_stats.stale,
                got_stats.oldest_in_progress, got_stats.past_retention, got_stats.released) == (
            expected.total, dict(expected.by_status), expected.stale,
            expected.oldest_in_progress, expected.past_retention, expected.released,
        )  # fmt: skip
        assert store.count_entities() == RowStore.count_entities(store)
        assert store.count_entities() == sum(not e.retention_over(now[0]) for e in entities)
        for prefix in (None, "acct:", f"acct:{top}", "acct:0", "nope"):
            for limit in (1, 3, 50):
                pages: tuple[list[Any], list[Any]] = [], []
                for i, scan in enumerate(
                    (store.scan_entities, lambda *a: RowStore.scan_entities(store, *a))
                ):
                    cursor = None
                    while True:
                        entity_page = scan(prefix, limit, cursor)
                        pages[i].append(
                            ([e.entity for e in entity_page.entities], entity_page.cursor)
                        )
                        cursor = entity_page.cursor
                        if cursor is None:
                            break
                assert pages[0] == pages[1], (prefix, limit)
        for prefix in ("a", "a/", "a0", f"a{top}", "b", "b\ud7ff", "é", "é/", "z", ""):
            for status in (None, *Status):
                query = RecordFilter(status=status, prefix=prefix or None, live_at=now[0])
                expected_keys = sorted(r.key for r in every if query.matches(r))
                found: list[str] = []
                cursor = None
                while True:
                    page = store.scan(status=status, prefix=prefix or None, limit=2, cursor=cursor)
                    found += [r.key for r in page.records]
                    cursor = page.cursor
                    if cursor is None:
                        break
                assert found == expected_keys, (prefix, status)
