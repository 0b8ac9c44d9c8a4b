"""Consume throughput: `idemctl consume`'s loop with a no-op handler on each store, against
a bare confluent-kafka at-least-once loop (poll, read the key header, store_offsets) on the
same broker, the same messages, in the same run. Prints messages per second and the ratio
to the bare loop; the broker (tansu) and redis-server are started here on free loopback
ports and stopped by PID.

    .venv/bin/python benchmarks/consume_throughput.py --messages 20000
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import HOST, free_port, stop_process


def start(cmd: list[str], ready: Callable[[], bool], name: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process(proc)
            raise SystemExit(f"{name} did not start")
        time.sleep(0.05)
    return proc


def redis() -> tuple[subprocess.Popen[bytes], int]:
    import redis as redis_py

    port = free_port()

    def ready() -> bool:
        try:
            return bool(redis_py.Redis(host=HOST, port=port, socket_timeout=0.5).ping())
        except redis_py.RedisError:
            return False

    cmd = ["redis-server", "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no"]
    return start(cmd, ready, "redis-server"), port


def produce(bootstrap: str, topic: str, n: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until its futures resolve
    for f in admin.create_topics([NewTopic(topic, 3, 1)]).values():
        f.result(15)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, value=b'{"order": %d}' % i, headers=[("idempotency-key", b"k-%d" % i)])
        if i % 10000 == 0:
            p.poll(0)
    p.flush(60)


CONSUMER = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "500",
            "auto.offset.reset": "earliest"}  # fmt: skip


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


def idemctl_loop(bootstrap: str, topic: str, n: int, batch: int, url: str) -> float:
    from idemctl import open_store
    from idemctl.consume import ConsumeOptions, Consumer, adapt

    marks: list[tuple[int, float]] = []
    options = ConsumeOptions(bootstrap, [topic], f"idem-{uuid.uuid4().hex}", batch_size=batch,
                             max_messages=n, kafka_config=CONSUMER)  # fmt: skip
    with open_store(url) as store:

        def mark(summary: Any) -> None:
            marks.append((summary.finished, time.perf_counter()))

        Consumer(store, adapt(lambda event: None), options, on_progress=mark).run()
    (first, t0), (last, t1) = marks[0], marks[-1]
    return (last - first) / (t1 - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    from idemctl.demo import local_broker  # tansu on a free port, stopped by its PID

    server, port = redis()
    try:
        with local_broker() as bootstrap, tempfile.TemporaryDirectory() as tmp:
            topic = f"bench-{uuid.uuid4().hex[:8]}"
            produce(bootstrap, topic, args.messages)
            rates: dict[str, float] = {
                "bare confluent-kafka loop": bare(bootstrap, topic, args.messages, args.batch)
            }
            contenders: dict[str, str] = {
                "idemctl, Redis, batched": f"redis://{HOST}:{port}/0?prefix=b{uuid.uuid4().hex[:6]}:",
                "idemctl, SQLite, batched": f"sqlite:///{tmp}/bench.db",
            }
            for name, url in contenders.items():
                rates[name] = idemctl_loop(bootstrap, topic, args.messages, args.batch, url)
    finally:
        stop_process(server)
    base = rates["bare confluent-kafka loop"]
    print(f"{args.messages} messages, batches of {args.batch}, 3 partitions, no-op handler")
    print(f"{'contender':<28} {'msg/s':>10} {'x bare':>8}")
    for name, rate in rates.items():
        print(f"{name:<28} {rate:>10.0f} {rate / base:>8.2f}")


if __name__ == "__main__":
    main()
