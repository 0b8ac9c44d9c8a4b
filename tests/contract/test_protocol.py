"""The claim/complete protocol: one suite, run on every store in tests/backends.py.

Stores judge time by their own clock (Redis TIME, Postgres now()), so a fake clock cannot
be injected everywhere; the test sets the store's times instead. A lease the test needs live
is long (LONG: an hour, however loaded the machine); one it needs run out is made so
(tests/backends.py's ``expire_lease``, ``expire_hold``), and a record that must be older
than X gets past times written (``backdate``), and a retention the test needs over is
made so too (``expire_retention``): no test here sleeps for a lease or a retention to end.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from idemctl import (
    Acquired,
    Busy,
    ClaimRequest,
    Completed,
    Completion,
    Failed,
    InvalidKey,
    KeyNotFound,
    LeaseLost,
    Mismatch,
    Refused,
    Status,
    fingerprint,
)
from idemctl.runner import Outcome
from idemctl.stores.base import Store
from tests.backends import Backend, backdate, expire_lease, expire_retention
from tests.contract.api import counts, run

LONG = 3600.0  # a lease or retention that stays live for the whole test
AGO = 600.0  # how far back a test sets a record's clock (backdate)
CLOCK_SLACK_US = 1_000_000  # how far a store's clock may be from this machine's, in µs


def acquire(store: Store, key: str, fp: str | None = None, lease: float = LONG) -> Acquired:
    outcome = store.claim(key, fp, lease)
    assert isinstance(outcome, Acquired), outcome
    return outcome


def test_first_claim_acquires(store: Store) -> None:
    before = time.time_ns() // 1000
    a = acquire(store, "order-1", fingerprint({"amount": 10}))
    after = time.time_ns() // 1000
    assert (a.attempt, a.takeover) == (1, False)
    # A key with no record starts its fencing counter at the store's clock in microseconds:
    # above every token an earlier life of the key, since deleted, can have had.
    assert before - CLOCK_SLACK_US <= a.fencing_token <= after + CLOCK_SLACK_US
    record = store.get("order-1")
    assert record is not None
    assert record.status is Status.IN_PROGRESS
    assert record.owner == a.owner
    assert record.fencing_token == a.fencing_token
    assert record.attempts == 1
    assert record.fingerprint == fingerprint({"amount": 10})
    assert record.lease_expires_at is not None and record.lease_expires_at > record.created_at


def test_get_missing_is_none(store: Store) -> None:
    assert store.get("never-seen") is None


def test_duplicate_after_completion_replays_without_running(store: Store) -> None:
    runs: list[str] = []

    def handler(ctx: object) -> dict[str, object]:
        runs.append("ran")
        return {"charge_id": "ch_1", "amount": 10, "note": "ünïcödé"}

    first = run(store, "order-1", handler, fingerprint=fingerprint({"amount": 10}))
    second = run(store, "order-1", handler, fingerprint=fingerprint({"amount": 10}))
    assert first.outcome is Outcome.EXECUTED
    assert second.outcome is Outcome.REPLAYED
    assert second.result == {"charge_id": "ch_1", "amount": 10, "note": "ünïcödé"}
    assert runs == ["ran"]
    record = store.get("order-1")
    assert record is not None and record.status is Status.COMPLETED
    assert record.result == second.result
    assert record.owner is None
    assert record.completed_at is not None and record.expires_at is not None


def test_complete_returns_the_record_as_stored(store: Store) -> None:
    a = acquire(store, "order-1", fingerprint({"amount": 10}))
    done = store.complete("order-1", a.owner, a.fencing_token, {"charge_id": "ch_1", "n": [1]})
    assert done == store.get("order-1")
    assert done.status is Status.COMPLETED and done.owner is None
    assert done.fingerprint == fingerprint({"amount": 10})
    assert (done.fencing_token, done.attempts) == (a.fencing_token, 1)
    assert done.result == {"charge_id": "ch_1", "n": [1]}
    assert done.completed_at is not None and done.expires_at is not None
    assert done.created_at <= done.completed_at < done.expires_at


def test_other_payload_same_key_is_mismatch(store: Store) -> None:
    a = acquire(store, "order-1", fingerprint({"amount": 10}))
    store.complete("order-1", a.owner, a.fencing_token, "ok")
    outcome = store.claim("order-1", fingerprint({"amount": 99}))
    assert isinstance(outcome, Mismatch)
    assert outcome.record.fingerprint == fingerprint({"amount": 10})
    # The same payload still replays.
    assert isinstance(store.claim("order-1", fingerprint({"amount": 10})), Completed)


def test_live_lease_is_busy(store: Store) -> None:
    a = acquire(store, "order-1")
    outcome = store.claim("order-1")
    assert isinstance(outcome, Busy)
    assert outcome.record.owner == a.owner
    assert outcome.record.fencing_token == a.fencing_token


@pytest.mark.clock
def test_expired_lease_is_taken_over_and_old_owner_is_fenced(store: Store) -> None:
    old = acquire(store, "order-1")
    expire_lease(store, "order-1")
    new = acquire(store, "order-1")
    assert new.takeover is True
    assert new.fencing_token == old.fencing_token + 1
    assert new.attempt == 2
    assert new.owner != old.owner

    for call in (
        lambda: store.complete("order-1", old.owner, old.fencing_token, "zombie"),
        lambda: store.fail("order-1", old.owner, old.fencing_token, "zombie"),
        lambda: store.extend("order-1", old.owner, old.fencing_token, LONG),
        lambda: store.release("order-1", old.owner, old.fencing_token),
    ):
        with pytest.raises(LeaseLost):
            call()
    # The right owner with the wrong token is refused too.
    with pytest.raises(LeaseLost):
        store.complete("order-1", new.owner, old.fencing_token, "confused")

    store.complete("order-1", new.owner, new.fencing_token, "B's result")
    record = store.get("order-1")
    assert record is not None
    assert record.status is Status.COMPLETED
    assert record.result == "B's result"
    assert record.fencing_token == new.fencing_token


@pytest.mark.clock
def test_takeover_between_two_workers(backend: Backend) -> None:
    """Two workers, each with its own connection to one store: A stalls past its lease, B
    takes the key over and finishes it, and A is fenced out before B finishes and after."""
    worker_a, worker_b = backend.open(), backend.open()
    try:
        # B connected first: its first call (a cluster's discovery) must not eat A's lease.
        assert worker_b.get("payment-1") is None
        a = acquire(worker_a, "payment-1", fingerprint({"amount": 5}))
        assert isinstance(worker_b.claim("payment-1", fingerprint({"amount": 5})), Busy)
        expire_lease(worker_a, "payment-1")  # A stalls past its lease
        b = acquire(worker_b, "payment-1", fingerprint({"amount": 5}))
        assert b.takeover is True and b.fencing_token == a.fencing_token + 1 and b.attempt == 2

        def fenced_out() -> None:
            for call in (
                lambda: worker_a.complete("payment-1", a.owner, a.fencing_token, {"by": "A"}),
                lambda: worker_a.extend("payment-1", a.owner, a.fencing_token, LONG),
                lambda: worker_a.release("payment-1", a.owner, a.fencing_token),
                lambda: worker_a.fail("payment-1", a.owner, a.fencing_token, "A gives up"),
            ):
                with pytest.raises(LeaseLost) as lost:
                    call()
                assert lost.value.record is not None
                assert lost.value.record.fencing_token == b.fencing_token

        fenced_out()  # while B holds the key
        worker_b.complete("payment-1", b.owner, b.fencing_token, {"by": "B"})
        fenced_out()  # and once B has finished it
        replay = worker_a.claim("payment-1", fingerprint({"amount": 5}))
        assert isinstance(replay, Completed)
        assert replay.record.result == {"by": "B"}
        assert replay.record.fencing_token == b.fencing_token and replay.record.attempts == 2
        assert replay.record.status is Status.COMPLETED
    finally:
        worker_a.close()
        worker_b.close()


@pytest.mark.clock
def test_owner_may_finish_an_expired_lease_nobody_took(store: Store) -> None:
    a = acquire(store, "order-1")
    expire_lease(store, "order-1")
    store.complete("order-1", a.owner, a.fencing_token, "late but alone")
    record = store.get("order-1")
    assert record is not None and record.result == "late but alone"


@pytest.mark.clock
def test_extend_keeps_the_lease_live(store: Store) -> None:
    a = acquire(store, "order-1", lease=60)
    expires = store.extend("order-1", a.owner, a.fencing_token, LONG)
    # Claimed ten minutes ago: the first lease is over, the extended one is not.
    record = backdate(store, "order-1", AGO)
    assert isinstance(store.claim("order-1"), Busy)
    assert record.lease_expires_at is not None
    assert abs((record.lease_expires_at - expires).total_seconds() + AGO) < 0.01


def test_release_keeps_fencing_and_attempts(store: Store) -> None:
    first = acquire(store, "order-1")
    store.release("order-1", first.owner, first.fencing_token)
    record = store.get("order-1")
    assert record is not None and record.owner is None and record.attempts == 1
    second = acquire(store, "order-1")
    assert second.fencing_token == first.fencing_token + 1
    assert second.attempt == 2
    store.release("order-1", second.owner, second.fencing_token)
    third = acquire(store, "order-1")
    assert third.fencing_token == first.fencing_token + 2
    assert third.attempt == 3
    # The released owners are fenced out for good.
    with pytest.raises(LeaseLost):
        store.complete("order-1", first.owner, first.fencing_token, "zombie")


def test_release_of_an_unrun_claim_takes_its_attempt_back(store: Store) -> None:
    """A claim given back before its handler ran (a message behind a stopped one) is not an
    attempt: retries count handler runs. The fencing counter still moves on."""
    first = acquire(store, "order-1")
    record = store.release("order-1", first.owner, first.fencing_token, handler_ran=False)
    assert (record.owner, record.attempts, record.fencing_token) == (None, 0, first.fencing_token)
    stored = store.get("order-1")
    assert stored is not None and stored.attempts == 0 and stored.status is Status.IN_PROGRESS
    second = acquire(store, "order-1")
    assert (second.attempt, second.fencing_token) == (1, first.fencing_token + 1)
    store.fail("order-1", second.owner, second.fencing_token, "boom", retriable=True)
    third = acquire(store, "order-1")
    store.release("order-1", third.owner, third.fencing_token, handler_ran=False)
    fourth = acquire(store, "order-1")
    assert [a.attempt for a in (second, third, fourth)] == [1, 2, 2]
    assert fourth.fencing_token == first.fencing_token + 3
    with pytest.raises(LeaseLost):  # the released owner is fenced out, as by any release
        store.complete("order-1", third.owner, third.fencing_token, "zombie")
    with pytest.raises(LeaseLost):  # and a release is the holder's alone
        store.release("order-1", third.owner, third.fencing_token, handler_ran=False)
    assert store.complete("order-1", fourth.owner, fourth.fencing_token, "ok").attempts == 2


def test_retriable_failure_is_claimed_again(store: Store) -> None:
    a = acquire(store, "order-1")
    store.fail("order-1", a.owner, a.fencing_token, "gateway timeout", retriable=True)
    record = store.get("order-1")
    assert record is not None
    assert record.status is Status.FAILED and record.retriable is True
    assert record.error == "gateway timeout"
    again = acquire(store, "order-1")
    assert again.attempt == 2
    assert again.fencing_token == a.fencing_token + 1
    assert again.takeover is False


def test_permanent_failure_is_never_run_again(store: Store) -> None:
    a = acquire(store, "order-1")
    store.fail("order-1", a.owner, a.fencing_token, "card declined", retriable=False)
    outcome = store.claim("order-1")
    assert isinstance(outcome, Failed)
    assert outcome.record.error == "card declined"
    assert outcome.record.retriable is False


@pytest.mark.clock
def test_attempts_survive_release_takeover_and_retry(store: Store) -> None:
    a1 = acquire(store, "k")
    expire_lease(store, "k")
    a2 = acquire(store, "k")  # takeover
    store.release("k", a2.owner, a2.fencing_token)
    a3 = acquire(store, "k")  # after release
    store.fail("k", a3.owner, a3.fencing_token, "boom", retriable=True)
    a4 = acquire(store, "k")  # after a retriable failure
    assert [a.attempt for a in (a1, a2, a3, a4)] == [1, 2, 3, 4]
    assert [a.fencing_token - a1.fencing_token for a in (a1, a2, a3, a4)] == [0, 1, 2, 3]


@pytest.mark.clock
def test_retention_expiry_makes_a_key_new_again(store: Store) -> None:
    a = acquire(store, "order-1", fingerprint({"v": 1}))
    store.complete("order-1", a.owner, a.fencing_token, "first life", retention=LONG)
    assert isinstance(store.claim("order-1", fingerprint({"v": 1})), Completed)
    expire_retention(store, "order-1")
    assert store.get("order-1") is None
    # Past retention even another payload is welcome: the key is as if never seen.
    again = acquire(store, "order-1", fingerprint({"v": 2}))
    assert again.attempt == 1
    assert again.takeover is False
    assert again.fencing_token > a.fencing_token  # the counter never goes back
    with pytest.raises(LeaseLost):
        store.complete("order-1", a.owner, a.fencing_token, "zombie of the first life")


def test_keys_are_validated(store: Store) -> None:
    with pytest.raises(InvalidKey):
        store.claim("")
    with pytest.raises(InvalidKey):
        store.claim("x" * 513)
    longest = "é" * 256  # 512 bytes of UTF-8
    assert isinstance(store.claim(longest), Acquired)
    record = store.get(longest)
    assert record is not None and record.key == longest


def test_claim_many_has_the_single_forms_semantics(store: Store) -> None:
    done = acquire(store, "done", fingerprint("p"))
    store.complete("done", done.owner, done.fencing_token, {"n": 1})
    acquire(store, "busy")
    outcomes = store.claim_many(
        [
            ClaimRequest("new", fingerprint("p")),
            ClaimRequest("done", fingerprint("p")),
            ClaimRequest("busy"),
            ClaimRequest("done", fingerprint("other")),
            ClaimRequest("new", fingerprint("p")),  # the same key twice in one batch
        ],
        lease=LONG,
    )
    assert isinstance(outcomes[0], Acquired)
    assert isinstance(outcomes[1], Completed) and outcomes[1].record.result == {"n": 1}
    assert isinstance(outcomes[2], Busy)
    assert isinstance(outcomes[3], Mismatch)
    assert isinstance(outcomes[4], Busy)


def test_complete_many_refuses_lost_leases(store: Store) -> None:
    a = acquire(store, "a")
    b = acquire(store, "b")
    c = acquire(store, "c")
    store.release("c", c.owner, c.fencing_token)
    done = store.complete_many(
        [
            Completion("a", a.owner, a.fencing_token, {"r": "a"}),
            Completion("b", b.owner, b.fencing_token + 7, {"r": "b"}),
            Completion("c", c.owner, c.fencing_token, {"r": "c"}),
            Completion("missing", "nobody", 1, None),
        ]
    )
    assert done == [True, False, False, False]
    a_rec, b_rec = store.get("a"), store.get("b")
    assert a_rec is not None and a_rec.status is Status.COMPLETED and a_rec.result == {"r": "a"}
    assert b_rec is not None and b_rec.status is Status.IN_PROGRESS


# Admin operations ----------------------------------------------------------------------------


def _fill(store: Store) -> None:
    """tenant-a/1..3 completed, tenant-a/4 failed, tenant-b/1 live, tenant-b/2 stale."""
    for i in range(1, 4):
        a = acquire(store, f"tenant-a/{i}")
        store.complete(f"tenant-a/{i}", a.owner, a.fencing_token, i)
    a = acquire(store, "tenant-a/4")
    store.fail("tenant-a/4", a.owner, a.fencing_token, "nope", retriable=False)
    acquire(store, "tenant-b/1")
    acquire(store, "tenant-b/2")
    expire_lease(store, "tenant-b/2")


def _scan_all(store: Store, **filters: object) -> list[str]:
    keys: list[str] = []
    cursor = None
    for _ in range(100):
        page = store.scan(limit=2, cursor=cursor, **filters)  # type: ignore[arg-type]
        assert len(page.records) <= 2
        keys += [r.key for r in page.records]
        cursor = page.cursor
        if cursor is None:
            return sorted(keys)
    raise AssertionError("scan never ended")


@pytest.mark.clock
def test_scan_filters_and_pages(store: Store) -> None:
    _fill(store)
    assert _scan_all(store) == [
        "tenant-a/1",
        "tenant-a/2",
        "tenant-a/3",
        "tenant-a/4",
        "tenant-b/1",
        "tenant-b/2",
    ]
    assert _scan_all(store, status=Status.COMPLETED) == ["tenant-a/1", "tenant-a/2", "tenant-a/3"]
    assert _scan_all(store, status=Status.FAILED) == ["tenant-a/4"]
    assert _scan_all(store, prefix="tenant-b/") == ["tenant-b/1", "tenant-b/2"]
    assert _scan_all(store, stale_only=True) == ["tenant-b/2"]
    assert _scan_all(store, prefix="tenant-a/", status=Status.IN_PROGRESS) == []


@pytest.mark.clock
def test_stats(store: Store) -> None:
    _fill(store)
    stats = counts(store)
    assert stats.total == 6
    assert stats.by_status == {Status.COMPLETED: 3, Status.FAILED: 1, Status.IN_PROGRESS: 2}
    assert stats.stale == 1
    b1 = store.get("tenant-b/1")
    assert b1 is not None and stats.oldest_in_progress is not None
    assert stats.oldest_in_progress <= b1.created_at


@pytest.mark.clock
def test_stale_and_released_keys_are_told_apart(store: Store) -> None:
    """Stale: in progress, its owner's lease expired and nobody freed it (unlock_stale frees
    it). Released: in progress with no owner, freed by release or an unlock, waiting for the
    next delivery. Record, scan, stats and unlock_stale agree on which is which."""
    _fill(store)  # tenant-b/1 live, tenant-b/2 stale
    gone = acquire(store, "tenant-c/1")
    store.release("tenant-c/1", gone.owner, gone.fencing_token)
    stats = counts(store)
    assert (stats.stale, stats.released) == (1, 1)
    assert _scan_all(store, stale_only=True) == ["tenant-b/2"]
    assert _scan_all(store, released_only=True) == ["tenant-c/1"]
    assert _scan_all(store, released_only=True, prefix="tenant-b/") == []
    assert _scan_all(store, released_only=True, status=Status.COMPLETED) == []
    assert _scan_all(store, released_only=True, stale_only=True) == []

    assert store.unlock_stale() == ["tenant-b/2"]
    stats = counts(store)  # freed: released now, not stale any more
    assert (stats.stale, stats.released) == (0, 2)
    assert stats.by_status[Status.IN_PROGRESS] == 3
    assert _scan_all(store, stale_only=True) == []
    assert _scan_all(store, released_only=True) == ["tenant-b/2", "tenant-c/1"]
    assert store.unlock_stale(dry_run=True) == []
    now = datetime.now(UTC)
    for record in store.scan(status=Status.IN_PROGRESS).records:
        assert record.stale(now) is False
        assert record.released() is (record.key != "tenant-b/1")

    store.unlock("tenant-b/1", force=True)  # a forced unlock releases a live lease too
    acquire(store, "tenant-b/2")  # claimed again: neither stale nor released
    stats = counts(store)
    assert (stats.stale, stats.released) == (0, 2)
    assert _scan_all(store, released_only=True) == ["tenant-b/1", "tenant-c/1"]
    assert _scan_all(store, stale_only=True) == []


@pytest.mark.clock
def test_unlock(store: Store) -> None:
    _fill(store)
    with pytest.raises(KeyNotFound):
        store.unlock("nope")
    with pytest.raises(Refused):
        store.unlock("tenant-a/1")  # completed: nothing to unlock
    live = store.get("tenant-b/1")
    assert live is not None
    with pytest.raises(Refused):
        store.unlock("tenant-b/1")
    freed = store.unlock("tenant-b/1", force=True)
    assert freed.owner is None and freed.fencing_token == live.fencing_token
    with pytest.raises(LeaseLost):
        store.complete("tenant-b/1", live.owner or "", live.fencing_token, "zombie")
    stale = store.unlock("tenant-b/2")  # an expired lease needs no force
    assert stale.owner is None
    again = acquire(store, "tenant-b/1")
    assert again.fencing_token == live.fencing_token + 1


@pytest.mark.clock
def test_scan_older_than_and_exact_pages(store: Store) -> None:
    acquire(store, "early")
    backdate(store, "early", AGO)  # claimed ten minutes ago
    acquire(store, "late")
    assert _scan_all(store, older_than=AGO / 2) == ["early"]
    assert _scan_all(store, older_than=AGO * 2) == []
    keys = [f"many/{i:03d}" for i in range(120)]
    store.claim_many([ClaimRequest(k) for k in keys])
    seen: list[str] = []
    cursor = None
    while True:
        page = store.scan(prefix="many/", limit=7, cursor=cursor)
        assert len(page.records) <= 7
        seen += [r.key for r in page.records]
        cursor = page.cursor
        if cursor is None:
            break
    assert sorted(seen) == keys  # every key once: none lost between pages, none twice


@pytest.mark.clock
def test_unlock_stale(store: Store) -> None:
    _fill(store)
    held = store.get("tenant-b/2")
    assert held is not None
    assert store.unlock_stale(older_than=LONG) == []  # expired a minute ago
    assert store.unlock_stale(dry_run=True) == ["tenant-b/2"]
    assert store.unlock_stale(dry_run=True) == ["tenant-b/2"]  # the dry run freed nothing
    handled: list[int] = []
    assert store.unlock_stale(progress=handled.append) == ["tenant-b/2"]
    assert sum(handled) == 1
    assert store.unlock_stale() == []  # already freed
    record = store.get("tenant-b/2")
    assert record is not None and record.owner is None
    assert record.fencing_token == held.fencing_token
    live = store.get("tenant-b/1")
    assert live is not None and live.owner is not None  # a live lease is left alone
    assert acquire(store, "tenant-b/2").fencing_token == held.fencing_token + 1


def test_unlock_stale_and_purge_work_in_batches(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    import idemctl.stores.dynamodb
    import idemctl.stores.postgres
    import idemctl.stores.redis
    import idemctl.stores.rows

    # Batches of 10 (Redis: SCAN COUNT 10), so 30 keys take several on every store.
    for module, name in (
        (idemctl.stores.rows, "BATCH"), (idemctl.stores.postgres, "BATCH"),
        (idemctl.stores.dynamodb, "ITEMS_PER_BATCH"), (idemctl.stores.redis, "SCAN_COUNT"),
    ):  # fmt: skip
        monkeypatch.setattr(module, name, 10)
    keys = [f"bulk/{i:04d}" for i in range(30)]
    outcomes = store.claim_many([ClaimRequest(k) for k in keys], lease=LONG)
    assert all(isinstance(o, Acquired) for o in outcomes)
    for k in keys:
        expire_lease(store, k)
    handled: list[int] = []
    assert store.unlock_stale(progress=handled.append) == keys
    assert len(handled) > 1 and sum(handled) == len(keys)
    assert store.unlock_stale(dry_run=True) == []

    again = store.claim_many([ClaimRequest(k) for k in keys])
    done = store.complete_many(
        [Completion(k, a.owner, a.fencing_token) for k, a in zip(keys, again, strict=True)
         if isinstance(a, Acquired)],
        retention=LONG,
    )  # fmt: skip
    assert done == [True] * len(keys)
    for k in keys:
        expire_retention(store, k)
    handled.clear()
    purged = store.purge(progress=handled.append)
    assert purged in (0, len(keys))  # stores that expire by TTL have nothing left to purge
    assert sum(handled) == purged and (purged == 0 or len(handled) > 1)


@pytest.mark.clock
def test_forget(store: Store) -> None:
    _fill(store)
    with pytest.raises(KeyNotFound):
        store.forget("nope")
    with pytest.raises(Refused):
        store.forget("tenant-b/1")
    forgotten = store.forget("tenant-a/1")
    assert forgotten.status is Status.COMPLETED
    assert store.get("tenant-a/1") is None
    assert acquire(store, "tenant-a/1").attempt == 1
    store.forget("tenant-a/4")
    assert isinstance(store.claim("tenant-a/4"), Acquired)
    store.forget("tenant-b/1", force=True)
    assert store.get("tenant-b/1") is None


def test_purge_removes_only_records_past_retention(store: Store) -> None:
    for key in ("old-1", "old-2", "kept"):
        a = acquire(store, key)
        store.complete(key, a.owner, a.fencing_token, key, retention=LONG)
    expire_retention(store, "old-1")
    expire_retention(store, "old-2")
    acquire(store, "running")
    assert store.purge(older_than=LONG) == 0  # retention ended a minute ago, not an hour
    would = store.purge(dry_run=True)
    assert would in (0, 2)  # stores that expire by TTL have nothing left to purge
    assert store.purge(dry_run=True) == would  # the dry run deleted nothing
    handled: list[int] = []
    purged = store.purge(progress=handled.append)
    assert purged == would and sum(handled) == purged
    assert store.get("old-1") is None and store.get("old-2") is None
    assert _scan_all(store) == ["kept", "running"]
    assert counts(store).past_retention == 0


# The fencing counter never goes backwards ----------------------------------------------------
# Downstream fencing keeps the highest token it saw: a token that went back would let a stale
# worker in and keep the new one out. The key's record may go (forget, purge, the store's own
# expiry); its counter may not.


def _moved_on(store: Store, key: str) -> Acquired:
    """``key`` claimed, taken from its holder by two unlocks, claimed again: its holder."""
    first = acquire(store, key)
    store.unlock(key, force=True)
    acquire(store, key)
    store.unlock(key, force=True)
    third = acquire(store, key)
    assert third.fencing_token == first.fencing_token + 2
    return third


def test_forget_keeps_the_fencing_counter(store: Store) -> None:
    held = _moved_on(store, "k1")
    forgotten = store.forget("k1", force=True)
    assert (forgotten.owner, forgotten.fencing_token) == (held.owner, held.fencing_token)
    # As if never seen: gone from get, scan and the live counts, and from the admin commands.
    assert store.get("k1") is None
    assert _scan_all(store) == []
    stats = counts(store)
    assert stats.total == 0 and stats.past_retention == 1
    with pytest.raises(KeyNotFound):
        store.forget("k1", force=True)
    with pytest.raises(KeyNotFound):
        store.unlock("k1", force=True)
    with pytest.raises(LeaseLost):
        store.complete("k1", held.owner, held.fencing_token, "zombie of the forgotten life")
    # ...but its counter goes on where it was, not back to a value the zombie may hold.
    again = acquire(store, "k1")
    assert again.fencing_token == held.fencing_token + 1
    assert (again.attempt, again.takeover) == (1, False)
    with pytest.raises(LeaseLost):
        store.complete("k1", held.owner, held.fencing_token, "zombie of the forgotten life")
    assert store.complete("k1", again.owner, again.fencing_token, "new life").result == "new life"


def test_a_forgotten_key_cannot_be_completed_again_by_its_old_owner(store: Store) -> None:
    a = acquire(store, "k1")
    store.complete("k1", a.owner, a.fencing_token, "first")
    store.forget("k1")
    # A complete sent again (its first answer lost) must not bring the forgotten key back.
    with pytest.raises(LeaseLost):
        store.complete("k1", a.owner, a.fencing_token, "first")
    assert store.get("k1") is None
    assert acquire(store, "k1").fencing_token == a.fencing_token + 1


def test_purge_never_turns_the_fencing_counter_back(store: Store) -> None:
    done = _moved_on(store, "done")
    store.complete("done", done.owner, done.fencing_token, "ok", retention=LONG)
    expire_retention(store, "done")
    forgotten = _moved_on(store, "forgotten")
    store.forget("forgotten", force=True)  # a tombstone whose retention is over at once
    # The forgotten key's tombstone is past retention like any record and goes with purge;
    # "done" went by its TTL on Redis already.
    assert store.purge() in (1, 2)
    assert counts(store).past_retention == 0
    for key, held in (("done", done), ("forgotten", forgotten)):
        again = acquire(store, key)
        assert again.fencing_token > held.fencing_token, key
        assert (again.attempt, again.takeover) == (1, False)
        with pytest.raises(LeaseLost):
            store.complete(key, held.owner, held.fencing_token, "zombie of the purged life")


def test_a_record_gone_by_the_stores_expiry_keeps_the_counter_growing(store: Store) -> None:
    """Redis deletes a record by its TTL (PX) at the end of retention; the other stores keep
    it past retention (DynamoDB's TTL deletes it hours late): either way the key's next
    token is above every earlier one."""
    done = _moved_on(store, "done")
    store.complete("done", done.owner, done.fencing_token, "ok", retention=LONG)
    given_up = _moved_on(store, "failed")
    store.fail("failed", given_up.owner, given_up.fencing_token, "no", False, retention=LONG)
    expire_retention(store, "done")
    expire_retention(store, "failed")
    for key, held in (("done", done), ("failed", given_up)):
        assert store.get(key) is None
        again = acquire(store, key)
        assert again.fencing_token > held.fencing_token, key


def test_provision_twice_changes_nothing(store: Store) -> None:
    store.provision()
    second = store.provision()
    assert second.changed is False
    assert store.provision(dry_run=True).changed is False
    assert all(f.name for f in store.check())


BAD_KEYS = {
    "empty": "",
    "513 bytes": "k" * 513,
    "NUL": "order\x00-1",
    "tab": "order\t1",
    "C1 control": "order\x851",
    "lone surrogate": "order-\udcff",
}


@pytest.mark.parametrize("name", sorted(BAD_KEYS))
def test_one_key_rule_refuses_the_same_keys_on_every_store(store: Store, name: str) -> None:
    key = BAD_KEYS[name]
    with pytest.raises(InvalidKey):
        store.claim(key)
    with pytest.raises(InvalidKey):
        store.claim_many([ClaimRequest(key, None)])
    ran: list[str] = []
    with pytest.raises(InvalidKey):
        run(store, key, lambda ctx: ran.append(ctx.key))
    assert ran == [] and counts(store).total == 0  # nothing claimed


def test_one_key_rule_accepts_512_bytes_of_any_printable_unicode(store: Store) -> None:
    for key in ("é" * 256, "🙂" * 128, "tenant/ä:order 1 (retry)"):
        result = run(store, key, lambda ctx: {"key": ctx.key})
        assert result.outcome is Outcome.EXECUTED and result.result == {"key": key}
        record = store.get(key)
        assert record is not None and record.key == key
        assert run(store, key, lambda ctx: None).outcome is Outcome.REPLAYED
