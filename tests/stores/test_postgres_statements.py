"""What the library's single-key path sends PostgreSQL, counted on the connection by libpq's
own protocol trace (PQtrace): a first run is two statements, the claim and the completion,
each a Bind of a statement prepared before (no Parse), one round trip each; a replay is the
claim alone. So the fast path cannot grow a statement, lose its prepared plan, or turn into
a batch's statement without this failing. The sync store and the asyncio store alike."""

from __future__ import annotations

import asyncio
import re
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from idemctl import aio
from idemctl.runner import Outcome, run
from idemctl.stores import open_store
from idemctl.stores.postgres.drive import REPLAN_EVERY
from tests.backends import unique_schema
from tests.servers import PostgresServer

PLANS = "SELECT statement, generic_plans FROM pg_prepared_statements"
WARM = 8
"""Runs before the counted one: psycopg prepares the fast statements at once, PostgreSQL
keeps a plan from the sixth execution on."""


def handler(ctx: Any) -> dict[str, bool]:
    return {"ok": True}


async def async_handler(ctx: Any) -> dict[str, bool]:
    return {"ok": True}


class Sent:
    """The messages of one traced stretch: what the client sent (``F``) and the server
    answered (``B``), by message type, and the statements by command tag."""

    def __init__(self, text: str) -> None:
        lines = [line.split("\t") for line in text.splitlines() if line.strip()]
        self.messages = Counter((fields[0], fields[2]) for fields in lines if len(fields) > 2)
        self.tags = [
            fields[3].split()[0].strip('"')
            for fields in lines
            if len(fields) > 3 and fields[0] == "B" and fields[2] == "CommandComplete"
        ]
        binds = [f[3] for f in lines if len(f) > 3 and f[0] == "F" and f[2] == "Bind"]
        self.named = [re.match(r'\s*"" "_pg3_\d+"', bind) is not None for bind in binds]

    def count(self, direction: str, message: str) -> int:
        return self.messages[(direction, message)]


@contextmanager
def traced(conn: Any) -> Iterator[list[Sent]]:
    """libpq's trace of ``conn`` while the block runs; the Sent appears in the list after."""
    out: list[Sent] = []
    with tempfile.TemporaryFile() as file:
        conn.pgconn.trace(file.fileno())
        conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            yield out
        finally:
            conn.pgconn.untrace()
            file.seek(0)
            out.append(Sent(file.read().decode("utf-8", errors="replace")))


def assert_fast(sent: Sent, statements: list[str]) -> None:
    """Exactly ``statements`` (command tags), each a prepared statement's Bind and Execute
    with no Parse, and one round trip (a Sync) each."""
    assert sent.tags == statements
    assert sent.count("F", "Parse") == 0  # prepared already: nothing parsed again
    assert sent.named == [True] * len(statements)  # psycopg's named statements, not ""
    assert sent.count("F", "Execute") == len(statements)
    assert sent.count("F", "Sync") == len(statements)
    assert sent.count("B", "ErrorResponse") == 0


def assert_kept(plans: list[Any]) -> None:
    """The connection's prepared statements are the claim and the completion, each run on
    the plan PostgreSQL kept for it."""
    assert len(plans) == 2 and all(generic > 0 for _, generic in plans), plans


@pytest.fixture
def schema() -> str:
    return unique_schema()


@pytest.fixture
def url(postgres_server: PostgresServer, schema: str) -> str:
    # One pooled connection: the one traced is the one the store runs on.
    return postgres_server.url(schema=schema, pool_min=1, pool_max=1)


def test_a_first_run_is_two_prepared_statements_and_a_replay_one(url: str) -> None:
    with open_store(url) as store:
        store.provision()
        for n in range(WARM):
            run(store, f"warm-{n}", handler)
        with store.connection() as conn:  # type: ignore[attr-defined]
            pass
        with traced(conn) as first:
            assert run(store, "counted", handler).outcome is Outcome.EXECUTED
        with traced(conn) as replay:
            assert run(store, "counted", handler).outcome is Outcome.REPLAYED
        with store.connection() as conn2:  # type: ignore[attr-defined]
            assert conn2 is conn
            plans = conn.execute(PLANS, prepare=False).fetchall()
    assert_fast(first[0], ["SELECT", "UPDATE"])  # the claim's CTE answers with SELECT
    assert_fast(replay[0], ["SELECT"])
    assert_kept(plans)


def test_the_asyncio_store_sends_the_same(url: str) -> None:
    async def main() -> tuple[list[Sent], list[Sent], list[Any]]:
        store = aio.open_store(url)
        try:
            await store.provision()
            for n in range(WARM):
                await aio.run(store, f"warm-{n}", async_handler)
            async with store.connection() as conn:  # type: ignore[attr-defined]
                pass
            with traced(conn) as first:
                assert (await aio.run(store, "counted", async_handler)).outcome is Outcome.EXECUTED
            with traced(conn) as replay:
                again = await aio.run(store, "counted", async_handler)
                assert again.outcome is Outcome.REPLAYED
            async with store.connection() as conn2:  # type: ignore[attr-defined]
                assert conn2 is conn
                cur = await conn.execute(PLANS, prepare=False)
                return first, replay, await cur.fetchall()
        finally:
            await store.aclose()

    first, replay, plans = asyncio.run(main())
    assert_fast(first[0], ["SELECT", "UPDATE"])
    assert_fast(replay[0], ["SELECT"])
    assert_kept(plans)


def test_a_plan_kept_while_the_table_was_tiny_is_made_again(
    url: str, schema: str, postgres_server: PostgresServer
) -> None:
    """ANALYZE on a table of 100 rows, as autovacuum does: the plans kept from then on scan
    the whole table (cheapest at that size), and would until the next ANALYZE. Every
    REPLAN_EVERY executions the connection drops those plans, and once the table outgrew a few
    pages the plans made again look keys up by the primary key: no sequential scan of the
    table in the last 100 runs."""
    table = f'"{schema}".keys'
    with open_store(url) as store, psycopg.connect(postgres_server.url(), autocommit=True) as db:
        store.provision()
        db.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")  # only ours

        def seq_scans() -> int:
            with store.connection() as conn:  # type: ignore[attr-defined]
                conn.execute("SELECT pg_stat_force_next_flush()", prepare=False)
            row = db.execute(
                f"SELECT seq_scan FROM pg_stat_user_tables WHERE relid = '{table}'::regclass"
            ).fetchone()
            return int(row[0])

        for n in range(100):
            run(store, f"tiny-{n}", handler)
        db.execute(f"ANALYZE {table}")
        before = seq_scans()
        # Two prepared statements a run: made again every REPLAN_EVERY / 2 runs, the last
        # time here with 750 rows, a size where the primary key's index is cheapest.
        for n in range(REPLAN_EVERY + 200):
            run(store, f"growing-{n}", handler)
        after = seq_scans()
        for n in range(100):
            run(store, f"grown-{n}", handler)
        assert after > before  # the plans kept after the ANALYZE did scan the table
        assert seq_scans() == after  # and no longer do
