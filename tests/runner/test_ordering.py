"""The sequence guard in the library: run(order=), @idempotent(order_key=, sequence=), and
what a sequence may be."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from idemctl import ConfigError, InvalidPayload, Order, StaleEvent, idempotent, run
from idemctl.model import sequence_of
from idemctl.runner import Context, Outcome
from idemctl.stores.memory import MemoryStore


def test_a_failed_handler_lets_go_of_its_entity_without_advancing_it() -> None:
    store = MemoryStore()

    def boom(ctx: Context) -> None:
        assert ctx.order == Order("acct:1", 5) and ctx.sequence == 5
        raise ValueError("no")

    failed = run(store, "e5", boom, order=Order("acct:1", 5))
    assert failed.outcome is Outcome.ERROR
    entity = store.get_entity("acct:1")
    assert entity is not None and entity.holder is None and entity.sequence is None
    # The entity's next event goes at once: not busy behind the failed one.
    assert run(store, "e6", lambda ctx: ctx.sequence, order=Order("acct:1", 6)).result == 6
    # The failed one, retried, is stale now: 6 was applied after it.
    retried = run(store, "e5", boom, order=Order("acct:1", 5))
    assert (retried.outcome, retried.last) == (Outcome.STALE, 6)


def test_the_decorator_orders_by_an_argument_and_raises_stale() -> None:
    store = MemoryStore()
    balances: dict[str, int] = {}

    @idempotent(store, key="ev:{event_id}", order_key="acct:{account}", sequence="version")
    def set_balance(event_id: str, account: str, version: int, cents: int) -> int:
        balances[account] = cents
        return cents

    assert set_balance("b", "a-7", 2, 900) == 900
    with pytest.raises(StaleEvent, match="applied sequence 2"):
        set_balance("a", "a-7", 1, 2500)
    assert set_balance("b", "a-7", 2, 900) == 900  # a duplicate replays
    assert balances == {"a-7": 900}
    with pytest.raises(ConfigError, match="together"):
        idempotent(store, key="k", order_key="acct:{account}")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (7, 7),
        ("42", 42),
        (b"9", 9),
        ("2026-11-24T21:00:00Z", int(datetime(2026, 11, 24, 21, tzinfo=UTC).timestamp()) * 10**6),
        (
            "2026-11-24T22:00:00+01:00",
            int(datetime(2026, 11, 24, 21, tzinfo=UTC).timestamp()) * 10**6,
        ),
        ("2026-11-24T21:00:00", int(datetime(2026, 11, 24, 21, tzinfo=UTC).timestamp()) * 10**6),
    ],
)
def test_sequences_are_whole_numbers_or_iso_timestamps(value: object, expected: int) -> None:
    assert sequence_of(value) == expected


@pytest.mark.parametrize("value", [True, -1, 2**53, 1.5, "soon", None, [1]])
def test_other_sequences_are_refused(value: object) -> None:
    with pytest.raises(InvalidPayload, match="sequence"):
        sequence_of(value)
