"""run() and @idempotent over the memory store: once to completion, replays, failures,
leases, heartbeats and interrupts."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from idemctl import (
    Context,
    FingerprintMismatch,
    InvalidPayload,
    KeyBusy,
    LeaseLost,
    Outcome,
    Permanent,
    PreviouslyFailed,
    current_context,
    idempotent,
    run,
)
from idemctl.model import Acquired, Busy, Status
from idemctl.stores.memory import MemoryStore
from tests.polling import wait_until

START = datetime(2026, 1, 1, tzinfo=UTC)
FIRST_TOKEN = 1_767_225_600_000_000
"""A new key's first fencing token on a store whose clock reads START: its µs since the epoch."""


class Clock:
    """A hand-driven clock for the store: time moves only when a test says so."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class Handler:
    """Counts its calls; returns ``result`` or raises ``error``."""

    def __init__(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.calls = 0
        self.contexts: list[Context] = []

    def __call__(self, ctx: Context) -> Any:
        self.calls += 1
        self.contexts.append(ctx)
        if self.error is not None:
            raise self.error
        return self.result


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> MemoryStore:
    return MemoryStore(clock=clock)


# run(): executed, replayed -----------------------------------------------------------------


def test_first_run_executes_and_the_second_replays_without_running(store: MemoryStore) -> None:
    handler = Handler(result={"charged": 100})
    first = run(store, "order:1", handler)
    second = run(store, "order:1", handler)

    assert first.outcome is Outcome.EXECUTED
    assert first.result == {"charged": 100}
    assert first.attempt == 1
    assert first.fencing_token == FIRST_TOKEN
    assert second.outcome is Outcome.REPLAYED
    assert second.result == {"charged": 100}
    assert handler.calls == 1
    record = store.get("order:1")
    assert record is not None
    assert record.status is Status.COMPLETED
    assert record.result == {"charged": 100}


def test_busy_key_is_reported_and_not_run(store: MemoryStore) -> None:
    store.claim("order:1")
    handler = Handler(result=1)
    result = run(store, "order:1", handler)
    assert result.outcome is Outcome.BUSY
    assert result.record is not None
    assert result.record.status is Status.IN_PROGRESS
    assert handler.calls == 0


def test_other_payload_for_a_completed_key_is_a_mismatch_and_not_run(store: MemoryStore) -> None:
    handler = Handler(result=1)
    run(store, "order:1", handler, fingerprint="a" * 64)
    result = run(store, "order:1", handler, fingerprint="b" * 64)
    assert result.outcome is Outcome.MISMATCH
    assert handler.calls == 1


def test_expired_lease_of_a_crashed_worker_is_taken_over(store: MemoryStore, clock: Clock) -> None:
    crashed = store.claim("order:1", lease=10)
    assert isinstance(crashed, Acquired)
    clock.advance(11)
    handler = Handler(result="done")
    result = run(store, "order:1", handler)
    assert result.outcome is Outcome.EXECUTED
    assert result.attempt == 2
    assert result.fencing_token == crashed.fencing_token + 1
    assert handler.contexts[0].takeover is True


def test_key_runs_again_after_its_retention(store: MemoryStore, clock: Clock) -> None:
    handler = Handler(result="done")
    run(store, "order:1", handler, retention=60)
    clock.advance(59)
    assert run(store, "order:1", handler).outcome is Outcome.REPLAYED
    clock.advance(2)
    assert run(store, "order:1", handler).outcome is Outcome.EXECUTED
    assert handler.calls == 2


# run(): failures ---------------------------------------------------------------------------


def test_handler_error_is_retriable_and_the_next_run_executes_again(store: MemoryStore) -> None:
    failing = Handler(error=ValueError("card declined"))
    result = run(store, "order:1", failing)

    assert result.outcome is Outcome.ERROR
    assert result.retriable is True
    assert isinstance(result.error, ValueError)
    assert result.record is not None
    assert result.record.status is Status.FAILED
    assert result.record.retriable is True
    assert result.record.error == "ValueError: card declined"

    working = Handler(result="charged")
    again = run(store, "order:1", working)
    assert again.outcome is Outcome.EXECUTED
    assert again.attempt == 2
    assert working.contexts[0].attempt == 2
    assert working.calls == 1


def test_permanent_error_is_not_retried(store: MemoryStore) -> None:
    failing = Handler(error=Permanent("unknown customer"))
    result = run(store, "order:1", failing)
    assert result.outcome is Outcome.ERROR
    assert result.retriable is False
    assert isinstance(result.error, Permanent)

    handler = Handler(result="charged")
    again = run(store, "order:1", handler)
    assert again.outcome is Outcome.FAILED
    assert handler.calls == 0
    assert again.record is not None
    assert "unknown customer" in (again.record.error or "")


def test_permanent_can_wrap_another_exception(store: MemoryStore) -> None:
    def handler(ctx: Context) -> None:
        try:
            raise KeyError("customer")
        except KeyError as exc:
            raise Permanent("no such customer") from exc

    assert run(store, "order:1", handler).retriable is False
    assert run(store, "order:1", Handler(result=1)).outcome is Outcome.FAILED


def test_custom_permanent_exception_types(store: MemoryStore) -> None:
    result = run(store, "order:1", Handler(error=KeyError("sku")), permanent=(KeyError,))
    assert result.outcome is Outcome.ERROR
    assert result.retriable is False
    assert run(store, "order:1", Handler(result=1)).outcome is Outcome.FAILED

    other = run(store, "order:2", Handler(error=ValueError("x")), permanent=(KeyError,))
    assert other.retriable is True


def test_permanent_stays_permanent_with_a_custom_tuple(store: MemoryStore) -> None:
    result = run(store, "order:1", Handler(error=Permanent("no")), permanent=(KeyError,))
    assert result.retriable is False


def test_result_that_is_not_json_fails_the_key_for_good(store: MemoryStore) -> None:
    handler = Handler(result=object())
    result = run(store, "order:1", handler)

    assert result.outcome is Outcome.ERROR
    assert isinstance(result.error, InvalidPayload)
    assert "order:1" in str(result.error)
    assert result.retriable is False
    assert result.record is not None
    assert result.record.status is Status.FAILED
    assert result.record.retriable is False

    again = run(store, "order:1", handler)
    assert again.outcome is Outcome.FAILED
    assert handler.calls == 1


def test_result_that_cannot_be_encoded_fails_the_key_for_good(store: MemoryStore) -> None:
    handler = Handler(result={"name": "bad \ud800"})
    result = run(store, "order:1", handler, heartbeat=False)
    assert result.outcome is Outcome.ERROR
    assert isinstance(result.error, InvalidPayload)


def test_changing_a_returned_result_does_not_change_the_stored_one(store: MemoryStore) -> None:
    first = run(store, "order:1", Handler(result={"items": [1]}))
    first.result["items"].append(2)
    assert run(store, "order:1", Handler()).result == {"items": [1]}


# Context -----------------------------------------------------------------------------------


def test_current_context_inside_the_handler(store: MemoryStore) -> None:
    seen: list[Context] = []

    def handler(ctx: Context) -> str:
        seen.append(current_context())
        return "ok"

    result = run(store, "order:1", handler)
    ctx = seen[0]
    assert ctx.key == "order:1"
    assert ctx.fencing_token == result.fencing_token == FIRST_TOKEN
    assert ctx.attempt == 1
    assert ctx.takeover is False
    assert ctx.store is store


def test_current_context_outside_a_handler_raises() -> None:
    with pytest.raises(RuntimeError, match="only available inside"):
        current_context()


def test_current_context_does_not_leak_out_of_run(store: MemoryStore) -> None:
    run(store, "order:1", lambda ctx: current_context().key)
    with pytest.raises(RuntimeError):
        current_context()


# Leases, heartbeats, interrupts ------------------------------------------------------------


def lease_end(store: MemoryStore, key: str) -> datetime:
    record = store.get(key)
    assert record is not None and record.lease_expires_at is not None
    return record.lease_expires_at


def test_heartbeat_keeps_a_long_handler_s_lease(store: MemoryStore, clock: Clock) -> None:
    seen: list[object] = []

    def slow(ctx: Context) -> str:
        # By the store's clock: the lease nearly over, a heartbeat, then past the lease
        # as claimed, where another worker finds the key still held.
        first = lease_end(store, "order:1")
        clock.advance(0.2)
        wait_until(lambda: lease_end(store, "order:1") > first, "a heartbeat extended the lease")
        clock.advance(0.2)
        seen.append(store.claim("order:1"))
        return "done"

    result = run(store, "order:1", slow, lease=0.3)
    assert isinstance(seen[0], Busy)
    assert result.outcome is Outcome.EXECUTED
    record = store.get("order:1")
    assert record is not None
    assert record.status is Status.COMPLETED
    assert record.fencing_token == result.fencing_token and record.attempts == 1


def test_result_after_a_lost_lease_is_discarded(store: MemoryStore, clock: Clock) -> None:
    takeovers: list[object] = []
    tokens: list[int] = []

    def slow(ctx: Context) -> str:
        tokens.append(ctx.fencing_token)
        clock.advance(0.5)  # past the 0.2 s lease, with no heartbeat: the store's clock
        takeovers.append(store.claim("order:1"))
        return "first"

    result = run(store, "order:1", slow, lease=0.2, heartbeat=False)

    assert result.outcome is Outcome.LEASE_LOST
    assert isinstance(result.error, LeaseLost)
    assert "discarded" in str(result.error)
    second = takeovers[0]
    assert isinstance(second, Acquired)
    assert second.takeover is True
    assert second.fencing_token == tokens[0] + 1
    record = store.get("order:1")
    assert record is not None
    assert record.status is Status.IN_PROGRESS
    assert record.owner == second.owner
    assert record.result is None
    # The attempt that took over finishes normally.
    done = store.complete("order:1", second.owner, second.fencing_token, "second")
    assert done.result == "second"


def test_error_after_a_lost_lease_is_reported_as_lease_lost(
    store: MemoryStore, clock: Clock
) -> None:
    def slow(ctx: Context) -> None:
        clock.advance(31)
        taken = store.claim("order:1", lease=30)
        assert isinstance(taken, Acquired)
        raise ValueError("too late anyway")

    result = run(store, "order:1", slow, lease=30, heartbeat=False)
    assert result.outcome is Outcome.LEASE_LOST
    assert isinstance(result.error, LeaseLost)
    record = store.get("order:1")
    assert record is not None
    assert record.status is Status.IN_PROGRESS  # the new owner's attempt is untouched
    assert record.error is None


def test_keyboard_interrupt_propagates_and_frees_the_key(store: MemoryStore) -> None:
    with pytest.raises(KeyboardInterrupt):
        run(store, "order:1", Handler(error=KeyboardInterrupt()))

    next_claim = store.claim("order:1")
    assert isinstance(next_claim, Acquired)
    assert next_claim.takeover is True
    assert next_claim.fencing_token == FIRST_TOKEN + 1
    assert next_claim.attempt == 2


# @idempotent ---------------------------------------------------------------------------------


def test_decorator_runs_once_per_key(store: MemoryStore) -> None:
    calls: list[str] = []

    @idempotent(store, key="charge:{order_id}")
    def charge(order_id: str, amount_cents: int) -> dict[str, Any]:
        calls.append(order_id)
        return {"order": order_id, "charged": amount_cents}

    assert charge("o1", 100) == {"order": "o1", "charged": 100}
    assert charge("o1", 100) == {"order": "o1", "charged": 100}
    assert charge(order_id="o1", amount_cents=100) == {"order": "o1", "charged": 100}
    assert charge("o2", 100) == {"order": "o2", "charged": 100}
    assert calls == ["o1", "o2"]
    record = store.get("charge:o1")
    assert record is not None
    assert record.status is Status.COMPLETED


def test_decorator_key_template_sees_default_arguments(store: MemoryStore) -> None:
    @idempotent(store, key="{region}:{order_id}")
    def ship(order_id: str, region: str = "eu") -> str:
        return f"{region}/{order_id}"

    assert ship("o1") == "eu/o1"
    assert store.get("eu:o1") is not None


def test_decorator_key_as_a_function(store: MemoryStore) -> None:
    @idempotent(store, key=lambda order, **_: f"order:{order['id']}")
    def handle(order: dict[str, Any]) -> int:
        return int(order["amount"])

    assert handle({"id": 7, "amount": 3}) == 3
    assert store.get("order:7") is not None


def test_decorator_same_key_other_arguments_is_a_mismatch(store: MemoryStore) -> None:
    calls: list[int] = []

    @idempotent(store, key="charge:{order_id}")
    def charge(order_id: str, amount_cents: int) -> int:
        calls.append(amount_cents)
        return amount_cents

    charge("o1", 100)
    with pytest.raises(FingerprintMismatch) as info:
        charge("o1", 999)
    assert "charge:o1" in str(info.value)
    assert info.value.record is not None
    assert calls == [100]


def test_decorator_without_fingerprint_replays_whatever_the_arguments(store: MemoryStore) -> None:
    calls: list[int] = []

    @idempotent(store, key="charge:{order_id}", fingerprint=False)
    def charge(order_id: str, amount_cents: int) -> int:
        calls.append(amount_cents)
        return amount_cents

    assert charge("o1", 100) == 100
    assert charge("o1", 999) == 100
    assert calls == [100]


def test_decorator_fingerprint_function_picks_what_matters(store: MemoryStore) -> None:
    @idempotent(
        store,
        key="charge:{order_id}",
        fingerprint=lambda order_id, amount_cents, sent_at: {"amount": amount_cents},
    )
    def charge(order_id: str, amount_cents: int, sent_at: str) -> int:
        return amount_cents

    assert charge("o1", 100, "10:00") == 100
    assert charge("o1", 100, "10:05") == 100  # a redelivery with a new timestamp
    with pytest.raises(FingerprintMismatch):
        charge("o1", 200, "10:10")


def test_decorator_busy_key_raises_key_busy(store: MemoryStore) -> None:
    calls: list[str] = []

    @idempotent(store, key="charge:{order_id}")
    def charge(order_id: str) -> str:
        calls.append(order_id)
        return order_id

    store.claim("charge:o1")  # another worker holds it
    with pytest.raises(KeyBusy) as info:
        charge("o1")
    assert info.value.record is not None
    assert calls == []


def test_decorator_permanent_failure_raises_then_previously_failed(store: MemoryStore) -> None:
    calls: list[str] = []

    @idempotent(store, key="charge:{order_id}")
    def charge(order_id: str) -> str:
        calls.append(order_id)
        raise Permanent("card stolen")

    with pytest.raises(Permanent, match="card stolen"):
        charge("o1")
    with pytest.raises(PreviouslyFailed, match="card stolen") as info:
        charge("o1")
    assert info.value.record is not None
    assert info.value.record.status is Status.FAILED
    assert calls == ["o1"]


def test_decorator_retriable_failure_raises_and_runs_again(store: MemoryStore) -> None:
    attempts: list[int] = []

    @idempotent(store, key="charge:{order_id}")
    def charge(order_id: str) -> str:
        attempts.append(current_context().attempt)
        if len(attempts) == 1:
            raise ConnectionError("gateway timeout")
        return "charged"

    with pytest.raises(ConnectionError):
        charge("o1")
    assert charge("o1") == "charged"
    assert attempts == [1, 2]


def test_decorator_custom_permanent_types(store: MemoryStore) -> None:
    @idempotent(store, key="k:{n}", permanent=(LookupError,))
    def lookup(n: int) -> int:
        raise KeyError(n)

    with pytest.raises(KeyError):
        lookup(1)
    with pytest.raises(PreviouslyFailed):
        lookup(1)


def test_decorator_opens_a_store_url_once() -> None:
    calls: list[int] = []

    @idempotent("memory://", key="square:{n}")
    def square(n: int) -> int:
        calls.append(n)
        return n * n

    assert square(3) == 9
    assert square(3) == 9
    assert calls == [3]


def test_decorator_non_json_argument_raises_invalid_payload(store: MemoryStore) -> None:
    calls: list[object] = []

    @idempotent(store, key="job:{name}")
    def job(name: str, conn: object) -> str:
        calls.append(conn)
        return name

    with pytest.raises(InvalidPayload):
        job("nightly", object())
    assert calls == []
    assert store.get("job:nightly") is None


def test_decorator_non_json_argument_is_fine_without_fingerprint(store: MemoryStore) -> None:
    @idempotent(store, key="job:{name}", fingerprint=False)
    def job(name: str, conn: object) -> str:
        return name

    assert job("nightly", object()) == "nightly"


def test_decorator_keeps_the_function_s_name_and_doc(store: MemoryStore) -> None:
    @idempotent(store, key="k:{n}")
    def documented(n: int) -> int:
        """Doubles n."""
        return 2 * n

    assert documented.__name__ == "documented"
    assert documented.__doc__ == "Doubles n."


def test_quick_runs_start_no_thread_and_leave_no_heap_behind() -> None:
    """One heartbeat scheduler per process: 200 handlers that end before their first beat
    start no thread of their own (the scheduler's, at most, once for the process), and the
    heap drops their stopped entries."""
    from idemctl.runner.heartbeat import scheduler

    store = MemoryStore()
    before = {t.ident for t in threading.enumerate()}
    for i in range(200):
        assert run(store, f"quick:{i}", lambda ctx: "ok", lease=30).outcome is Outcome.EXECUTED
    new = [t.name for t in threading.enumerate() if t.ident not in before]
    assert new in ([], ["idemctl-heartbeat"])
    assert scheduler().pending < 100
