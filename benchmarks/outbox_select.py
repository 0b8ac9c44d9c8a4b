"""Benchmark: what the outbox relay's selection costs, the plain one it had (the oldest due
rows, ``FOR UPDATE SKIP LOCKED``) against the one that keeps each aggregate's order
(``idemctl.outbox.table.take``), on one PostgreSQL server, in the same run.

    .venv/bin/python benchmarks/outbox_select.py [--pending 100000] [--aggregates 10000]
        [--published 100000] [--batch 100] [--reps 5] [--iterations 20]
        [--postgres-url URL] [--json]

Without --postgres-url it initdb's a throwaway cluster and starts its own postgres on a
free 127.0.0.1 port (as ``postgres_claims.py`` does, with its helpers; fsync off: nothing
here commits), and stops it by PID at the end. With --postgres-url everything lives in a
schema ``bench_<random>`` that is dropped at the end.

The outbox holds ``--pending`` unpublished rows, each of one of ``--aggregates`` aggregates
picked at random, after ``--published`` rows already published (kept until a purge, as
in production). Each selection runs as the relay runs it: in a transaction with
``lock_timeout = 0``, taking ``--batch`` rows, and is rolled back, so every run finds the
same table. Scenarios:

- fresh: nobody else holds a row, no delivery failed;
- 2 relays busy: two other transactions hold a batch each, taken with the same selection
  (the plain one skips their rows; the ordered one skips their aggregates);
- oldest blocked: the aggregates of the oldest ``WINDOW * batch`` unpublished rows wait
  for a failed row (its ``retry_at`` ahead), so the ordered selection finds nothing in its
  first window and looks again, ``WIDEN`` times further, leaving those aggregates out;
  the plain one takes rows of those very aggregates (ahead of their failed rows: the
  order it broke);
- hot aggregate blocked: the oldest half of the unpublished rows belong to one aggregate
  whose first row waits for a failed delivery: the second look leaves it out, but the
  index scan still walks past its rows.

Printed: milliseconds per selection (median and 90th percentile of ``--reps`` x
``--iterations``, the rounds interleaving both selections), statements per selection
(the ordered one runs one per window it looks at), rows taken, and the ratio ordered /
plain of the medians per scenario. Nothing is asserted but that the ordered
selection kept the order (exit 1 if not).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from _common import (
    BenchError,
    MissingPart,
    finish,
    stdout_console,
    stop_on_sigterm,
    version,
)
from postgres_claims import (
    open_idemctl_store,
    own_postgres_server,
    quote_ident,
    with_options,
)

PLAIN_SQL = (
    "SELECT id, aggregatetype, aggregateid, type, payload, headers, created_at, published_at, "
    "attempts, last_error, seq FROM {table} WHERE published_at IS NULL "
    "AND (retry_at IS NULL OR retry_at <= now()) ORDER BY seq LIMIT %s FOR UPDATE SKIP LOCKED"
)
"""The relay's selection before it kept each aggregate's order (idemctl 51d1fea)."""

SCENARIOS = ("fresh", "2 relays busy", "oldest blocked", "hot aggregate blocked")


@dataclass
class Settings:
    pending: int
    aggregates: int
    published: int
    batch: int
    reps: int
    iterations: int
    postgres_url: str | None
    as_json: bool


@dataclass
class Timing:
    scenario: str
    selection: str
    millis: list[float] = field(default_factory=list)
    taken: list[int] = field(default_factory=list)
    statements: list[int] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.millis)

    @property
    def p90(self) -> float:
        ordered = sorted(self.millis)
        return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


Select = Callable[[Any, str, int], list[Any]]


def plain(conn: Any, table: str, limit: int) -> list[Any]:
    return list(conn.execute(PLAIN_SQL.format(table=table), (limit,)).fetchall())


def ordered(conn: Any, table: str, limit: int) -> list[Any]:
    from idemctl.outbox.table import take

    return list(take(conn, table, limit))


SELECTIONS: dict[str, Select] = {"plain": plain, "ordered": ordered}


def fill(admin: Any, table: str, settings: Settings) -> None:
    """The published rows, then the pending ones, each of a random aggregate."""
    insert = (
        f"INSERT INTO {table} (aggregatetype, aggregateid, type, payload, published_at) "
        "SELECT 'order', 'agg-' || floor(random() * %(aggregates)s)::int, 'OrderChanged', "
        "jsonb_build_object('n', i, 'cents', 100 + i), {published} "
        "FROM generate_series(1, %(n)s) i"
    )
    admin.execute("SELECT setseed(0.42)")
    params = {"aggregates": settings.aggregates}
    if settings.published:
        admin.execute(
            insert.format(table=table, published="now()"), {**params, "n": settings.published}
        )
    admin.execute(insert.format(table=table, published="NULL"), {**params, "n": settings.pending})
    admin.execute(f"VACUUM ANALYZE {table}")


@contextlib.contextmanager
def scenario(
    admin: Any, url: str, table: str, name: str, select: Select, batch: int
) -> Iterator[None]:
    """The table as ``name`` has it while the block runs; as it was afterwards."""
    import psycopg

    from idemctl.outbox.table import WINDOW

    if name == "fresh":
        yield
    elif name == "2 relays busy":
        holders = [psycopg.connect(url) for _ in range(2)]
        try:
            for holder in holders:
                holder.execute("SET LOCAL lock_timeout = 0")
                if len(select(holder, table, batch)) != batch:
                    raise BenchError(f"a busy relay took fewer than {batch} rows")
            yield
        finally:
            for holder in holders:
                holder.rollback()
                holder.close()
    elif name == "hot aggregate blocked":
        admin.execute(
            f"""
CREATE TEMP TABLE hot AS SELECT id, aggregateid FROM {table} WHERE published_at IS NULL
ORDER BY seq LIMIT (SELECT count(*) / 2 FROM {table} WHERE published_at IS NULL);
UPDATE {table} o SET aggregateid = 'hot' FROM hot WHERE o.id = hot.id;
UPDATE {table} SET retry_at = now() + interval '1 hour', attempts = 1, last_error = 'bench'
WHERE seq = (SELECT min(seq) FROM {table} WHERE published_at IS NULL)"""
        )
        try:
            yield
        finally:
            admin.execute(
                f"""
UPDATE {table} o SET aggregateid = hot.aggregateid, retry_at = NULL, attempts = 0,
    last_error = NULL FROM hot WHERE o.id = hot.id;
DROP TABLE hot"""
            )
            admin.execute(f"VACUUM ANALYZE {table}")
    else:
        blocked = admin.execute(
            f"""
WITH oldest AS (SELECT aggregatetype, aggregateid FROM {table} WHERE published_at IS NULL
                ORDER BY seq LIMIT %s)
UPDATE {table} o SET retry_at = now() + interval '1 hour', attempts = 1, last_error = 'bench'
WHERE o.seq IN (SELECT min(seq) FROM {table} WHERE published_at IS NULL
                AND (aggregatetype, aggregateid) IN (SELECT * FROM oldest)
                GROUP BY aggregatetype, aggregateid)""",
            (WINDOW * batch,),
        ).rowcount
        if not blocked:
            raise BenchError("no aggregate to block")
        try:
            yield
        finally:
            admin.execute(
                f"UPDATE {table} SET retry_at = NULL, attempts = 0, last_error = NULL "
                "WHERE retry_at IS NOT NULL"
            )


def check_order(conn: Any, table: str, taken: Sequence[Any]) -> None:
    """Every row the ordered selection took is its aggregate's earliest unpublished row, or
    follows one it took too; it never took an aggregate whose head is held back."""
    ids = [row.id for row in taken]
    if len(set(ids)) != len(ids):
        raise BenchError("the ordered selection took a row twice")
    bad = conn.execute(
        f"""
SELECT count(*) FROM {table} t WHERE t.id = ANY(%(ids)s) AND EXISTS (
    SELECT 1 FROM {table} e WHERE e.published_at IS NULL AND e.aggregatetype = t.aggregatetype
      AND e.aggregateid = t.aggregateid AND e.seq < t.seq AND NOT e.id = ANY(%(ids)s))""",
        {"ids": ids},
    ).fetchone()[0]
    held = conn.execute(
        f"SELECT count(*) FROM {table} WHERE id = ANY(%s) AND retry_at > now()", (ids,)
    ).fetchone()[0]
    if bad or held:
        raise BenchError(
            f"the ordered selection broke an aggregate's order: {bad} row(s) ahead of an "
            f"earlier unpublished row, {held} held back"
        )


class Counting:
    """A connection that counts the statements run through it."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.statements = 0

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        self.statements += 1
        return self.conn.execute(*args, **kwargs)


def measure(conn: Any, table: str, select: Select, batch: int, timing: Timing, n: int) -> None:
    for _ in range(n):
        conn.execute("SET LOCAL lock_timeout = 0")  # opens the transaction, as in the relay
        counting = Counting(conn)
        start = time.perf_counter()
        rows = select(counting, table, batch)
        timing.millis.append((time.perf_counter() - start) * 1000)
        timing.taken.append(len(rows))
        timing.statements.append(counting.statements)
        if select is ordered:
            check_order(conn, table, rows)
        conn.rollback()


def benchmark(settings: Settings, postgres_url: str, own_server: bool) -> dict[str, Any]:
    import psycopg
    from rich.console import Console

    from idemctl.outbox.table import WIDEN, WINDOW
    from idemctl.urls import redact_url

    progress = Console(stderr=True)
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    admin = psycopg.connect(postgres_url, autocommit=True)
    store = None
    try:
        store = open_idemctl_store(with_options(postgres_url, schema=schema, pool_max="1"))
        table = store.names.outbox_table
        progress.print(
            f"filling {table}: {settings.published:,} published rows, {settings.pending:,} "
            f"unpublished of {settings.aggregates:,} aggregates"
        )
        fill(admin, table, settings)
        conn = psycopg.connect(postgres_url)
        timings = {(s, name): Timing(s, name) for s in SCENARIOS for name in SELECTIONS}
        try:
            for name, select in SELECTIONS.items():  # warm-up: caches, prepared statements
                for s in SCENARIOS:
                    with scenario(admin, postgres_url, table, s, select, settings.batch):
                        measure(conn, table, select, settings.batch, Timing(s, name), 6)
            for rep in range(1, settings.reps + 1):
                for s in SCENARIOS:
                    for name, select in SELECTIONS.items():
                        timing = timings[s, name]
                        with scenario(admin, postgres_url, table, s, select, settings.batch):
                            measure(conn, table, select, settings.batch, timing,
                                    settings.iterations)  # fmt: skip
                        last = statistics.median(timing.millis[-settings.iterations :])
                        progress.print(
                            f"round {rep}/{settings.reps}  {s:<15} {name:<8} median {last:8.2f} ms"
                        )
        finally:
            conn.close()

        def show(setting: str) -> str:
            row = admin.execute(f"SHOW {setting}").fetchone()
            return "" if row is None else str(row[0])

        return {
            "postgres_url": None if own_server else redact_url(postgres_url),
            "own_server": own_server,
            "server_version": show("server_version"),
            "work_mem": show("work_mem"),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "versions": {pkg: version(pkg) for pkg in ("idemctl", "psycopg", "psycopg-binary")},
            "pending": settings.pending,
            "aggregates": settings.aggregates,
            "published": settings.published,
            "batch": settings.batch,
            "window": WINDOW * settings.batch,
            "widen": WIDEN,
            "reps": settings.reps,
            "iterations": settings.iterations,
            "results": [
                {
                    "scenario": t.scenario,
                    "selection": t.selection,
                    "median_ms": round(t.median, 3),
                    "p90_ms": round(t.p90, 3),
                    "rows_taken": sorted(set(t.taken)),
                    "statements": round(statistics.mean(t.statements), 2),
                }
                for t in timings.values()
            ],
            "ratios": [
                {
                    "scenario": s,
                    "ordered_over_plain": round(
                        timings[s, "ordered"].median / timings[s, "plain"].median, 2
                    ),
                }
                for s in SCENARIOS
            ],
        }
    finally:
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()
        if not own_server:  # on someone else's server, leave nothing behind
            with contextlib.suppress(Exception):
                admin.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE")
        admin.close()


def report(data: dict[str, Any]) -> None:
    from rich.table import Table

    console = stdout_console()
    where = "own server" if data["own_server"] else data["postgres_url"]
    console.print(
        f"PostgreSQL {data['server_version']} ({where}, work_mem {data['work_mem']}); "
        f"Python {data['python']}; {data['cpus']} CPUs. {data['pending']:,} unpublished rows "
        f"of {data['aggregates']:,} aggregates after {data['published']:,} published; "
        f"batch {data['batch']}, first window {data['window']} rows (then x{data['widen']}); "
        f"{data['reps']} x {data['iterations']} selections each."
    )
    table = Table(title="The outbox relay's selection: ms per batch taken")
    for column in ("scenario", "selection", "median ms", "p90 ms", "statements", "rows taken"):
        table.add_column(column, justify="left" if column in ("scenario", "selection") else "right")
    for r in data["results"]:
        table.add_row(
            r["scenario"],
            r["selection"],
            f"{r['median_ms']:.2f}",
            f"{r['p90_ms']:.2f}",
            f"{r['statements']:g}",
            ", ".join(str(n) for n in r["rows_taken"]),
        )
    console.print(table)
    ratios = Table(title="ordered / plain (medians, same run)")
    ratios.add_column("scenario")
    ratios.add_column("ratio", justify="right")
    for r in data["ratios"]:
        ratios.add_row(r["scenario"], f"{r['ordered_over_plain']:.2f}x")
    console.print(ratios)


def parse_args(argv: Sequence[str] | None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pending", type=int, default=100_000, help="unpublished rows")
    parser.add_argument("--aggregates", type=int, default=10_000, help="aggregates they belong to")
    parser.add_argument("--published", type=int, default=100_000, help="published rows before them")
    parser.add_argument("--batch", type=int, default=100, help="rows per selection (--batch-size)")
    parser.add_argument("--reps", type=int, default=5, help="rounds, interleaving the selections")
    parser.add_argument("--iterations", type=int, default=20, help="selections per round")
    parser.add_argument("--postgres-url", help="use this server instead of starting one")
    parser.add_argument("--json", action="store_true", help="also print the numbers as JSON")
    args = parser.parse_args(argv)
    if min(args.pending, args.aggregates, args.batch, args.reps, args.iterations) < 1:
        parser.error("--pending, --aggregates, --batch, --reps and --iterations must be positive")
    if args.published < 0:
        parser.error("--published must not be negative")
    if args.pending < 3 * args.batch:
        parser.error("--pending must hold at least three batches (two busy relays and one more)")
    return Settings(
        args.pending,
        args.aggregates,
        args.published,
        args.batch,
        args.reps,
        args.iterations,
        args.postgres_url,
        args.json,
    )


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_args(argv)
    stop_on_sigterm()

    def work() -> dict[str, Any]:
        try:
            import psycopg  # noqa: F401

            from idemctl.outbox.table import take  # noqa: F401
        except ImportError as exc:
            raise MissingPart(f"{exc}: .venv/bin/pip install -e '.[postgres]'") from exc
        if settings.postgres_url:
            return benchmark(settings, settings.postgres_url, own_server=False)
        # fsync off: every selection is rolled back, nothing waits for the disk.
        with own_postgres_server(fsync=False) as (url, _pid):
            return benchmark(settings, url, own_server=True)

    return finish(
        "outbox_select", work, report, settings.as_json, driver="psycopg", server="PostgreSQL"
    )


if __name__ == "__main__":
    sys.exit(main())
