"""The sequence guard ("apply if newer" per entity): one suite, run on every store.

The rules are ``machine.decide_guard`` and ``machine.decide_settle``; every backend must
answer as they do."""

from __future__ import annotations

import pytest

from idemctl import Acquired, InvalidKey
from idemctl.errors import EntityNotFound, Refused
from idemctl.model import Guard, Settle, Verdict
from idemctl.stores.base import Store
from tests.backends import expire_hold, expire_lease, expire_retention
from tests.contract.api import counts
from tests.contract.test_protocol import LONG, acquire


def guard(store: Store, entity: str, sequence: int, a: Acquired, lease: float = LONG) -> Verdict:
    (reply,) = store.guard_many([Guard(entity, sequence, a.key, a.fencing_token)], lease)
    return reply.verdict


def settle(store: Store, entity: str, sequence: int, a: Acquired, applied: bool = True) -> bool:
    return store.settle_many([Settle(entity, sequence, a.key, a.fencing_token, applied)])[0]


def test_only_a_newer_sequence_goes_through(store: Store) -> None:
    e10, e9, e10b, e11 = (acquire(store, k) for k in ("e10", "e9", "e10b", "e11"))
    (first,) = store.guard_many([Guard("acct:1", 10, "e10", e10.fencing_token)], LONG)
    assert first.verdict is Verdict.GO and first.last is None
    assert settle(store, "acct:1", 10, e10)
    entity = store.get_entity("acct:1")
    assert entity is not None
    assert (entity.sequence, entity.key, entity.holder) == (10, "e10", None)
    assert entity.applied_at is not None
    # Older, and the same sequence again under another key: stale, whoever asks.
    (older,) = store.guard_many([Guard("acct:1", 9, "e9", e9.fencing_token)], LONG)
    assert (older.verdict, older.last) == (Verdict.STALE, 10)
    assert guard(store, "acct:1", 10, e10b) is Verdict.STALE
    (newer,) = store.guard_many([Guard("acct:1", 11, "e11", e11.fencing_token)], LONG)
    assert (newer.verdict, newer.last) == (Verdict.GO, 10)
    assert settle(store, "acct:1", 11, e11)
    after = store.get_entity("acct:1")
    assert after is not None and (after.sequence, after.key) == (11, "e11")
    # Stale is judged per entity: another entity knows nothing of acct:1.
    assert guard(store, "acct:2", 1, e9) is Verdict.GO


def test_one_attempt_holds_an_entity_at_a_time(store: Store) -> None:
    a, b = acquire(store, "a"), acquire(store, "b")
    replies = store.guard_many(
        [Guard("acct:1", 5, "a", a.fencing_token), Guard("acct:1", 6, "b", b.fencing_token)], LONG
    )
    assert [r.verdict for r in replies] == [Verdict.GO, Verdict.BUSY]
    assert replies[1].holder == "a"
    held = store.get_entity("acct:1")
    assert held is not None
    assert (held.sequence, held.holder, held.holder_token) == (None, "a", a.fencing_token)
    assert held.lock_expires_at is not None
    # The holder asking again keeps it (a heartbeat); the other key stays busy.
    assert guard(store, "acct:1", 5, a) is Verdict.GO
    assert guard(store, "acct:1", 6, b) is Verdict.BUSY
    # Letting go without applying: the entity is free and did not advance.
    assert settle(store, "acct:1", 5, a, applied=False)
    free = store.get_entity("acct:1")
    assert free is not None and free.sequence is None and free.holder is None
    assert guard(store, "acct:1", 6, b) is Verdict.GO
    assert settle(store, "acct:1", 6, b)
    # The late 5 is stale now.
    assert guard(store, "acct:1", 5, a) is Verdict.STALE


@pytest.mark.clock
def test_an_expired_hold_is_taken_and_its_old_holder_is_fenced(store: Store) -> None:
    a, b = acquire(store, "a"), acquire(store, "b")
    assert guard(store, "acct:1", 5, a) is Verdict.GO
    assert guard(store, "acct:1", 6, b) is Verdict.BUSY
    expire_hold(store, "acct:1")
    assert guard(store, "acct:1", 6, b) is Verdict.GO
    assert not settle(store, "acct:1", 5, a), "a holder whose hold was taken cannot settle"
    assert not settle(store, "acct:1", 5, a, applied=False)
    assert settle(store, "acct:1", 6, b)
    entity = store.get_entity("acct:1")
    assert entity is not None and (entity.sequence, entity.key) == (6, "b")
    assert not settle(store, "acct:1", 6, b), "settled once: the hold is gone"


@pytest.mark.clock
def test_an_expired_hold_nobody_took_may_still_settle(store: Store) -> None:
    a = acquire(store, "a")
    assert guard(store, "acct:1", 3, a) is Verdict.GO
    expire_hold(store, "acct:1")
    assert settle(store, "acct:1", 3, a)
    entity = store.get_entity("acct:1")
    assert entity is not None and entity.sequence == 3


@pytest.mark.clock
def test_a_takeover_of_the_key_takes_the_entity_and_fences_the_old_attempt(store: Store) -> None:
    old = acquire(store, "k")
    assert guard(store, "acct:1", 7, old) is Verdict.GO
    expire_lease(store, "k")  # the key's lease, not the entity's hold
    new = acquire(store, "k")
    assert new.fencing_token > old.fencing_token
    # Same key, later token: the key's fencing decides, so the live hold passes over.
    assert guard(store, "acct:1", 7, new) is Verdict.GO
    # The old attempt can neither take it back nor settle.
    assert guard(store, "acct:1", 7, old) is Verdict.BUSY
    assert not settle(store, "acct:1", 7, old)
    assert settle(store, "acct:1", 7, new)
    entity = store.get_entity("acct:1")
    assert entity is not None and (entity.sequence, entity.key) == (7, "k")


@pytest.mark.clock
def test_entities_keep_to_their_own_retention(store: Store) -> None:
    a, b = acquire(store, "a"), acquire(store, "b")
    assert guard(store, "acct:1", 9, a) is Verdict.GO
    assert store.settle_many([Settle("acct:1", 9, "a", a.fencing_token)], retention=LONG) == [True]
    assert store.get_entity("acct:1") is not None
    expire_retention(store, "acct:1", entity=True)
    # Past retention the entity is as if never seen, like a key.
    assert store.get_entity("acct:1") is None
    assert guard(store, "acct:1", 2, b) is Verdict.GO


def test_entities_are_not_keys(store: Store) -> None:
    a = acquire(store, "a")
    assert guard(store, "a", 1, a) is Verdict.GO  # an entity may share a key's name
    assert settle(store, "a", 1, a)
    assert [r.key for r in store.scan().records] == ["a"]
    assert counts(store).total == 1
    record = store.get("a")
    assert record is not None and record.status.value == "in_progress"
    assert store.count_entities() == 1


def test_scan_count_and_forget_entities(store: Store) -> None:
    names = [f"acct:{i:02d}" for i in range(7)] + ["user:1", "user:2"]
    for i, name in enumerate(names):
        a = acquire(store, f"k{i}")
        assert guard(store, name, i + 1, a) is Verdict.GO
        if name != "user:2":
            assert settle(store, name, i + 1, a)
    assert store.count_entities() == len(names)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = store.scan_entities(prefix="acct:", limit=3, cursor=cursor)
        assert len(page.entities) <= 3
        seen += [e.entity for e in page.entities]
        pages += 1
        cursor = page.cursor
        if cursor is None:
            break
        assert pages < 20
    assert sorted(seen) == names[:7]
    assert len(set(seen)) == len(seen)
    # A held entity is refused without force; a forgotten one lets any sequence apply.
    with pytest.raises(Refused, match="user:2"):
        store.forget_entity("user:2")
    gone = store.forget_entity("acct:03")
    assert gone.entity == "acct:03" and gone.sequence == 4
    assert store.get_entity("acct:03") is None
    assert guard(store, "acct:03", 1, acquire(store, "late")) is Verdict.GO
    forced = store.forget_entity("user:2", force=True)
    assert forced.holder == "k8"
    held = store.get("k8")
    assert held is not None
    assert not store.settle_many([Settle("user:2", 9, "k8", held.fencing_token)])[0]
    with pytest.raises(EntityNotFound):
        store.forget_entity("no-such")
    assert store.count_entities() == len(names) - 1  # acct:03 came back, user:2 is gone


@pytest.mark.parametrize("bad", ["", "a\x00b", "x" * 513])
def test_entity_names_follow_the_key_rule(store: Store, bad: str) -> None:
    a = acquire(store, "a")
    with pytest.raises(InvalidKey, match="entity"):
        store.guard_many([Guard(bad, 1, "a", a.fencing_token)])


def test_sequences_must_be_whole_numbers_in_range(store: Store) -> None:
    a = acquire(store, "a")
    for bad in (-1, 2**53, 1.5):
        with pytest.raises(ValueError, match="sequence"):
            store.guard_many([Guard("acct:1", bad, "a", a.fencing_token)])  # type: ignore[arg-type]
    # The largest one every store compares exactly.
    assert guard(store, "acct:1", 2**53 - 1, a) is Verdict.GO
    assert settle(store, "acct:1", 2**53 - 1, a)
    assert guard(store, "acct:1", 2**53 - 2, acquire(store, "b")) is Verdict.STALE


@pytest.mark.clock
def test_finish_advances_entities_and_completes_their_keys(store: Store) -> None:
    from idemctl.model import Completion, Status

    a, b, c = (acquire(store, k) for k in ("a", "b", "c"))
    assert guard(store, "acct:1", 4, a) is Verdict.GO
    assert guard(store, "acct:2", 9, c) is Verdict.GO
    expire_hold(store, "acct:2")
    other = acquire(store, "other")
    assert guard(store, "acct:2", 10, other) is Verdict.GO  # c's hold ended and was taken
    done = store.finish_many(
        [Completion("a", a.owner, a.fencing_token, {"n": 1}),
         Completion("b", b.owner, b.fencing_token, None),
         Completion("c", c.owner, c.fencing_token, None)],
        [Settle("acct:1", 4, "a", a.fencing_token), Settle("acct:2", 9, "c", c.fencing_token)],
    )  # fmt: skip
    assert done == [True, True, False]
    entity = store.get_entity("acct:1")
    assert entity is not None and (entity.sequence, entity.key, entity.holder) == (4, "a", None)
    record = store.get("a")
    assert record is not None and record.status is Status.COMPLETED and record.result == {"n": 1}
    finished_b = store.get("b")
    assert finished_b is not None and finished_b.status is Status.COMPLETED
    # c lost its hold on the entity: its key is not completed, the entity stays as taken.
    left = store.get("c")
    assert left is not None and left.status is Status.IN_PROGRESS
    taken = store.get_entity("acct:2")
    assert taken is not None and (taken.sequence, taken.holder) == (None, "other")
