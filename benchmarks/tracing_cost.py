"""What tracing costs the consume loop: client CPU per message of `idemctl consume`'s loop
(`idemctl.consume.Consumer`, no-op handler, batches of 500, one Redis server), fed prebuilt
messages instead of a broker so that only the loop and the store are measured, with
OpenTelemetry (a) not installed, (b) installed with no tracer provider set, (c) the SDK with
a batch span processor and an exporter that drops the spans. Each in a process of its own
(a process sets its provider once), alternated; the best of --reps kept.

    .venv/bin/python benchmarks/tracing_cost.py [--messages 30000] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODES = ("absent", "no provider", "sdk")


class FakeKafka:
    """The Kafka consumer's calls the loop makes, over prebuilt messages."""

    def __init__(self, messages: list[Any]) -> None:
        self.messages, self.at = messages, 0

    def subscribe(self, topics: list[str], on_assign: Any, **_: Any) -> None:
        from confluent_kafka import TopicPartition

        on_assign(self, [TopicPartition("t", p) for p in range(3)])

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        out = self.messages[self.at : self.at + num_messages]
        self.at += len(out)
        return out

    def store_offsets(self, offsets: Any) -> None: ...
    def pause(self, tps: Any) -> None: ...
    def resume(self, tps: Any) -> None: ...
    def commit(self, asynchronous: bool = False) -> None: ...
    def close(self) -> None: ...
    def position(self, tps: Any) -> Any:
        return tps

    def committed(self, tps: Any, timeout: float | None = None) -> Any:
        return tps

    def get_watermark_offsets(self, tp: Any, cached: bool = True) -> None:
        return None


def measure(mode: str, url: str, n: int) -> float:
    """Client CPU µs a message of one run in this process, set up as ``mode`` says."""
    if mode == "absent":
        sys.modules["opentelemetry"] = None  # type: ignore[assignment] # as if not installed
    elif mode == "sdk":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        class Drop(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Drop()))
        trace.set_tracer_provider(provider)
    from confluent_kafka import Message

    from idemctl import open_store
    from idemctl.consume import ConsumeOptions, Consumer, adapt

    messages = [
        Message(topic="t", partition=i % 3, offset=i // 3, key=None,
                value=b'{"order": %d, "amount": 100}' % i,
                headers=[("idempotency-key", b"k-%d" % i)], timestamp=(1, 1700000000000))
        for i in range(n)
    ]  # fmt: skip
    options = ConsumeOptions("unused:9092", ["t"], "g", batch_size=500, max_messages=n)
    with open_store(url) as store:
        consumer = Consumer(store, adapt(lambda event: None), options)
        consumer._kafka = FakeKafka(messages)
        consumer._dlq = type("NoDlq", (), {"close": lambda self: None})()
        started = time.process_time()
        summary = consumer.run()
        cpu = time.process_time() - started
    if summary.counts["executed"] != n:
        raise SystemExit(f"{mode}: {summary.counts} for {n} new messages")
    return cpu / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=30000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:  # one measurement, in a process of its own
        print(json.dumps(measure(args.mode, args.url, args.messages)))
        return 0
    sys.path.insert(0, str(HERE))
    from redis_claims import own_redis_server

    best: dict[str, float] = {}
    with own_redis_server() as base:
        for _ in range(args.reps):
            for mode in MODES:
                url = f"{base}?prefix=t{uuid.uuid4().hex[:8]}:"
                done = subprocess.run(
                    [sys.executable, __file__, "--mode", mode, "--url", url,
                     "--messages", str(args.messages)],
                    capture_output=True, text=True, check=True,
                    env={**os.environ, "PYTHONPATH": str(HERE.parent)},
                )  # fmt: skip
                cpu = float(done.stdout.strip().splitlines()[-1])
                best[mode] = min(best.get(mode, cpu), cpu)
    print(f"consume loop, client CPU a message (best of {args.reps}, {args.messages:,} messages):")
    for mode in MODES:
        ratio = best[mode] / best["absent"]
        print(f"  OpenTelemetry {mode:12s} {best[mode]:6.1f} µs   {ratio:.2f}x not installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
