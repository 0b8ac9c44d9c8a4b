"""consume with the sequence guard (--order-key/--sequence), against the real broker and
real stores: events of an entity that arrive out of order never apply an older sequence
after a newer one; stale events are skipped or dead-lettered; --contiguous waits for a
missing predecessor, up to --gap-timeout."""

from __future__ import annotations

import json
import random
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from idemctl import open_store
from idemctl.consume import Consumer, Event, adapt
from idemctl.kafka.options import Summary
from idemctl.runner import Context
from tests.consume.test_consume import committed, names, options, produce, read_all
from tests.polling import wait_until
from tests.servers import KafkaBroker

ORDER = {"order_key": "account:{account}", "sequence": "seq"}


def to_partition(broker: KafkaBroker, topic: str, partition: int, m: dict[str, Any]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap})
    headers = [("idempotency-key", m["idem"].encode())]
    producer.produce(topic, json.dumps(m["value"]).encode(), partition=partition, headers=headers)
    assert producer.flush(30) == 0


def event(account: int, seq: int, kkey: str | None = None) -> dict[str, Any]:
    key = f"ev-{account}-{seq}"
    return {
        "value": {"account": account, "seq": seq, "balance": seq * 100},
        "idem": key,
        "kkey": (kkey or key).encode(),
    }


def test_entities_apply_in_sequence_order_across_partitions_and_duplicates(
    kafka_broker: KafkaBroker, store_url: str
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=3)
    rng = random.Random(7)
    events = [event(a, s) for a in range(40) for s in range(1, 5)]
    sent = events + rng.sample(events, 40)  # duplicates, each under its own Kafka key
    rng.shuffle(sent)
    produce(kafka_broker, topic, sent)
    applied: dict[int, list[int]] = defaultdict(list)
    lock = threading.Lock()

    def apply(ev: Event, ctx: Context) -> None:
        body = ev.json()
        assert ctx.sequence == body["seq"]
        with lock:
            applied[body["account"]].append(body["seq"])

    with open_store(store_url) as store:
        summary = Consumer(
            store, adapt(apply), options(kafka_broker, topic, group, batch_size=50, **ORDER)
        ).run()
        entity = store.get_entity("account:3")
        assert entity is not None and entity.sequence == 4 and entity.key == "ev-3-4"
    for account, seqs in applied.items():
        assert seqs == sorted(set(seqs)), (account, seqs)
    assert {a: seqs[-1] for a, seqs in applied.items()} == {a: 4 for a in range(40)}
    c = summary.counts
    assert c["executed"] == sum(len(s) for s in applied.values())
    assert c["executed"] + c["stale"] + c["replayed"] == len(sent)
    assert c["stale"] == 160 - c["executed"], "every distinct event ran once or was stale"
    assert summary.finished == len(sent)
    assert sum(committed(kafka_broker, topic, group, 3).values()) == len(sent)


def test_stale_events_are_dead_lettered_with_on_stale_dlq(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, [event(1, 5), event(1, 3), event(1, 6)])
    applied: list[int] = []

    def apply(ev: Event, ctx: Context) -> None:
        applied.append(ev.json()["seq"])

    with open_store(f"sqlite:///{tmp_path}/o.db") as store:
        summary = Consumer(
            store, adapt(apply), options(kafka_broker, topic, group, on_stale="dlq", **ORDER)
        ).run()
    assert applied == [5, 6]
    assert summary.counts["stale"] == 1 and summary.dead_letters["stale event"] == 1
    assert summary.finished == 3
    (dead,) = read_all(kafka_broker, f"{topic}.dlq", expect=1)
    headers = dict(dead.headers())
    assert b"stale event" in headers["idemctl-dlt-reason"]
    assert b"applied sequence 5; this event is 3" in headers["kafka_dlt-exception-message"]
    assert committed(kafka_broker, topic, group, 1) == {0: 3}


def _run_until(consumer: Consumer, done: Any, timeout: float = 60) -> Summary:
    """Run ``consumer`` in a thread until ``done(summary)``; then stop it."""
    out: list[Summary] = []
    thread = threading.Thread(target=lambda: out.append(consumer.run()))
    thread.start()
    try:
        wait_until(lambda: done(consumer.summary) or not thread.is_alive(), "done", timeout)
    finally:
        consumer.stop()
        thread.join(30)
    assert out, "the consumer did not stop"
    return out[0]


def test_contiguous_holds_an_event_until_its_predecessor_applies(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=2)
    to_partition(kafka_broker, topic, 0, event(1, 2))
    applied: list[int] = []

    def apply(ev: Event, ctx: Context) -> None:
        applied.append(ev.json()["seq"])

    with open_store(f"sqlite:///{tmp_path}/o.db") as store:
        opts = options(
            kafka_broker,
            topic,
            group,
            contiguous=True,
            gap_timeout=60.0,
            exit_when_idle=None,
            **ORDER,
        )
        consumer = Consumer(store, adapt(apply), opts)
        waiting = threading.Event()

        def produce_first_once_held() -> None:
            try:
                held = lambda: consumer.summary.counts["gap_wait"]  # noqa: E731
                wait_until(held, "sequence 2 held for its predecessor", timeout=30)
                waiting.set()
            finally:
                # Sequence 1 arrives late, in the other partition.
                to_partition(kafka_broker, topic, 1, event(1, 1))

        helper = threading.Thread(target=produce_first_once_held)
        helper.start()
        summary = _run_until(consumer, lambda s: s.counts["executed"] == 2)
        helper.join(30)
    assert waiting.is_set() and summary.counts["gap_wait"] >= 1
    assert applied == [1, 2]
    assert summary.counts["gaps"] == 0 and summary.counts["executed"] == 2


def test_contiguous_applies_after_the_gap_timeout_and_counts_a_gap(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, [event(1, 2), event(1, 3)])
    applied: list[int] = []

    def apply(ev: Event, ctx: Context) -> None:
        applied.append(ev.json()["seq"])

    with open_store(f"sqlite:///{tmp_path}/o.db") as store:
        opts = options(
            kafka_broker,
            topic,
            group,
            contiguous=True,
            gap_timeout=1.0,
            exit_when_idle=None,
            **ORDER,
        )
        summary = _run_until(
            Consumer(store, adapt(apply), opts), lambda s: s.counts["executed"] == 2
        )
    # 1 never came: 2 waited out the timeout, then 3 followed it at once.
    assert applied == [2, 3]
    assert summary.counts["gaps"] == 1 and summary.counts["gap_wait"] >= 1
    assert committed(kafka_broker, topic, group, 1) == {0: 2}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"order_key": "account:{account}"}, "go together"),
        ({"contiguous": True}, "--contiguous needs"),
        ({"order_key": "account", "sequence": "seq"}, "names no field"),
        ({**ORDER, "on_stale": "drop"}, "--on-stale"),
    ],
)
def test_ordering_options_are_checked(
    kafka_broker: KafkaBroker, flags: dict[str, Any], message: str
) -> None:
    from idemctl.errors import ConfigError

    topic, group = names()
    with pytest.raises(ConfigError, match=message):
        options(kafka_broker, topic, group, **flags)
