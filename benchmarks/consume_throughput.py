"""Consume throughput: `idemctl consume`'s loop with a no-op handler on each store, one
message at a time and batched, against a bare confluent-kafka at-least-once loop (poll, read
the key header, store_offsets) on the same broker, the same messages, in the same run; and
batched with the sequence guard on (--order-key/--sequence), every message its own entity.

    .venv/bin/python benchmarks/consume_throughput.py [--messages 20000] [--batch 500]
        [--single-messages 2000] [--stores redis,sqlite,postgres,dynamodb] [--json]

It starts tansu, redis-server, a throwaway PostgreSQL cluster and a moto server on free
loopback ports, as the stores chosen need them, and stops each by its PID. A store whose
server or package is missing is left out with a note. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import HOST, BenchError, free_port, stdout_console, stop_on_sigterm, stop_process

STORES = ("redis", "sqlite", "postgres", "dynamodb")
GUARD = {"order_key": "acct:{order}", "sequence": "seq"}
CONSUMER = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "500",
            "auto.offset.reset": "earliest"}  # fmt: skip
FAKE_AWS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}  # fmt: skip


def start(cmd: list[str], ready: Callable[[], bool], name: str, **popen: Any) -> Any:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **popen)
    deadline = time.monotonic() + 30
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process(proc)
            raise BenchError(f"{name} did not start")
        time.sleep(0.05)
    return proc


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    port = free_port()

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}/moto-api/", timeout=0.5):
                return True
        except OSError:
            return False

    cmd = [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)]
    proc = start(cmd, ready, "moto server", env={**os.environ, **FAKE_AWS})
    try:
        yield f"http://{HOST}:{port}"
    finally:
        stop_process(proc)


def produce(bootstrap: str, topic: str, n: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until its futures resolve
    for f in admin.create_topics([NewTopic(topic, 3, 1)]).values():
        f.result(15)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        value = b'{"order": %d, "seq": %d}' % (i, i + 1)
        p.produce(topic, value=value, headers=[("idempotency-key", b"k-%d" % i)])
        if i % 10000 == 0:
            p.poll(0)
    p.flush(60)


def bare(bootstrap: str, topic: str, n: int, batch: int) -> float:
    """Messages per second of the plain at-least-once loop, after its first batch."""
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bare-{uuid.uuid4().hex}",
                  "enable.auto.offset.store": False, **CONSUMER})  # fmt: skip
    c.subscribe([topic])
    seen, first, t0 = 0, 0, 0.0
    while seen < n:
        msgs = c.consume(num_messages=batch, timeout=1.0)
        for m in msgs:
            if m.error() is None:
                dict(m.headers() or ()).get("idempotency-key")
                c.store_offsets(message=m)
                seen += 1
        if msgs and not t0:
            first, t0 = seen, time.perf_counter()
    elapsed = time.perf_counter() - t0
    c.close()
    return (seen - first) / elapsed


def idemctl_loop(bootstrap: str, topic: str, n: int, batch: int, url: str, **more: Any) -> float:
    """Messages per second of the consume loop with a no-op handler, after its first batch;
    every message must come out processed once. ``more``: further ConsumeOptions."""
    from idemctl import open_store
    from idemctl.consume import ConsumeOptions, Consumer, adapt

    marks: list[tuple[int, float]] = []
    options = ConsumeOptions(bootstrap, [topic], f"idem-{uuid.uuid4().hex}", batch_size=batch,
                             max_messages=n, kafka_config=CONSUMER, **more)  # fmt: skip
    with open_store(url) as store:
        store.provision()

        def mark(summary: Any) -> None:
            marks.append((summary.finished, time.perf_counter()))

        summary = Consumer(store, adapt(lambda event: None), options, on_progress=mark).run()
    if summary.counts["executed"] != n:  # every key is new: each handler runs once
        raise BenchError(f"{url.partition('?')[0]}: {summary.counts} for {n} new messages")
    # From the first progress report with work done (after the group join and the first
    # batch) to the first with all of it (before the consumer closed).
    (first, t0) = next(m for m in marks if m[0] > 0)
    (last, t1) = next(m for m in marks if m[0] >= n)
    if last == first:
        raise BenchError(f"{url.partition('?')[0]}: too few messages to time (raise --messages)")
    return (last - first) / (t1 - t0)


def redis_scripts_alone(url: str, n: int, batch: int) -> float:
    """Messages per second of idemctl's Redis claim and complete scripts alone, batched over a
    bare socket (redis_claims.ScriptsAlone), with no Kafka, no handler and no client library:
    the ceiling of any consume loop that claims and completes each message on this server."""
    from redis_claims import ScriptsAlone

    scripts = ScriptsAlone(url, f"b{uuid.uuid4().hex[:8]}:", batch)
    try:
        scripts.batched()  # warm-up: connect, scripts loaded
        done, t0 = 0, time.perf_counter()
        while done < n:
            done += scripts.batched()
        return done / (time.perf_counter() - t0)
    finally:
        scripts.close()


@dataclass
class Row:
    contender: str
    messages: int
    batch: int
    rate: float


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20000, help="messages on the topic")
    parser.add_argument("--batch", type=int, default=500, help="messages per poll batch")
    parser.add_argument("--single-messages", type=int, default=2000,
                        help="messages each one-at-a-time run consumes")  # fmt: skip
    parser.add_argument("--stores", default=",".join(STORES), help="a subset of these")
    parser.add_argument("--json", action="store_true", help="the rates as JSON after the table")
    args = parser.parse_args()
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if unknown := sorted(set(stores) - set(STORES)):
        parser.error(f"--stores: unknown {', '.join(unknown)}; choose from {', '.join(STORES)}")
    stop_on_sigterm()
    from idemctl.harness.broker import local_broker  # tansu on a free port, stopped by its PID

    rows: list[Row] = []
    notes: list[str] = []
    with contextlib.ExitStack() as servers, tempfile.TemporaryDirectory() as tmp:
        bootstrap = servers.enter_context(local_broker())
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        produce(bootstrap, topic, args.messages)
        rows.append(Row("bare confluent-kafka loop", args.messages, args.batch,
                        bare(bootstrap, topic, args.messages, args.batch)))  # fmt: skip
        for store in stores:
            try:
                base = servers.enter_context(_server_for(store))
            except (BenchError, ImportError, OSError) as exc:
                notes.append(f"{store} left out: {exc}")
                continue
            single = min(args.single_messages, args.messages)
            runs: tuple[tuple[str, int, int, dict[str, Any]], ...] = (
                ("batched", args.messages, args.batch, {}),
                # As before the completer: one complete_many after all the batch's handlers.
                ("batched, completed at the batch's end", args.messages, args.batch,
                 {"complete_batch": args.batch, "complete_wait": 3600.0}),
                # Every message its own entity: the guard's own cost (ask, then advance).
                ("batched, sequence guard", args.messages, args.batch, GUARD),
                ("single", single, 1, {}),
            )  # fmt: skip
            for label, n, batch, more in runs:
                url = _store_url(store, base, tmp)
                rate = idemctl_loop(bootstrap, topic, n, batch, url, **more)
                rows.append(Row(f"idemctl, {store}, {label}", n, batch, rate))
            if store == "redis":
                rate = redis_scripts_alone(base, args.messages, args.batch)
                rows.append(Row("ceiling: Redis scripts alone, no Kafka", args.messages,
                                args.batch, rate))  # fmt: skip
    _print(rows, notes, args.json)
    return 0


@contextlib.contextmanager
def _server_for(store: str) -> Iterator[str]:
    """What a store's URLs are made from: a server's address, or nothing for SQLite."""
    if store == "redis":
        from redis_claims import own_redis_server

        with own_redis_server() as url:
            yield url
    elif store == "postgres":
        from postgres_claims import own_postgres_server

        with own_postgres_server(fsync=True) as (url, _pid):
            yield url
    elif store == "dynamodb":
        import moto  # noqa: F401 - the server below is moto's

        os.environ.update(FAKE_AWS)  # boto3 signs every request, and moto accepts any key
        with moto_server() as endpoint:
            yield endpoint
    else:
        yield ""


def _store_url(store: str, base: str, tmp: str) -> str:
    """A store of its own for every run, so each run's keys are all new."""
    name = f"b{uuid.uuid4().hex[:8]}"
    if store == "redis":
        return f"{base}?prefix={name}:"
    if store == "postgres":
        return f"{base}?schema={name}"
    if store == "dynamodb":
        return f"dynamodb://{name}?region=us-east-1&endpoint_url={base}"
    return f"sqlite:///{tmp}/{name}.db"


def _print(rows: list[Row], notes: list[str], as_json: bool) -> None:
    from rich.table import Table

    base = rows[0].rate
    table = Table(title="Consume throughput, no-op handler, 3 partitions")
    for column in ("contender", "messages", "batch", "msg/s", "x bare loop"):
        table.add_column(column, justify="left" if column == "contender" else "right")
    for row in rows:
        table.add_row(row.contender, f"{row.messages:,}", str(row.batch), f"{row.rate:,.0f}",
                      f"{row.rate / base:.3f}")  # fmt: skip
    console = stdout_console()
    console.print(table)
    rates = {row.contender: row.rate for row in rows}
    for store in STORES:
        now = rates.get(f"idemctl, {store}, batched")
        before = rates.get(f"idemctl, {store}, batched, completed at the batch's end")
        if now and before:
            console.print(
                f"{store}: each key completed as its handler returns / at the batch's end: "
                f"{now / before:.2f}x",
                markup=False,
            )
        guarded = rates.get(f"idemctl, {store}, batched, sequence guard")
        if now and guarded:
            console.print(
                f"{store}: cost per message with the sequence guard / without: "
                f"{now / guarded:.2f}x",
                markup=False,
            )
    for note in notes:
        console.print(note, markup=False)
    if as_json:
        print(json.dumps([{**vars(r), "ratio": r.rate / base} for r in rows], indent=2))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
