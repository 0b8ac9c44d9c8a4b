"""Audit rate: messages `idemctl audit` judges a second on Redis and PostgreSQL, against
the store's batched claim rate (claim_many + complete_many, 500 keys a round trip) measured
on the same keys in the same run, and against reading the same messages from Kafka alone.

    .venv/bin/python benchmarks/audit_rate.py [--messages 50000] [--partitions 4]
        [--batch 500] [--stores redis,postgres] [--json]

It starts tansu, redis-server and a throwaway PostgreSQL cluster on free loopback ports
and stops each by its PID. The topic's messages each carry their own key; the batched
claims complete every key (the baseline), the group's offsets are committed at the end,
and audit reads them all back (`--last` = every message). Target: audit >= the batched
claim rate (ratio >= 1.0). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BenchError, stdout_console, stop_on_sigterm
from ops_scale import server_for, store_url  # the same throwaway servers and namespaces

STORES = ("redis", "postgres")
NAMES = {"redis": "Redis", "postgres": "PostgreSQL"}


def produce(bootstrap: str, topic: str, n: int, partitions: int) -> dict[int, int]:
    """``n`` keyed messages; the offset after the last one of each partition."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(30)
    ends: dict[int, int] = {}

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            raise BenchError(f"produce: {err}")
        ends[msg.partition()] = max(ends.get(msg.partition(), 0), msg.offset() + 1)

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        while True:
            try:
                producer.produce(topic, value=json.dumps({"order": i}).encode(),
                                 key=str(i).encode(), headers=[("idempotency-key", f"k-{i}")],
                                 on_delivery=delivered)  # fmt: skip
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(60):
        raise BenchError("produce: not every message delivered in 60 s")
    return ends


def commit(bootstrap: str, topic: str, group: str, ends: dict[int, int]) -> None:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, p, o) for p, o in ends.items()],
                 asynchronous=False)  # fmt: skip
    finally:
        c.close()


def claim_rate(url: str, n: int, batch: int) -> float:
    """Keys a second claimed and completed by claim_many + complete_many, ``batch`` a call."""
    from idemctl import ClaimRequest, Completion, open_store
    from idemctl.model import Acquired

    with open_store(url) as store:
        store.provision()
        started = time.perf_counter()
        for start in range(0, n, batch):
            keys = [f"k-{i}" for i in range(start, min(n, start + batch))]
            outcomes = store.claim_many([ClaimRequest(k) for k in keys], lease=60)
            done = [Completion(o.key, o.owner, o.fencing_token, None)
                    for o in outcomes if isinstance(o, Acquired)]  # fmt: skip
            if len(done) != len(keys):
                raise BenchError(f"{len(keys) - len(done)} key(s) not acquired")
            store.complete_many(done)
        return n / (time.perf_counter() - started)


def audit_rate(url: str, bootstrap: str, topic: str, group: str, n: int, batch: int) -> float:
    from idemctl import open_store
    from idemctl.audit import AuditOptions, audit

    options = AuditOptions(bootstrap, topic, group, last=n, batch=batch)
    with open_store(url) as store:
        started = time.perf_counter()
        report = audit(store, options)
        seconds = time.perf_counter() - started
    totals = report.totals()
    if report.audited != n or totals["done"] != n:
        raise BenchError(f"audit judged {report.audited} of {n}, done {totals['done']}")
    return n / seconds


def read_rate(bootstrap: str, topic: str, group: str, n: int, batch: int) -> float:
    """Kafka alone: audit's reader over the same spans, nothing judged."""
    from idemctl.audit import AuditOptions
    from idemctl.audit.kafka import Kafka

    kafka = Kafka(AuditOptions(bootstrap, topic, group, last=n, batch=batch))
    started = time.perf_counter()
    read = sum(len(b) for b in kafka.read(kafka.spans()))
    if read != n:
        raise BenchError(f"read {read} of {n} messages")
    return n / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch", type=int, default=500, help="keys per store round trip")
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if unknown := sorted(set(stores) - set(STORES)):
        parser.error(f"--stores: unknown {', '.join(unknown)}; choose from {', '.join(STORES)}")
    stop_on_sigterm()
    from idemctl.harness.broker import local_broker

    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    with contextlib.ExitStack() as servers, tempfile.TemporaryDirectory() as tmp:
        bootstrap = servers.enter_context(local_broker())
        topic, group = f"bench-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
        ends = produce(bootstrap, topic, args.messages, args.partitions)
        commit(bootstrap, topic, group, ends)
        kafka_alone = read_rate(bootstrap, topic, group, args.messages, args.batch)
        for store in stores:
            try:
                base = servers.enter_context(server_for(store, tmp))
            except (BenchError, ImportError, OSError) as exc:
                notes.append(f"{store} left out: {exc}")
                continue
            url = store_url(store, base)
            claims = claim_rate(url, args.messages, args.batch)
            audited = audit_rate(url, bootstrap, topic, group, args.messages, args.batch)
            rows.append({"store": store, "messages": args.messages, "batch": args.batch,
                         "claim_batched_per_s": round(claims), "audit_per_s": round(audited),
                         "kafka_read_per_s": round(kafka_alone),
                         "ratio": round(audited / claims, 2)})  # fmt: skip
    _print(rows, notes, args.json)
    return 0 if all(r["ratio"] >= 1.0 for r in rows) else 1


def _print(rows: list[dict[str, Any]], notes: list[str], as_json: bool) -> None:
    from rich.table import Table

    table = Table(title="idemctl audit: messages judged a second (same run, same keys)")
    for name in ("store", "claim+complete, batched", "audit", "ratio (target >= 1.0)",
                 "Kafka read alone"):  # fmt: skip
        table.add_column(name, justify="left" if name == "store" else "right")
    for r in rows:
        table.add_row(NAMES[r["store"]], f"{r['claim_batched_per_s']:,}/s",
                      f"{r['audit_per_s']:,}/s", f"{r['ratio']:.2f}",
                      f"{r['kafka_read_per_s']:,}/s")  # fmt: skip
    console = stdout_console()
    console.print(table)
    for note in notes:
        console.print(note)
    if as_json:
        print(json.dumps(rows))


if __name__ == "__main__":
    sys.exit(main())
