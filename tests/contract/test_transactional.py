"""Transactional mode through both APIs (``run(..., transactional=True)`` and ``await
aio.run(...)``), on every backend that has it: the handler's own SQL and its outbox rows
commit with the key or not at all, and a failure is recorded on its own."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from psycopg import sql

from idemctl.aio.outbox import AsyncOutbox
from idemctl.errors import ConfigError, Permanent
from idemctl.model import Acquired, Failed, Status
from idemctl.outbox import Outbox
from idemctl.runner import Context, Outcome
from idemctl.stores.postgres import PostgresStore
from tests.backends import BACKENDS, backends
from tests.contract.api import after, on_api, run, waiting


@dataclass
class Transactional:
    """The store driven through the test's API, and the same store opened plainly, to look
    at what the handlers wrote (their table, the outbox)."""

    driven: Any
    plain: PostgresStore
    effects: sql.Composed
    api: str

    def effect_counts(self) -> dict[str, int]:
        query = sql.SQL("SELECT key, count(*) FROM {} GROUP BY key").format(self.effects)
        with self.plain.connection() as conn:
            return {key: n for key, n in conn.execute(query).fetchall()}

    def outbox_rows(self) -> list[tuple[Any, ...]]:
        query = f"SELECT aggregatetype, aggregateid, type, payload FROM {self.plain.outbox_table}"
        with self.plain.connection() as conn:
            return list(conn.execute(query).fetchall())

    def record_effect(self, ctx: Context) -> Any:
        """The handler's own row, on the transaction's connection (a coroutine on aio's)."""
        insert = sql.SQL("INSERT INTO {} (key) VALUES (%s)").format(self.effects)
        return ctx.connection.execute(insert, (ctx.key,))


@pytest.fixture(params=backends(lambda k: k.transactional))
def tx(request: pytest.FixtureRequest, api: str) -> Iterator[Transactional]:
    backend = BACKENDS[request.param](request)
    backend.reset()
    plain = backend.open()
    assert isinstance(plain, PostgresStore)
    effects = sql.SQL("{}").format(sql.Identifier(plain.schema, f"effects_{uuid.uuid4().hex}"))
    with plain.connection() as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (key text NOT NULL)").format(effects))
    driven = on_api(backend, api).open()
    try:
        yield Transactional(driven, plain, effects, api)
    finally:
        driven.close()
        plain.close()


def test_the_handlers_rows_and_events_commit_with_the_key_and_a_redelivery_replays(
    tx: Transactional,
) -> None:
    """The handler's row and its outbox event commit with the key; a redelivery replays."""
    outbox_type = AsyncOutbox if tx.api == "async" else Outbox

    def charge(ctx: Context) -> Any:
        assert isinstance(ctx.outbox, outbox_type)
        wrote = tx.record_effect(ctx)
        added = ctx.outbox.add("order", ctx.key, "OrderCharged", {"cents": 10})
        return after([wrote, added], lambda: {"charged": 10})

    first = run(tx.driven, "order-1", charge, transactional=True)
    again = run(tx.driven, "order-1", charge, transactional=True)
    assert (first.outcome, first.result, first.attempt) == (Outcome.EXECUTED, {"charged": 10}, 1)
    assert (again.outcome, again.result) == (Outcome.REPLAYED, {"charged": 10})
    assert tx.effect_counts() == {"order-1": 1}
    assert tx.outbox_rows() == [("order", "order-1", "OrderCharged", {"cents": 10})]


def test_a_handler_that_raises_leaves_nothing_it_wrote_and_its_failure_is_recorded(
    tx: Transactional,
) -> None:
    """A retriable failure rolls back the handler's row and counts the attempt (the next
    run executes as attempt 2); a permanent one is final."""
    calls: list[int] = []

    def flaky(ctx: Context) -> Any:
        calls.append(ctx.attempt)

        def finish() -> dict[str, int]:
            if len(calls) == 1:
                raise ConnectionError("gateway timeout")
            return {"attempt": ctx.attempt}

        return after([tx.record_effect(ctx)], finish)

    first = run(tx.driven, "order-1", flaky, transactional=True)
    assert first.outcome is Outcome.ERROR and isinstance(first.error, ConnectionError)
    assert tx.effect_counts() == {}  # the handler's SQL went with the transaction
    record = tx.plain.get("order-1")
    assert record is not None and record.status is Status.FAILED
    assert record.retriable is True and "gateway timeout" in (record.error or "")
    assert record.attempts == 1

    second = run(tx.driven, "order-1", flaky, transactional=True)
    assert second.outcome is Outcome.EXECUTED and second.result == {"attempt": 2}
    assert calls == [1, 2]
    assert tx.effect_counts() == {"order-1": 1}
    record = tx.plain.get("order-1")
    assert record is not None and record.status is Status.COMPLETED and record.attempts == 2

    def declined(ctx: Context) -> Any:
        def finish() -> None:
            raise Permanent("card declined")

        return after([tx.record_effect(ctx)], finish)

    failed = run(tx.driven, "order-2", declined, transactional=True)
    assert failed.outcome is Outcome.ERROR and not failed.retriable
    again = run(tx.driven, "order-2", declined, transactional=True)
    assert again.outcome is Outcome.FAILED
    record = tx.plain.get("order-2")
    assert record is not None and record.status is Status.FAILED and record.attempts == 1
    assert "card declined" in (record.error or "")
    assert tx.effect_counts() == {"order-1": 1}  # order-2's row rolled back
    assert isinstance(tx.plain.claim("order-2"), Failed)
    assert tx.outbox_rows() == []


@pytest.fixture(params=backends(lambda k: not k.transactional))
def without(request: pytest.FixtureRequest, api: str) -> Iterator[Any]:
    """A store without transactional mode, driven through the test's API."""
    backend = BACKENDS[request.param](request)
    backend.reset()
    store = on_api(backend, api).open()
    try:
        yield store
    finally:
        store.close()


def test_transactional_mode_elsewhere_is_a_config_error_before_anything_is_claimed(
    without: Any,
) -> None:
    ran: list[str] = []
    with pytest.raises(ConfigError, match="transactional mode needs a PostgreSQL store"):
        run(without, "k-1", lambda ctx: ran.append(ctx.key), transactional=True)
    assert ran == []
    assert without.get("k-1") is None


def test_a_waiter_in_transactional_mode_runs_the_key_once_the_holder_lets_go(
    tx: Transactional,
) -> None:
    """``wait=`` with ``transactional=True``: the waiter's transaction finds the key held,
    rolls back, waits, and runs it in a transaction of its own once the holder releases."""
    holder = tx.plain.claim("order-w", lease=600)
    assert isinstance(holder, Acquired)

    def charge(ctx: Context) -> Any:
        return after([tx.record_effect(ctx)], lambda: {"charged": 1})

    done, _ = waiting(tx.driven, "order-w", handler=charge, transactional=True)
    tx.plain.release("order-w", holder.owner, holder.fencing_token)
    result = done.result(timeout=60)
    assert (result.outcome, result.result, result.attempt) == (Outcome.EXECUTED, {"charged": 1}, 2)
    assert tx.effect_counts() == {"order-w": 1}
