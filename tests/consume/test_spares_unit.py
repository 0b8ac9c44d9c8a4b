"""Spare lanes without a broker: the consume loop fed prebuilt messages (a stand-in for the
Kafka client that records the offsets stored), on the memory store. A handler held on an
event stands for one that hangs: once it is overdue, the other partitions of its round go
on in a spare lane; its own partition waits, in order; nothing runs twice, no stored
offset goes back, and the spare lane is given back once the handler returns."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, defaultdict
from typing import Any

from confluent_kafka import Message, TopicPartition

from idemctl import open_store
from idemctl.consume import ConsumeOptions, Consumer, adapt
from idemctl.consume.event import Event
from tests.polling import wait_until


class Broker:
    """The Kafka consumer's calls the loop makes, over prebuilt messages per partition,
    honouring pause, resume and seek, and recording the offsets stored."""

    def __init__(self, keys: dict[int, list[str]]) -> None:
        self.logs = {
            p: [
                Message(topic="t", partition=p, offset=i, key=None,
                        value=json.dumps({"key": k}).encode(),
                        headers=[("idempotency-key", k.encode())], timestamp=(1, 0))
                for i, k in enumerate(ks)
            ]
            for p, ks in keys.items()
        }  # fmt: skip
        self.at = {p: 0 for p in keys}
        self.paused: set[int] = set()
        self.stored: dict[int, list[int]] = defaultdict(list)
        self.lock = threading.Lock()

    def subscribe(self, topics: list[str], on_assign: Any, **_: Any) -> None:
        on_assign(self, [TopicPartition("t", p) for p in self.logs])

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        with self.lock:
            out: list[Any] = []
            for p, log in self.logs.items():
                if p not in self.paused:
                    take = log[self.at[p] : self.at[p] + num_messages - len(out)]
                    self.at[p] += len(take)
                    out += take
        if not out:
            time.sleep(min(timeout, 0.02))
        return out

    def pause(self, tps: list[Any]) -> None:
        self.paused |= {tp.partition for tp in tps}

    def resume(self, tps: list[Any]) -> None:
        self.paused -= {tp.partition for tp in tps}

    def seek(self, tp: Any) -> None:
        with self.lock:
            self.at[tp.partition] = tp.offset

    def position(self, tps: list[Any]) -> list[Any]:
        return [TopicPartition(tp.topic, tp.partition, self.at[tp.partition]) for tp in tps]

    def committed(self, tps: list[Any], timeout: float = 0) -> list[Any]:
        return [TopicPartition(tp.topic, tp.partition, -1001) for tp in tps]

    def get_watermark_offsets(self, tp: Any, cached: bool = True) -> tuple[int, int]:
        return 0, len(self.logs[tp.partition])

    def store_offsets(self, offsets: list[Any]) -> None:
        for tp in offsets:
            self.stored[tp.partition].append(tp.offset)

    def commit(self, asynchronous: bool = False) -> None: ...
    def close(self) -> None: ...


def _run(keys: dict[int, list[str]], hang: str, until: set[str] | None = None) -> tuple[Any, ...]:
    """Consume ``keys`` with ``hang``'s handler held until ``until`` ran (default: every
    other partition); what ran, what had run then, the broker, the consumer, its summary."""
    ran: list[str] = []
    release = threading.Event()
    others = until or {k for p, ks in keys.items() if hang not in ks for k in ks}

    def handle(event: Event) -> None:
        key = json.loads(event.value or b"{}")["key"]
        if key == hang:
            release.wait(60)
        ran.append(key)

    broker = Broker(keys)
    total = sum(len(ks) for ks in keys.values())
    with open_store("memory://") as store:
        o = ConsumeOptions("unused:9092", ["t"], "g", batch_size=100, max_messages=total,
                           stall_timeout=0.2, backoff=0.05)  # fmt: skip
        consumer = Consumer(store, adapt(handle), o)
        consumer._kafka = broker
        consumer._mail.dlq = type("NoDlq", (), {"close": lambda self: None})()  # type: ignore[assignment]
        summary: list[Any] = []
        thread = threading.Thread(target=lambda: summary.append(consumer.run()), daemon=True)
        thread.start()
        wait_until(lambda: others <= set(ran) or not thread.is_alive(),
                   "the other partitions went on", 30, detail=lambda: f"ran: {ran}")  # fmt: skip
        assert others <= set(ran), summary  # not: the consumer stopped
        while_stuck = list(ran), len(consumer._lanes), consumer.stalled
        release.set()
        thread.join(30)
        assert not thread.is_alive()
        return ran, while_stuck, broker, consumer, summary[0]


def test_the_other_partitions_go_on_in_a_spare_lane_and_the_stuck_one_waits_in_order() -> None:
    keys = {0: ["a-0", "stuck", "a-1", "a-2"], 1: [f"b-{i}" for i in range(30)],
            2: [f"c-{i}" for i in range(30)]}  # fmt: skip
    ran, (before, lanes, stalled), broker, consumer, summary = _run(keys, "stuck")
    assert "a-1" not in before and "a-2" not in before  # behind the stuck key, in order
    assert lanes == 2  # the --concurrency lane, and one spare beside the stuck handler
    assert any("'stuck'" in said for said in stalled)
    assert Counter(ran) == Counter(k for ks in keys.values() for k in ks)  # each once
    assert ran.index("stuck") < ran.index("a-1") < ran.index("a-2")
    assert summary.counts["executed"] == sum(len(ks) for ks in keys.values())
    assert len(consumer._lanes) == 1  # the spare given back
    for p, offsets in broker.stored.items():
        assert offsets == sorted(offsets), (p, offsets)  # never back
    assert {p: max(o) for p, o in broker.stored.items()} == {p: len(k) for p, k in keys.items()}


def test_a_key_in_the_stuck_partition_and_a_moved_one_runs_once() -> None:
    """The same key after the stuck one in its partition and in a moved partition: the
    moved partition's lane replays or waits for it; it is never run by both."""
    keys = {0: ["stuck", "dup"], 1: ["b-0", "dup", "b-1"]}
    ran, _, _, _, summary = _run(keys, "stuck", until={"b-0"})
    assert Counter(ran)["dup"] == 1, ran
    assert Counter(ran)["stuck"] == 1
    assert summary.counts["executed"] == 4
