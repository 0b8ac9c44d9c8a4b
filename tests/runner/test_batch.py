"""runner.Batch: the unit of work for many keys, what consume runs on, in the one Outcome
vocabulary."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from idemctl.errors import ConfigError
from idemctl.model import Acquired, Busy, ClaimRequest, Order, Status
from idemctl.runner import Batch, Context, Outcome, RunResult, Step
from idemctl.stores.memory import MemoryStore
from tests.polling import wait_until
from tests.runner.test_runner import Clock, lease_end


def boom(ctx: Context) -> None:
    raise ValueError("no")


def claim(
    batch: Batch, requests: Sequence[ClaimRequest], orders: Sequence[Order | None] = ()
) -> list[RunResult]:
    """A round's claims, every chunk taken."""
    return [r for ahead in batch.start_round(requests, orders) for r in ahead.take()]


def test_a_round_claims_runs_gives_back_and_completes_each_with_a_run_result() -> None:
    store = MemoryStore()
    done = store.claim("old")
    assert isinstance(done, Acquired)
    store.complete("old", done.owner, done.fencing_token, {"was": "before"})
    with Batch(store, max_attempts=3) as batch:
        claimed = claim(batch, [ClaimRequest(k) for k in ("old", "a", "b", "c")])
        assert [r.outcome for r in claimed] == [Outcome.REPLAYED] + [Step.HELD] * 3
        assert claimed[0].result == {"was": "before"}
        assert all(r.fencing_token is not None and r.attempt == 1 for r in claimed[1:])

        ran = batch.run("a", lambda ctx: {"key": ctx.key})
        assert (ran.outcome, ran.result) == (Step.RAN, {"key": "a"})
        failed = batch.run("b", boom)
        assert failed.outcome is Outcome.ERROR and failed.retriable
        assert isinstance(failed.error, ValueError)
        assert batch.give_back("c").outcome is Step.RELEASED

        completed = batch.end_round()
    assert [(r.outcome, r.key, r.result) for r in completed] == [
        (Outcome.EXECUTED, "a", {"key": "a"})
    ]
    a, b, c = store.get("a"), store.get("b"), store.get("c")
    assert a is not None and a.status is Status.COMPLETED and a.result == {"key": "a"}
    assert b is not None and b.status is Status.FAILED and b.retriable
    # Given back unrun: in progress with no owner, and the claim is not counted as a run.
    assert c is not None and c.status is Status.IN_PROGRESS and c.owner is None
    assert c.attempts == 0


def test_one_heartbeat_keeps_every_held_key_alive_while_a_slow_handler_runs() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)

    def slow(ctx: object) -> None:
        """Three leases long by the store's clock, each step waiting for a heartbeat."""
        for _ in range(3):
            ends = {k: lease_end(store, k) for k in ("slow", "waiting")}
            clock.advance(0.2)
            wait_until(
                lambda ends=ends: all(lease_end(store, k) > e for k, e in ends.items()),
                "a heartbeat extended both leases",
            )
            clock.advance(0.1)

    with Batch(store, lease=0.3) as batch:
        claim(batch, [ClaimRequest("slow"), ClaimRequest("waiting")])
        batch.run("slow", slow)  # three leases long
        other = store.claim("waiting")  # still held by the batch: its lease was extended
        assert isinstance(other, Busy)
        assert batch.run("waiting", lambda ctx: "ok").outcome is Step.RAN
        results = {r.key: r.outcome for r in batch.end_round()}
    assert results == {"slow": Outcome.EXECUTED, "waiting": Outcome.EXECUTED}


def test_a_completion_the_store_refuses_comes_back_as_lease_lost() -> None:
    store = MemoryStore()
    with Batch(store) as batch:
        claim(batch, [ClaimRequest("k")])
        store.unlock("k", force=True)  # an operator frees it meanwhile
        assert batch.run("k", lambda ctx: 1).outcome is Step.RAN
        [result] = batch.end_round()
    assert result.outcome is Outcome.LEASE_LOST


def test_transactional_mode_needs_a_transactional_store() -> None:
    with pytest.raises(ConfigError, match="transactional mode needs a PostgreSQL store"):
        Batch(MemoryStore(), transactional=True)


def test_a_round_with_orders_asks_the_guard_and_settles_what_ran() -> None:
    from idemctl.model import Guard, Order

    store = MemoryStore()
    other = store.claim("other")
    assert isinstance(other, Acquired)
    store.guard_many([Guard("acct:busy", 1, "other", other.fencing_token)])
    with Batch(store) as batch:
        done = claim(batch, [ClaimRequest("first")], [Order("acct:1", 3)])
        assert done[0].outcome is Step.HELD and done[0].last is None
        assert batch.run("first", lambda ctx: ctx.sequence).outcome is Step.RAN
        assert [r.outcome for r in batch.end_round()] == [Outcome.EXECUTED]
        orders = [Order("acct:1", 2), Order("acct:1", 5), Order("acct:busy", 2), None]
        claimed = claim(batch, [ClaimRequest(k) for k in ("late", "next", "held", "plain")], orders)
        assert [r.outcome for r in claimed] == [
            Outcome.STALE, Step.HELD, Outcome.BUSY, Step.HELD
        ]  # fmt: skip
        assert (claimed[0].last, claimed[1].last) == (3, 3)
        assert batch.give_back("next").outcome is Step.RELEASED
        batch.end_round()
    entity = store.get_entity("acct:1")
    assert entity is not None and (entity.sequence, entity.key, entity.holder) == (3, "first", None)
    late, held = store.get("late"), store.get("held")
    assert late is not None and late.status is Status.COMPLETED and late.result is None
    assert held is not None and held.owner is None  # given back for the next delivery


def test_a_guard_the_store_does_not_answer_gives_every_claim_back() -> None:
    from idemctl.errors import StoreUnavailable
    from idemctl.model import Order

    class Down(MemoryStore):
        def _guard_many(self, guards, lease):  # type: ignore[no-untyped-def]
            raise StoreUnavailable("down")

    store = Down()
    with Batch(store) as batch, pytest.raises(StoreUnavailable):
        claim(batch, [ClaimRequest("a"), ClaimRequest("b")], [Order("e", 1), None])
    for key in ("a", "b"):  # nothing decided: claimable again at once
        assert isinstance(store.claim(key), Acquired)


def test_claims_ahead_are_taken_in_order_and_dropped_ones_leave_nothing_held() -> None:
    class Chunked(MemoryStore):
        claim_chunk = 5  # four chunks of five

    store = Chunked()
    with Batch(store) as batch:
        ahead = batch.start_round([ClaimRequest(f"{c}-{i}") for c in "abcd" for i in range(5)])
        assert [r.key for r in ahead[0].take()] == [f"a-{i}" for i in range(5)]
        taken = ahead[1].take()
        assert all(r.outcome is Step.HELD for r in taken)
        assert batch.run("b-0", lambda ctx: ctx.key).outcome is Step.RAN
        for rest in ahead[2:]:  # sent or not yet: either way nothing stays claimed
            rest.drop()
        for key in [f"a-{i}" for i in range(5)] + [f"b-{i}" for i in range(1, 5)]:
            batch.give_back(key)
        assert [(r.outcome, r.key) for r in batch.end_round()] == [(Outcome.EXECUTED, "b-0")]
    for c in "acd":
        for i in range(5):
            assert isinstance(store.claim(f"{c}-{i}"), Acquired), f"{c}-{i}"
    done = store.get("b-0")
    assert done is not None and done.status is Status.COMPLETED


def test_a_chunk_the_store_does_not_answer_raises_when_taken_and_claims_nothing() -> None:
    from idemctl.errors import StoreUnavailable

    class DownOnSecond(MemoryStore):
        calls = 0
        claim_chunk = 3  # three chunks of three

        def _claim_many(self, requests, lease):  # type: ignore[no-untyped-def]
            self.calls += 1
            if self.calls == 2:
                raise StoreUnavailable("down")
            return super()._claim_many(requests, lease)

    store = DownOnSecond()
    with Batch(store) as batch:
        first, second, third = batch.start_round(
            [ClaimRequest(f"{c}-{i}") for c in "abc" for i in range(3)]
        )
        assert len(first.take()) == 3
        with pytest.raises(StoreUnavailable):
            second.take()
        third.drop()
        batch.end_round()
    for i in range(3):
        assert store.get(f"b-{i}") is None  # nothing of the chunk was claimed


def test_no_more_than_a_batch_of_completions_waits_however_late_the_completer_thread() -> None:
    """What a SIGKILL can cost beyond the handlers it cuts off is the completions not sent:
    one batch on its way and one waiting. Handlers that finish while a full batch waits for
    the completer thread (busy machine: it has not run yet) wait with their completions in
    hand, so a kill never finds more than ``batch`` waiting (CI: 9 repeats a kill where the
    bound is 8)."""
    import threading

    from idemctl.model import Completion
    from idemctl.runner.batch import _Completer

    store = MemoryStore()
    held = [store.claim(f"k{i}") for i in range(5)]
    assert all(isinstance(a, Acquired) for a in held)
    with Batch(store) as batch:
        completer = _Completer(batch, 2, 60.0, None, lambda keys: None)
        late = threading.Thread(target=completer._run, daemon=True)
        completer._thread = late  # the completer thread exists, and has not run yet
        completions = [Completion(a.key, a.owner, a.fencing_token, {"n": i})  # type: ignore[union-attr]
                       for i, a in enumerate(held)]  # fmt: skip
        completer.put(completions[0])
        completer.put(completions[1])
        third = threading.Thread(target=completer.put, args=(completions[2],), daemon=True)
        third.start()
        third.join(0.5)
        assert third.is_alive() and len(completer._queue) == 2  # waits, completion in hand
        late.start()
        third.join(30)
        assert not third.is_alive()
        for c in completions[3:]:
            completer.put(c)
        answers = completer.drain()
        completer.stop()
    assert sorted(r.key for r in answers) == [f"k{i}" for i in range(5)]
    assert all(r.outcome is Outcome.EXECUTED for r in answers)
    assert all(store.get(f"k{i}").status is Status.COMPLETED for i in range(5))  # type: ignore[union-attr]
