"""Dead letters are the loop's, without a broker (``consume.mailroom``): the stand-in Kafka
client of test_spares_unit, and a stand-in dead-letter producer whose answers the test
gives. A lane never waits on the dead-letter topic: while a letter is unanswered its
partition waits at it and the other partitions go on; once the broker took it, the rest
of its partition goes on without being fetched again; a refused one pauses its partition
and is written again."""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

from confluent_kafka import Message

from idemctl import open_store
from idemctl.consume import ConsumeOptions, Consumer, adapt
from idemctl.consume.deadletter import Letter
from idemctl.consume.event import Event
from tests.consume.test_spares_unit import Broker
from tests.polling import wait_until


class Fetches(Broker):
    """The stand-in Kafka client, counting how often each message was fetched."""

    def __init__(self, keys: dict[int, list[str]]) -> None:
        super().__init__(keys)
        self.fetched: Counter[tuple[int, int]] = Counter()

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        out = super().consume(num_messages, timeout)
        self.fetched.update((m.partition(), m.offset()) for m in out)
        return out


class Letters:
    """The dead-letter producer's calls the loop makes; each letter is answered when the
    test says (``answer``)."""

    def __init__(self) -> None:
        self.posted: list[Letter] = []
        self.threads: set[str] = set()

    def topic(self, msg: Any) -> str:
        return f"{msg.topic()}.dlq"

    def post(self, msg: Any, reason: str, detail: str, exc: Any, span: Any = None) -> Letter:
        self.threads.add(threading.current_thread().name)
        letter = Letter(msg, self.topic(msg), [])
        self.posted.append(letter)
        return letter

    def answer(self, refusal: str | None = None) -> None:
        letter = self.posted[-1]
        letter.refusal, letter.answered = refusal, True

    def poll(self) -> None: ...
    def close(self) -> None: ...


def _keyless(broker: Broker, partition: int, offset: int) -> None:
    """The message at ``offset`` loses its key header: it can only be dead-lettered."""
    old = broker.logs[partition][offset]
    broker.logs[partition][offset] = Message(
        topic="t", partition=partition, offset=offset, key=None, value=old.value(),
        headers=[], timestamp=(1, 0),
    )  # fmt: skip


def _start(keys: dict[int, list[str]]) -> tuple[Any, ...]:
    ran: list[str] = []

    def handle(event: Event) -> None:
        ran.append(json.loads(event.value or b"{}")["key"])

    broker, letters = Fetches(keys), Letters()
    _keyless(broker, 0, 0)
    store = open_store("memory://")
    total = sum(len(ks) for ks in keys.values())
    o = ConsumeOptions("unused:9092", ["t"], "g", batch_size=100, max_messages=total,
                       backoff=0.05)  # fmt: skip
    consumer = Consumer(store, adapt(handle), o)
    consumer._kafka = broker
    consumer._mail.dlq = letters  # type: ignore[assignment]
    summary: list[Any] = []
    thread = threading.Thread(target=lambda: summary.append(consumer.run()), daemon=True)
    thread.start()
    return ran, broker, letters, consumer, thread, summary, store


KEYS = {0: ["bad", "a-1", "a-2"], 1: [f"b-{i}" for i in range(30)]}


def test_the_other_partitions_go_on_while_a_dead_letter_waits_for_the_broker() -> None:
    ran, broker, letters, _consumer, thread, summary, store = _start(KEYS)
    try:
        wait_until(lambda: len(letters.posted) == 1, "the dead letter posted")
        wait_until(lambda: set(KEYS[1]) <= set(ran), "partition 1 went on meanwhile",
                   detail=lambda: f"ran: {ran}")  # fmt: skip
        assert "a-1" not in ran and "a-2" not in ran  # its partition waits at the letter
        assert letters.threads == {thread.name}  # written by the loop, never by a lane
        letters.answer()
        thread.join(30)
        assert not thread.is_alive()
    finally:
        store.close()
    assert Counter(ran) == Counter(KEYS[0][1:] + KEYS[1])  # each once
    assert summary[0].counts["dead_lettered"] == 1
    assert broker.stored[0][-1] == 3
    # Once the letter was taken, the rest of partition 0 went on as fetched: not again.
    assert all(n == 1 for (p, _), n in broker.fetched.items() if p == 0), broker.fetched


def test_a_refused_dead_letter_pauses_its_partition_and_is_written_again() -> None:
    ran, broker, letters, consumer, thread, summary, store = _start(KEYS)
    try:
        wait_until(lambda: len(letters.posted) == 1, "the dead letter posted")
        letters.answer("could not dead-letter to t.dlq: the broker said no")
        wait_until(lambda: len(letters.posted) == 2, "the dead letter written again",
                   detail=lambda: f"{consumer.summary.counts}")  # fmt: skip
        assert "a-1" not in ran  # nothing past it meanwhile
        letters.answer()
        thread.join(30)
        assert not thread.is_alive()
    finally:
        store.close()
    counts = summary[0].counts
    assert (counts["dead_lettered"], counts["dead_letter_refused"]) == (1, 1), counts
    assert Counter(ran) == Counter(KEYS[0][1:] + KEYS[1])
    assert broker.fetched[(0, 0)] == 2  # sought back to it after the refusal
    assert broker.stored[0][-1] == 3
