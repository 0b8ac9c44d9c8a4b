"""``run(..., max_attempts=N)``: a key's handler runs at most N times, counted in the store."""

from __future__ import annotations

from typing import Any

import pytest

from idemctl import open_store
from idemctl.errors import AttemptsExhausted
from idemctl.runner import Context, Outcome, run
from idemctl.stores.base import Store
from tests.backends import unique_schema


def failing(runs: list[int]) -> Any:
    def handler(ctx: Context) -> None:
        runs.append(ctx.attempt)
        raise RuntimeError("downstream refused")

    return handler


def exercise(store: Store, transactional: bool = False) -> None:
    runs: list[int] = []
    results = [
        run(store, "k", failing(runs), max_attempts=2, transactional=transactional)
        for _ in range(4)
    ]
    assert runs == [1, 2]
    assert [r.outcome for r in results] == [Outcome.ERROR, Outcome.ERROR, Outcome.FAILED,
                                            Outcome.FAILED]  # fmt: skip
    assert results[0].retriable and not results[1].record.retriable  # type: ignore[union-attr]
    record = store.get("k")
    assert record is not None and record.status.value == "failed" and not record.retriable


def test_the_last_allowed_run_fails_the_key_for_good() -> None:
    with open_store("memory://") as store:
        exercise(store)


def test_a_claim_past_the_bound_is_failed_without_running() -> None:
    with open_store("memory://") as store:
        runs: list[int] = []
        first = run(store, "k", failing(runs))  # no bound: left retriable
        assert first.outcome is Outcome.ERROR and first.record and first.record.retriable
        second = run(store, "k", failing(runs))
        assert second.record and second.record.attempts == 2
        third = run(store, "k", failing(runs), max_attempts=2)  # now bounded: past it
        assert runs == [1, 2]
        assert third.outcome is Outcome.ERROR and isinstance(third.error, AttemptsExhausted)
        assert third.record is not None and not third.record.retriable


def test_postgres_transactional_mode_bounds_runs_too(postgres_server: Any) -> None:
    with open_store(postgres_server.url(schema=unique_schema())) as store:
        store.provision()
        exercise(store, transactional=True)


@pytest.mark.parametrize("bound", [None, 3])
def test_success_within_the_bound_completes(bound: int | None) -> None:
    with open_store("memory://") as store:
        result = run(store, "k", lambda ctx: {"ok": ctx.attempt}, max_attempts=bound)
        assert result.outcome is Outcome.EXECUTED and result.result == {"ok": 1}
