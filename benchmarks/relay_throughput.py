"""Outbox relay throughput and latency: `idemctl`'s relay against the plain polling
publisher, on the same rows of one PostgreSQL server and the same broker, in one run.

    .venv/bin/python benchmarks/relay_throughput.py [--rows 40000] [--aggregates 100,5000,50000]
        [--batches 100,500,2000] [--relays 1,3] [--reps 1] [--rate 1000] [--latency-seconds 10]
        [--postgres-url URL] [--json]

It starts tansu and a throwaway PostgreSQL cluster (fsync off, as the other benchmarks) on
free loopback ports and stops each by its PID; with --postgres-url everything lives in a
schema ``bench_<random>`` dropped at the end.

Throughput. For each number of aggregates, ``--rows`` outbox rows are written once, each
of an aggregate picked at random (seeded), into a source table. Before each contender's
run the outbox is truncated and filled from it, so every run starts from the same rows.
The contenders, each a process of its own (1 or 3 of them at once), set up, then start
together; the rate is the rows over the time from the start to the last batch committed
(with ``--reps N``, the contenders take turns N times and the median run of each counts):

- **plain**: the plain polling publisher. Per batch, in one transaction: ``SELECT id,
  aggregateid, type, payload::text ... WHERE published_at IS NULL ORDER BY seq LIMIT batch
  FOR UPDATE SKIP LOCKED``, produce every row keyed by its aggregate with an idempotent
  producer, flush, one ``UPDATE ... WHERE id = ANY(...)``. It keeps no aggregate's order
  across relays or delivery failures;
- **relay**: ``idemctl.outbox.Relay`` as ``idemctl outbox relay`` runs it (its default
  poll interval, 1 s), keeping each aggregate's order.

Every run must leave no row unpublished and at least ``--rows`` messages on its topic
(exit 1 if not). Printed: events/s of each, and relay / plain per row.

Latency. A writer process commits one row a transaction at a steady ``--rate`` for
``--latency-seconds``; one relay (poll interval 1 s) publishes them, with and without its
LISTEN/NOTIFY wake-up; a consumer in this process reads the topic. Commit-to-publish is
from the writer's commit returning to the message read from the topic (so it includes the
consumer's fetch): p50, p99 and max, and p99 over the poll interval (the target: at most
0.1 with NOTIFY).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BenchError, finish, stdout_console, stop_on_sigterm

PARTITIONS = 6
POLL_INTERVAL = 1.0
TARGET = 0.7
"""One relay at batch 500 over 5,000 aggregates: at least this over the plain publisher."""
LATENCY_TARGET = 0.1
"""Commit-to-publish p99 with NOTIFY, over the poll interval."""


@dataclass
class Run:
    contender: str
    aggregates: int
    batch: int
    processes: int
    rows: int
    seconds: float
    on_topic: int

    @property
    def rate(self) -> float:
        return self.rows / self.seconds


# Workers: each contender process ---------------------------------------------------------


def worker(spec: dict[str, Any]) -> None:
    """One contender process: set up, say ready, wait for "go", publish until idle, print
    what it did as JSON."""
    from idemctl import open_store

    store = open_store(spec["url"])
    times: list[float] = []
    if spec["contender"] == "relay":
        from idemctl.outbox.relay import Relay, RelayOptions, new_producer

        options = RelayOptions(
            spec["brokers"],
            topic_template=spec["topic"],
            batch_size=spec["batch"],
            poll_interval=POLL_INTERVAL,
            exit_when_idle=spec["idle"],
            listen=spec.get("listen", True),
        )
        producer = new_producer(options.brokers, options.kafka_config, options.delivery_timeout)
        seen = [0]

        def progress(summary: Any) -> None:  # called after every round, empty ones too
            if summary.published > seen[0]:
                seen[0] = summary.published
                times.append(time.monotonic())

        relay = Relay(store, options, on_progress=progress, producer=producer)
    else:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": spec["brokers"], "enable.idempotence": True})
    # Both contenders are connected to the database and the broker before the start.
    producer.list_topics(timeout=10)
    with store.connection() as conn:
        conn.execute("SELECT 1")
    print("ready", flush=True)
    sys.stdin.readline()
    if spec["contender"] == "relay":
        published = relay.run().published
    else:
        published = plain(store, producer, spec, times)
    store.close()
    print(json.dumps({"published": published, "last": times[-1] if times else None}))


def plain(store: Any, producer: Any, spec: dict[str, Any], times: list[float]) -> int:
    table, topic, published, idle_since = store.names.outbox_table, spec["topic"], 0, None
    errors: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err.str())

    while True:
        with store.connection() as conn, conn.transaction():
            rows = conn.execute(
                f"SELECT id, aggregateid, type, payload::text FROM {table} "
                "WHERE published_at IS NULL ORDER BY created_at LIMIT %s FOR UPDATE SKIP LOCKED",
                (spec["batch"],),
            ).fetchall()
            for row_id, aggregateid, kind, body in rows:
                producer.produce(
                    topic,
                    key=aggregateid.encode(),
                    value=None if body is None else body.encode(),
                    headers=[("id", str(row_id)), ("type", kind)],
                    on_delivery=delivered,
                )
            if producer.flush(30) != 0 or errors:
                raise BenchError(f"plain publisher: a batch was not delivered: {errors[:1]}")
            if rows:
                conn.execute(
                    f"UPDATE {table} SET published_at = now() WHERE id = ANY(%s)",
                    ([r[0] for r in rows],),
                )
        now = time.monotonic()
        if rows:
            published, idle_since = published + len(rows), None
            times.append(now)
        elif idle_since is None:
            idle_since = now
        elif now - idle_since >= spec["idle"]:
            return published
        if len(rows) < spec["batch"]:
            time.sleep(0.05)


def writer(spec: dict[str, Any]) -> None:
    """The latency run's writer: a row a transaction at ``rate`` for ``seconds``; prints
    each row's id and the time its commit returned."""
    from idemctl import open_store
    from idemctl.outbox import Outbox

    store = open_store(spec["url"])
    committed: dict[str, float] = {}
    print("ready", flush=True)
    sys.stdin.readline()
    start, n = time.monotonic(), round(spec["rate"] * spec["seconds"])
    with store.connection() as conn:
        outbox = Outbox(conn, store.names.outbox_table)
        for i in range(n):
            delay = start + i / spec["rate"] - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            with conn.transaction():
                row_id = outbox.add("acct", f"a{i % 500}", "Step", {"i": i})
            committed[str(row_id)] = time.monotonic()
    store.close()
    print(json.dumps({"committed": committed, "seconds": time.monotonic() - start}))


# The parent --------------------------------------------------------------------------------


class Workers:
    """Contender processes started together: each prints "ready", gets "go" on stdin."""

    def __init__(self, specs: list[dict[str, Any]]) -> None:
        here = str(Path(__file__).resolve())
        self.procs = [
            subprocess.Popen(
                [sys.executable, here, "--worker", json.dumps(spec)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for spec in specs
        ]

    def go(self) -> float:
        for proc in self.procs:
            line = proc.stdout.readline() if proc.stdout else ""
            if line.strip() != "ready":
                raise BenchError(f"a worker did not start (exit {proc.wait()})")
        started = time.monotonic()
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        return started

    def results(self, timeout: float = 600) -> list[dict[str, Any]]:
        found = []
        for proc in self.procs:
            out, _ = proc.communicate(timeout=timeout)
            if proc.returncode != 0:
                raise BenchError(f"a worker exited {proc.returncode}")
            found.append(json.loads(out.strip().splitlines()[-1]))
        return found

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


class Bench:
    def __init__(self, url: str, brokers: str, schema: str) -> None:
        from postgres_claims import with_options

        from idemctl import open_store

        self.url, self.brokers = with_options(url, schema=schema), brokers
        self.store = open_store(self.url)
        self.store.provision()
        self.table = self.store.names.outbox_table
        self.source = f'"{schema}".bench_source'

    def fill_source(self, rows: int, aggregates: int) -> None:
        self.rows = rows
        with self.store.connection() as conn:
            conn.execute(f"DROP TABLE IF EXISTS {self.source}")
            conn.execute("SELECT setseed(0.17)")
            conn.execute(
                f"CREATE TABLE {self.source} AS SELECT n, "
                "'acct-' || floor(random() * %s)::int AS aggregateid, "
                "json_build_object('n', n, 'amount', 100)::jsonb AS payload "
                "FROM generate_series(1, %s) AS n",
                (aggregates, rows),
            )

    def refill(self) -> None:
        with self.store.connection() as conn:
            conn.execute(f"TRUNCATE {self.table}")
            # As if written over the last few seconds, a row every 100 µs.
            conn.execute(
                f"INSERT INTO {self.table} "
                "(id, aggregatetype, aggregateid, type, payload, created_at) "
                "SELECT gen_random_uuid(), 'acct', aggregateid, 'Step', payload, "
                f"now() - (%s - n) * interval '100 microseconds' FROM {self.source} ORDER BY n",
                (self.rows,),
            )
            conn.execute(f"VACUUM ANALYZE {self.table}")

    def unpublished(self) -> int:
        with self.store.connection() as conn:
            return int(
                conn.execute(
                    f"SELECT count(*) FROM {self.table} WHERE published_at IS NULL"
                ).fetchone()[0]
            )

    @contextlib.contextmanager
    def topic(self) -> Iterator[str]:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.brokers})
        name = f"relay-bench-{uuid.uuid4().hex[:8]}"
        admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(30)
        try:
            yield name
        finally:
            admin.delete_topics([name])[name].result(30)

    def messages(self, topic: str, at_least: int) -> int:
        """Messages on ``topic``, read from the start (tansu's high watermark is wrong):
        until ``at_least`` and half a second without another, or 30 s."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.brokers, "group.id": topic,
                             "enable.auto.commit": False})  # fmt: skip
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        n, quiet, deadline = 0, time.monotonic(), time.monotonic() + 30
        try:
            while time.monotonic() < deadline and (n < at_least or time.monotonic() - quiet < 0.5):
                found = [m for m in consumer.consume(1000, 0.1) if m.error() is None]
                if found:
                    n, quiet = n + len(found), time.monotonic()
            return n
        finally:
            consumer.close()

    def run(self, contender: str, aggregates: int, batch: int, processes: int, rows: int) -> Run:
        self.refill()
        with self.topic() as topic:
            spec = {"contender": contender, "url": self.url, "brokers": self.brokers,
                    "topic": topic, "batch": batch, "idle": 1.5}  # fmt: skip
            workers = Workers([spec] * processes)
            try:
                started = workers.go()
                done = workers.results()
            finally:
                workers.kill()
            last = max(d["last"] for d in done if d["last"] is not None)
            if (left := self.unpublished()) != 0:
                raise BenchError(f"{contender}: {left} row(s) left unpublished")
            on_topic = self.messages(topic, rows)
            if on_topic < rows:  # a count cut short, or messages lost: read once more
                on_topic = max(on_topic, self.messages(topic, rows))
            if on_topic < rows:
                raise BenchError(f"{contender}: {on_topic} message(s) on the topic, not {rows}")
        return Run(contender, aggregates, batch, processes, rows, last - started, on_topic)

    def latency(self, rate: float, seconds: float, listen: bool) -> dict[str, Any]:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        with self.store.connection() as conn:
            conn.execute(f"TRUNCATE {self.table}")
        with self.topic() as topic:
            consumer = Consumer({"bootstrap.servers": self.brokers, "group.id": topic,
                                 "enable.auto.commit": False, "fetch.wait.max.ms": 5})  # fmt: skip
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
            consumer.poll(0.5)
            relay = {"contender": "relay", "url": self.url, "brokers": self.brokers,
                     "topic": topic, "batch": 500, "idle": 3.0, "listen": listen}  # fmt: skip
            write = {"url": self.url, "rate": rate, "seconds": seconds, "writer": True}
            workers = Workers([relay, write])
            seen: dict[str, float] = {}
            try:
                workers.go()
                expect = round(rate * seconds)
                deadline = time.monotonic() + seconds + 30
                while len(seen) < expect and time.monotonic() < deadline:
                    m = consumer.poll(0.1)
                    if m is not None and m.error() is None:
                        seen.setdefault(dict(m.headers())["id"].decode(), time.monotonic())
                done = workers.results()
            finally:
                workers.kill()
                consumer.close()
        committed = done[1]["committed"]
        missing = set(committed) - set(seen)
        if missing:
            raise BenchError(f"latency run: {len(missing)} event(s) never read from the topic")
        lat = sorted((seen[i] - t) * 1000 for i, t in committed.items())
        p99 = lat[min(len(lat) - 1, round(0.99 * len(lat)))]
        return {
            "notify": listen,
            "events": len(lat),
            "rate": len(lat) / done[1]["seconds"],
            "p50_ms": statistics.median(lat),
            "p99_ms": p99,
            "max_ms": lat[-1],
            "p99_over_poll": p99 / (POLL_INTERVAL * 1000),
        }


def work(args: argparse.Namespace) -> dict[str, Any]:
    from idemctl.harness.broker import local_broker

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    runs: list[Run] = []
    latencies: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        brokers = stack.enter_context(local_broker())
        if args.postgres_url:
            url = args.postgres_url
        else:
            from postgres_claims import own_postgres_server

            url, _pid = stack.enter_context(own_postgres_server(fsync=False))
        bench = Bench(url, brokers, schema)
        stack.callback(bench.store.close)
        if args.postgres_url:
            stack.callback(_drop, bench, schema)
        for aggregates in args.aggregates:
            bench.fill_source(args.rows, aggregates)
            for batch in args.batches:
                for processes in args.relays:
                    tries: dict[str, list[Run]] = {"plain": [], "relay": []}
                    for _ in range(args.reps):  # the contenders take turns
                        for contender, done in tries.items():
                            run = bench.run(contender, aggregates, batch, processes, args.rows)
                            done.append(run)
                            print(
                                f"  {contender:5} {aggregates:>6} aggregates, batch {batch:>4}, "
                                f"{processes} process(es): {run.rate:8,.0f} events/s",
                                file=sys.stderr,
                            )
                    runs += [median_run(done) for done in tries.values()]
        if args.latency_seconds > 0:
            for listen in (False, True):
                latencies.append(bench.latency(args.rate, args.latency_seconds, listen))
    return {
        "rows": args.rows,
        "reps": args.reps,
        "cpus": os.cpu_count(),
        "runs": [{**asdict(r), "rate": r.rate} for r in runs],
        "ratios": _ratios(runs),
        "latency": latencies,
    }


def median_run(runs: list[Run]) -> Run:
    """The run of the median rate (of an even number, the lower of the middle two)."""
    return sorted(runs, key=lambda r: r.rate)[(len(runs) - 1) // 2]


def _drop(bench: Bench, schema: str) -> None:
    with bench.store.connection() as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _ratios(runs: list[Run]) -> list[dict[str, Any]]:
    plain = {(r.aggregates, r.batch, r.processes): r for r in runs if r.contender == "plain"}
    found = []
    for r in runs:
        base = plain.get((r.aggregates, r.batch, r.processes))
        if r.contender == "relay" and base is not None:
            target = TARGET if (r.aggregates, r.batch, r.processes) == (5000, 500, 1) else None
            found.append({"aggregates": r.aggregates, "batch": r.batch,
                          "processes": r.processes, "relay": r.rate, "plain": base.rate,
                          "ratio": r.rate / base.rate, "target": target})  # fmt: skip
    return found


def report(data: dict[str, Any]) -> None:
    from rich.table import Table

    console = stdout_console()
    table = Table(title=f"Outbox relay vs the plain polling publisher: {data['rows']:,} rows, "
                  f"{data['cpus']} CPU(s), median of {data['reps']} run(s) each")  # fmt: skip
    for column in ("aggregates", "batch", "processes", "plain events/s", "relay events/s",
                   "relay / plain", "target"):  # fmt: skip
        table.add_column(column, justify="right")
    for r in data["ratios"]:
        target = r["target"]
        verdict = "" if target is None else f"≥ {target} " + (
            "met" if r["ratio"] >= target else "NOT met")  # fmt: skip
        table.add_row(f"{r['aggregates']:,}", str(r["batch"]), str(r["processes"]),
                      f"{r['plain']:,.0f}", f"{r['relay']:,.0f}", f"{r['ratio']:.2f}x",
                      verdict)  # fmt: skip
    console.print(table)
    if data["latency"]:
        lat = Table(title="Commit to publish at a steady rate, one relay, poll interval "
                    f"{POLL_INTERVAL:g}s")  # fmt: skip
        for column in ("wake-up", "events", "events/s", "p50 ms", "p99 ms", "max ms",
                       "p99 / poll", "target"):  # fmt: skip
            lat.add_column(column, justify="right")
        for r in data["latency"]:
            verdict = (f"≤ {LATENCY_TARGET} " + ("met" if r["p99_over_poll"] <= LATENCY_TARGET
                       else "NOT met")) if r["notify"] else ""  # fmt: skip
            lat.add_row("NOTIFY" if r["notify"] else "poll only", str(r["events"]),
                        f"{r['rate']:,.0f}", f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}",
                        f"{r['max_ms']:.1f}", f"{r['p99_over_poll']:.3f}", verdict)  # fmt: skip
        console.print(lat)


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        spec = json.loads(sys.argv[2])
        (writer if spec.get("writer") else worker)(spec)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=40000)
    parser.add_argument("--aggregates", type=_ints, default=[100, 5000, 50000])
    parser.add_argument("--batches", type=_ints, default=[100, 500, 2000])
    parser.add_argument("--relays", type=_ints, default=[1, 3], help="processes at once")
    parser.add_argument("--reps", type=int, default=1, help="runs of each, the median kept")
    parser.add_argument("--rate", type=float, default=1000.0, help="latency run: events/s")
    parser.add_argument("--latency-seconds", type=float, default=10.0, help="0: no latency run")
    parser.add_argument("--postgres-url", help="a server to use instead of a throwaway one")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    stop_on_sigterm()
    return finish("relay_throughput", lambda: work(args), report, args.json, driver="psycopg")


if __name__ == "__main__":
    sys.exit(main())
