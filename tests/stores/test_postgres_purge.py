"""A purge on PostgreSQL beside claimers (real server): it never blocks, fails or deadlocks a
claim, including claims of the very keys it is deleting, and each batch commits on its own
(an interrupted purge keeps what it did; the next one goes on)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from idemctl import Acquired, ClaimRequest, Completion, open_store
from idemctl.stores import postgres as package
from tests.backends import unique_schema
from tests.servers import PostgresServer

EXPIRED = 20_000
CLAIMERS = 3


def fill_expired(url: str, n: int) -> None:
    with open_store(url) as store:
        store.provision()
        for start in range(0, n, 500):
            got = store.claim_many([ClaimRequest(f"old-{i}") for i in range(start, start + 500)])
            store.complete_many(
                [
                    Completion(o.key, o.owner, o.fencing_token)
                    for o in got
                    if isinstance(o, Acquired)
                ],
                retention=3600,
            )
        # Every record's retention ended a minute ago: written so (tests/backends.py's way).
        with store.connection() as conn:
            conn.execute(f"UPDATE {store.keys_table} SET expires_at = now() - interval '1 minute'")


def claimer(url: str, worker: int, stop: threading.Event, seen: dict[str, Any]) -> None:
    """Claims and completes new keys and, every other time, an expired key the purge may be
    deleting at that moment: each claim must be Acquired, none may raise."""
    n = 0
    with open_store(url) as store:
        while not stop.is_set():
            key = f"old-{(worker * 7919 + n * 104729) % EXPIRED}" if n % 2 else f"new-{worker}-{n}"
            n += 1
            try:
                got = store.claim(key)
                assert isinstance(got, Acquired), (key, got)
                store.complete(key, got.owner, got.fencing_token)
                seen["claims"] += 1
            except BaseException as exc:
                seen["errors"].append(f"{key}: {type(exc).__name__}: {exc}")


def test_a_purge_beside_claimers_never_fails_or_blocks_a_claim(
    postgres_server: PostgresServer,
) -> None:
    url = postgres_server.url(schema=unique_schema())
    fill_expired(url, EXPIRED)
    seen: dict[str, Any] = {"claims": 0, "errors": []}
    stop = threading.Event()
    threads = [threading.Thread(target=claimer, args=(url, w, stop, seen)) for w in range(CLAIMERS)]
    for t in threads:
        t.start()
    try:
        with open_store(url) as store:
            batches: list[int] = []
            purged = store.purge(progress=batches.append)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not seen["errors"], seen["errors"][:5]
    assert seen["claims"] > 0
    # Every expired row went, but for those a claimer took back meanwhile (now live again).
    assert EXPIRED - seen["claims"] <= purged <= EXPIRED
    assert len(batches) >= EXPIRED // package.BATCH // 2  # many batches, each its own commit
    with open_store(url) as store:
        assert store.stats().past_retention == 0  # the rows it skipped were claimed: live


def test_an_interrupted_purge_keeps_its_batches_and_the_next_goes_on(
    postgres_server: PostgresServer,
) -> None:
    url = postgres_server.url(schema=unique_schema())
    fill_expired(url, 3_000)

    class Interrupted(Exception):
        pass

    def stop_after_two(n: int) -> None:
        done.append(n)
        if len(done) == 2:
            raise Interrupted  # as Ctrl-C would, between two batches

    done: list[int] = []
    with open_store(url) as store:
        with pytest.raises(Interrupted):
            store.purge(progress=stop_after_two)
        assert sum(done) == 2 * package.BATCH
        assert store.purge(dry_run=True) == 3_000 - 2 * package.BATCH
        assert store.purge() == 3_000 - 2 * package.BATCH
        assert store.purge(dry_run=True) == 0
