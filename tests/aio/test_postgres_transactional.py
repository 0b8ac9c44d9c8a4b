"""The async PostgreSQL store (``idemctl.stores.postgres.store_async``) on a real server:
transactional mode on psycopg's async connections, and the claim/complete path answered
natively, beyond the contract suite (which runs on it too, through
``idemctl.aio.open_store``).

Each test runs its coroutine with ``asyncio.run`` in a schema of its own on the session's
server; the handlers' effects go to a table of the test's own, counted in rows."""

from __future__ import annotations

import asyncio
import threading
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from psycopg import sql

from idemctl import aio
from idemctl.aio.outbox import AsyncOutbox
from idemctl.errors import (
    ConfigError,
    IncompleteTransaction,
    LeaseLost,
    NotProvisioned,
    OutboxError,
    StoreUnavailable,
)
from idemctl.model import (
    Acquired,
    Busy,
    ClaimOutcome,
    ClaimRequest,
    Completed,
    Completion,
    Guard,
    Order,
    Settle,
    Stale,
    Status,
    Verdict,
    fingerprint,
)
from idemctl.stores import open_store
from idemctl.stores.postgres.store_async import AsyncPostgresStore
from tests.backends import expire_lease, unique_schema
from tests.polling import wait_until_async
from tests.servers import PostgresServer, free_port

T = TypeVar("T")
HANG = 30.0
"""No test's coroutine may take longer than this: a bound that catches hangs, not speed."""
LONG = 60.0


def run(main: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(main(), HANG)

    return asyncio.run(bounded())


@pytest.fixture
def url(postgres_server: PostgresServer) -> str:
    """A provisioned schema of the test's own."""
    url = postgres_server.url(schema=unique_schema())
    with open_store(url) as store:
        store.provision()
    return url


@pytest.fixture
def db(postgres_server: PostgresServer) -> Iterator[Any]:
    """A plain autocommit connection, to look at what the store wrote."""
    conn = postgres_server.connect()
    yield conn
    conn.close()


@pytest.fixture
def effects(db: Any) -> Iterator[sql.Identifier]:
    """A table of the test's own (in ``public``), where handlers record their side effects."""
    table = sql.Identifier("public", f"effects_{uuid.uuid4().hex}")
    db.execute(sql.SQL("CREATE TABLE {} (key text NOT NULL)").format(table))
    yield table
    db.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))


def expire_sync(url: str, key: str) -> None:
    """``key``'s lease run out, written through a sync store of the same schema."""
    with open_store(url) as store:
        expire_lease(store, key)


def opened(url: str) -> AsyncPostgresStore:
    store = aio.open_store(url)
    assert isinstance(store, AsyncPostgresStore)
    return store


async def record_effect(conn: Any, table: sql.Identifier, key: str) -> None:
    await conn.execute(sql.SQL("INSERT INTO {} (key) VALUES (%s)").format(table), (key,))


def effect_counts(db: Any, table: sql.Identifier) -> dict[str, int]:
    rows = db.execute(sql.SQL("SELECT key, count(*) FROM {} GROUP BY key").format(table))
    return {key: n for key, n in rows.fetchall()}


def outbox_rows(db: Any, store: AsyncPostgresStore) -> list[tuple[Any, ...]]:
    query = f"SELECT aggregatetype, aggregateid, type, payload FROM {store.outbox_table}"
    return list(db.execute(query).fetchall())


# Transactional mode --------------------------------------------------------------------------


def test_transaction_commits_effects_outbox_rows_and_completion_together(
    url: str, db: Any, effects: sql.Identifier
) -> None:
    store = opened(url)

    async def main() -> None:
        async with store:
            async with store.transaction("order-1", fingerprint({"n": 1})) as unit:
                assert isinstance(unit.outcome, Acquired)
                await record_effect(unit.connection, effects, "order-1")
                outbox = AsyncOutbox(unit.connection, store.outbox_table)
                await outbox.add("order", "order-1", "OrderCharged", {"cents": 10})
                # Not visible outside the transaction yet: neither the effect, the outbox
                # row nor the claim.
                assert effect_counts(db, effects) == {}
                assert outbox_rows(db, store) == []
                assert await store.get("order-1") is None
                record = await unit.complete({"charged": 10})
                assert record.status is Status.COMPLETED
            assert effect_counts(db, effects) == {"order-1": 1}
            assert outbox_rows(db, store) == [("order", "order-1", "OrderCharged", {"cents": 10})]
            done = await store.get("order-1")
            assert done is not None and done.status is Status.COMPLETED
            assert done.result == {"charged": 10}

            # A redelivery replays the stored result: nothing runs, nothing is held.
            async with store.transaction("order-1", fingerprint({"n": 1})) as again:
                assert isinstance(again.outcome, Completed)
                assert again.outcome.record.result == {"charged": 10}
                assert again.connection is None
            assert effect_counts(db, effects) == {"order-1": 1}

    run(main)


def test_a_handler_that_raises_rolls_everything_back(
    url: str, db: Any, effects: sql.Identifier
) -> None:
    store = opened(url)
    acquired: list[Acquired] = []

    async def crash() -> None:
        async with store.transaction("order-1", lease=LONG) as unit:
            assert isinstance(unit.outcome, Acquired)
            acquired.append(unit.outcome)
            await record_effect(unit.connection, effects, "order-1")
            await AsyncOutbox(unit.connection, store.outbox_table).add(
                "order", "order-1", "OrderCharged", {"cents": 10}
            )
            await unit.complete("never stored")
            raise RuntimeError("handler blew up after complete")

    async def forgetful() -> None:
        async with store.transaction("order-1", lease=LONG) as unit:
            assert isinstance(unit.outcome, Acquired)
            acquired.append(unit.outcome)
            await record_effect(unit.connection, effects, "order-1")

    async def main() -> None:
        async with store:
            with pytest.raises(RuntimeError, match="blew up"):
                await crash()
            assert effect_counts(db, effects) == {}
            assert outbox_rows(db, store) == []
            assert await store.get("order-1") is None

            # A block that never completes is rolled back too.
            with pytest.raises(IncompleteTransaction, match="complete"):
                await forgetful()
            assert effect_counts(db, effects) == {}
            assert await store.get("order-1") is None

            # The key is free for its next delivery, the fencing counter never turned back.
            outcome = await store.claim("order-1")
            assert isinstance(outcome, Acquired) and outcome.attempt == 1
            assert outcome.fencing_token > max(a.fencing_token for a in acquired)

    run(main)


def test_the_sequence_guard_joins_the_transaction(
    url: str, db: Any, effects: sql.Identifier
) -> None:
    store = opened(url)
    acct = "acct:1"

    async def apply(key: str, sequence: int) -> ClaimOutcome | Stale:
        async with store.transaction(key, lease=LONG, order=Order(acct, sequence)) as unit:
            if isinstance(unit.outcome, Acquired):
                await record_effect(unit.connection, effects, key)
                await unit.complete(f"applied {sequence}")
            return unit.outcome

    async def main() -> None:
        async with store:
            assert isinstance(await apply("event-5", 5), Acquired)
            entity = await store.get_entity(acct)
            assert entity is not None
            assert (entity.sequence, entity.key, entity.holder) == (5, "event-5", None)

            # Older and equal events are stale: not run, their keys completed (null result).
            for key, sequence in (("event-4", 4), ("event-5-again", 5)):
                async with store.transaction(key, lease=LONG, order=Order(acct, sequence)) as s:
                    assert s.outcome == Stale(acct, sequence, 5)
                    assert s.connection is None
                replay = await store.claim(key)
                assert isinstance(replay, Completed) and replay.record.result is None
            assert effect_counts(db, effects) == {"event-5": 1}

            assert isinstance(await apply("event-6", 6), Acquired)
            entity = await store.get_entity(acct)
            assert entity is not None and (entity.sequence, entity.key) == (6, "event-6")
            assert effect_counts(db, effects) == {"event-5": 1, "event-6": 1}

            # The guard outside transactions agrees, and a live hold from it makes a
            # transaction on the entity Busy, rolled back (the key free again).
            late = await store.claim("late-7")
            assert isinstance(late, Acquired)
            (reply,) = await store.guard_many([Guard(acct, 7, "late-7", late.fencing_token)])
            assert reply.verdict is Verdict.GO
            assert await apply("event-8", 8) == Busy(None)
            assert await store.get("event-8") is None
            (stale,) = await store.guard_many([Guard(acct, 6, "late-7", late.fencing_token)])
            assert (stale.verdict, stale.last) == (Verdict.STALE, 6)

    run(main)


def test_a_key_held_by_another_open_transaction_is_busy(url: str) -> None:
    store = opened(url)

    async def main() -> None:
        async with store:
            inside, leave = asyncio.Event(), asyncio.Event()

            async def hold() -> None:
                async with store.transaction("order-1", lease=LONG) as unit:
                    assert isinstance(unit.outcome, Acquired)
                    inside.set()
                    await leave.wait()
                    await unit.complete("held")

            holder = asyncio.create_task(hold())
            await inside.wait()
            started = time.monotonic()
            async with store.transaction("order-1", lease=LONG) as other:
                assert other.outcome == Busy(None) and other.connection is None
            # The native claim waits for the row lock_timeout at most: Busy, not a hang.
            assert await store.claim("order-1") == Busy(None)
            # In a batch only the held key is busy.
            outcomes = await store.claim_many([ClaimRequest("order-1"), ClaimRequest("order-2")])
            assert outcomes[0] == Busy(None) and isinstance(outcomes[1], Acquired)
            assert time.monotonic() - started < 5.0
            leave.set()
            await holder
            replay = await store.claim("order-1")
            assert isinstance(replay, Completed) and replay.record.result == "held"

    run(main)


def test_outbox_rows_need_an_open_transaction(url: str, db: Any) -> None:
    store = opened(url)

    async def main() -> None:
        async with store, store.connection() as conn:
            with pytest.raises(OutboxError, match="inside a transaction"):
                await AsyncOutbox(conn, store.outbox_table).add("order", "1", "T", {})
            with pytest.raises(OutboxError, match="must not be empty"):
                await AsyncOutbox(conn, store.outbox_table).add("", "1", "T", {})
        assert outbox_rows(db, store) == []

    run(main)


# Errors --------------------------------------------------------------------------------------


def test_an_unreachable_server_is_store_unavailable_with_the_url_redacted() -> None:
    port = free_port()
    url = f"postgresql://test:s3cret@127.0.0.1:{port}/postgres?connect_timeout=1s"
    store = opened(url)  # no I/O until the first operation
    assert "s3cret" not in store.url and "s3cret" not in repr(store)
    shown: list[str] = []

    async def main() -> None:
        async with store:
            with pytest.raises(StoreUnavailable) as claimed:
                await store.claim("k")
            with pytest.raises(StoreUnavailable) as in_transaction:
                async with store.transaction("k"):
                    pass
            for info in (claimed, in_transaction):
                message = str(info.value)
                assert "127.0.0.1" in message and str(port) in message
                shown.append("".join(traceback.format_exception(info.value)))

    run(main)
    assert shown and all("s3cret" not in text for text in shown)


def test_a_transaction_whose_connection_dies_fails_closed_and_the_store_recovers(
    url: str, db: Any
) -> None:
    """The server ends the session (a restart, a failover, an admin): complete() inside the
    block and the block itself raise StoreUnavailable, nothing is recorded, and the store
    answers again once connections can be made (a new pool, as the sync store's)."""
    store = opened(url)
    inside: list[BaseException] = []

    async def block() -> None:
        async with store.transaction("order-1", lease=LONG) as unit:
            assert isinstance(unit.outcome, Acquired) and unit.connection is not None
            db.execute("SELECT pg_terminate_backend(%s)", (unit.connection.info.backend_pid,))
            try:
                await unit.complete("never stored")
            except Exception as exc:
                inside.append(exc)
                raise

    async def main() -> None:
        async with store:
            with pytest.raises(StoreUnavailable):
                await block()
            assert len(inside) == 1 and isinstance(inside[0], StoreUnavailable), inside
            assert await store.get("order-1") is None

            async def claimed() -> Any:
                try:
                    return await store.claim("order-1")
                except StoreUnavailable:
                    return None

            outcome = await wait_until_async(claimed, "a claim answered", HANG / 2, 0.1)
            assert isinstance(outcome, Acquired)

    run(main)


def test_a_refused_connection_is_a_config_error(postgres_server: PostgresServer) -> None:
    store = opened(postgres_server.url("no_such_database", password="s3cret"))

    async def main() -> None:
        async with store:
            with pytest.raises(ConfigError, match="refused the connection") as info:
                await store.claim("k")
            assert "no_such_database" in str(info.value)
            assert "s3cret" not in "".join(traceback.format_exception(info.value))

    run(main)


def test_a_schema_never_provisioned_is_not_provisioned(postgres_server: PostgresServer) -> None:
    store = opened(postgres_server.url(password="s3cret", schema=unique_schema()))

    async def main() -> None:
        async with store:
            with pytest.raises(NotProvisioned, match="idemctl init") as info:
                await store.claim("k")
            assert "s3cret" not in "".join(traceback.format_exception(info.value))
            with pytest.raises(NotProvisioned, match="idemctl init"):
                await store.guard_many([Guard("acct:1", 1, "k", 1)])

    run(main)


# The claim/complete path, natively ---------------------------------------------------------------


def test_a_takeover_fences_the_old_owner_natively(url: str) -> None:
    store = opened(url)

    async def main() -> None:
        async with store:
            first = await store.claim("order-1", lease=LONG)
            assert isinstance(first, Acquired) and not first.takeover
            assert isinstance(await store.claim("order-1"), Busy)
            await asyncio.to_thread(expire_sync, url, "order-1")  # the store's clock set
            second = await store.claim("order-1", lease=LONG)
            assert isinstance(second, Acquired) and second.takeover
            assert second.fencing_token == first.fencing_token + 1 and second.attempt == 2

            # The zombie is fenced off everywhere, and told who holds the key now.
            old = ("order-1", first.owner, first.fencing_token)
            with pytest.raises(LeaseLost, match=str(second.fencing_token)) as lost:
                await store.complete(*old, "zombie")
            assert lost.value.record is not None
            assert lost.value.record.owner == second.owner
            with pytest.raises(LeaseLost):
                await store.extend(*old, LONG)
            with pytest.raises(LeaseLost):
                await store.fail(*old, "zombie failed")
            with pytest.raises(LeaseLost):
                await store.release(*old)
            assert await store.complete_many([Completion(*old, "zombie")]) == [False]

            lease_end = await store.extend("order-1", second.owner, second.fencing_token, LONG)
            assert lease_end >= second.lease_expires_at
            record = await store.complete("order-1", second.owner, second.fencing_token, "ok")
            assert record.status is Status.COMPLETED and record.result == "ok"
            replay = await store.claim("order-1")
            assert isinstance(replay, Completed) and replay.record.result == "ok"
            got = await store.get("order-1")
            assert got is not None and got.fencing_token == second.fencing_token

            # A batch: the same key twice, as claims one by one would see it.
            a, b, c = await store.claim_many(
                [ClaimRequest("b-1"), ClaimRequest("b-1"), ClaimRequest("b-2")], lease=LONG
            )
            assert isinstance(a, Acquired) and isinstance(b, Busy) and isinstance(c, Acquired)
            done = await store.complete_many(
                [Completion("b-1", a.owner, a.fencing_token, 1), Completion("b-2", "x", 1, 2)]
            )
            assert done == [True, False]

            # The sequence guard's round trip: guard, then finish (settle and complete).
            d = await store.claim("event-1", lease=LONG)
            assert isinstance(d, Acquired)
            (go,) = await store.guard_many([Guard("acct:9", 1, "event-1", d.fencing_token)])
            assert go.verdict is Verdict.GO
            finished = await store.finish_many(
                [Completion("event-1", d.owner, d.fencing_token, "x")],
                [Settle("acct:9", 1, "event-1", d.fencing_token)],
            )
            assert finished == [True]
            entity = await store.get_entity("acct:9")
            assert entity is not None and (entity.sequence, entity.holder) == (1, None)

    run(main)


def test_the_claim_complete_path_runs_on_no_worker_thread(url: str) -> None:
    store = opened(url)

    async def main() -> None:
        async with store:
            a = await store.claim("k", lease=LONG)
            assert isinstance(a, Acquired)
            await store.extend("k", a.owner, a.fencing_token, LONG)
            await store.complete("k", a.owner, a.fencing_token, "ok")
            assert await store.get("k") is not None
            b = await store.claim("k2", lease=LONG)
            assert isinstance(b, Acquired)
            await store.release("k2", b.owner, b.fencing_token)
            (reply,) = await store.guard_many([Guard("e", 1, "k2", b.fencing_token)])
            await store.settle_many([Settle("e", 1, "k2", b.fencing_token, False)])
            assert reply.verdict is Verdict.GO
            assert store._executor is None  # nothing ran in a thread so far

    run(main)


def test_one_store_serves_one_event_loop_after_another(url: str) -> None:
    store = opened(url)

    async def claim() -> Acquired:
        outcome = await store.claim("k", lease=LONG)
        assert isinstance(outcome, Acquired)
        return outcome

    a = run(claim)

    async def complete() -> None:
        async with store:
            await store.complete("k", a.owner, a.fencing_token, "ok")
            replay = await store.claim("k")
            assert isinstance(replay, Completed) and replay.record.result == "ok"

    run(complete)


def test_a_store_left_open_does_not_keep_asyncio_run_from_ending(
    postgres_server: PostgresServer,
) -> None:
    """``asyncio.run`` ending with the store still open (no ``aclose()``) cancels the pool's
    tasks while some still connect; psycopg_pool's workers take that for a failed attempt
    and wait for more work, so without the store's warden closing the pool it never ended
    (one run in four here, found by CI). Ten rounds, each bounded in a thread of its own."""

    def round_() -> None:
        url = postgres_server.url(schema=unique_schema())
        with open_store(url) as sync:
            sync.provision()
        store = opened(url)

        async def claim() -> None:
            assert isinstance(await store.claim("k", lease=LONG), Acquired)

        asyncio.run(claim())  # the store is never closed

    for _ in range(10):
        done = threading.Thread(target=round_, daemon=True)
        done.start()
        done.join(HANG)
        assert not done.is_alive(), "asyncio.run did not end with the store left open"
