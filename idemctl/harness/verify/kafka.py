"""verify's own Kafka clients: the scratch topics, producing, offsets and dead letters."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from idemctl.errors import KafkaUnavailable
from idemctl.harness.verify.plan import _CLIENT_PREFIXES, Plan, Progress, _Messages


class _Kafka:
    """verify's own Kafka clients: topics, producing, reading offsets and dead letters."""

    def __init__(self, plan: Plan, topic: str) -> None:
        from confluent_kafka.admin import AdminClient

        self.plan, self.topic, self.dlq = plan, topic, f"{topic}.dlq"
        own = {k: v for k, v in plan.kafka_config.items() if k.startswith(_CLIENT_PREFIXES)}
        self.config = {"bootstrap.servers": plan.brokers, **own}
        self.admin = AdminClient({**self.config, "log_level": 0})
        self.ends: dict[int, int] = {}
        """Partition -> offset after the last message verify produced there."""

    def existing(self) -> set[str]:
        from confluent_kafka import KafkaException

        try:
            return set(self.admin.list_topics(timeout=10).topics)
        except KafkaException as exc:
            raise KafkaUnavailable(
                f"cannot reach the brokers at {self.plan.brokers}: {exc}"
            ) from None

    def create(self) -> None:
        from confluent_kafka.cimpl import NewTopic

        new = [NewTopic(self.topic, self.plan.partitions, 1), NewTopic(self.dlq, 1, 1)]
        for future in self.admin.create_topics(new, operation_timeout=30).values():
            future.result(60)

    def remove(self, group: str) -> dict[str, str]:
        """Delete the run's topics and group; what is still listed after a minute of
        trying again, with why (a slow broker, or a client that wrote to it once more)."""
        left, why = {self.topic, self.dlq}, {}
        deadline = time.monotonic() + 60
        while left:
            deleting = self.admin.delete_topics(sorted(left), operation_timeout=30)
            for name, future in deleting.items():
                try:
                    future.result(60)
                except Exception as exc:  # gone already, or said below
                    why[name] = str(exc)
            left &= self.existing()
            if left and time.monotonic() > deadline:
                break
            if left:
                time.sleep(0.5)
        for future in self.admin.delete_consumer_groups([group]).values():
            with suppress(Exception):  # never formed, or the broker keeps no groups
                future.result(30)
        return {name: why.get(name, "still listed after its deletion") for name in left}

    def produce(self, messages: _Messages, progress: Progress, stop: threading.Event) -> None:
        from confluent_kafka import Producer

        producer = Producer({**self.config, "enable.idempotence": True, "linger.ms": 5})

        failed: list[Any] = []

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                failed.append(err)
                return
            self.ends[msg.partition()] = max(self.ends.get(msg.partition(), 0), msg.offset() + 1)
            progress.produced += 1

        started = time.monotonic()
        for i, (key, elsewhere) in enumerate(messages.order):
            if stop.is_set():
                break
            if self.plan.rate:
                time.sleep(max(0.0, started + i / self.plan.rate - time.monotonic()))
            # every copy of a key alike, as a producer's retry sends it
            body: dict[str, Any] = {"key": key, "cents": 100}
            if key in messages.poison:
                body["poison"] = True
            if key in messages.dropped:
                body["drop"] = True
            while True:
                try:
                    producer.produce(
                        self.topic,
                        key=(key + "-elsewhere" if elsewhere else key).encode(),
                        value=json.dumps(body).encode(),
                        headers=[("idempotency-key", key.encode())],
                        on_delivery=delivered,
                    )
                    break
                except BufferError:  # the local queue is full: let it drain
                    producer.poll(0.1)
            producer.poll(0)
        if stop.is_set():  # interrupted: what is queued would land after the clean-up
            producer.purge()
            producer.flush(5)
            return
        if producer.flush(60) or failed:
            why = f": {failed[0]}" if failed else ""
            raise KafkaUnavailable(
                f"the brokers at {self.plan.brokers} did not take every message{why}"
            )

    @contextmanager
    def offsets_reader(self, group: str) -> Iterator[Callable[[], int]]:
        """A function that gives the messages produced and not yet committed by ``group``."""
        from confluent_kafka import Consumer, TopicPartition

        reader = Consumer({**self.config, "group.id": group, "enable.auto.commit": False})
        try:

            def lag() -> int:
                tps = [TopicPartition(self.topic, p) for p in self.ends]
                done = {tp.partition: tp.offset for tp in reader.committed(tps, timeout=10)}
                return sum(end - max(done.get(p, 0), 0) for p, end in self.ends.items())

            yield lag
        finally:
            reader.close()

    def dead_letter_keys(self, expect: int, timeout: float = 30.0) -> list[str]:
        """The idempotency keys of the dead letters: until ``expect`` are read and nothing
        more comes for a second, or ``timeout``."""
        from confluent_kafka import Consumer, TopicPartition

        reader = Consumer(
            {**self.config, "group.id": f"{self.topic}-reader", "enable.auto.commit": False}
        )
        reader.assign([TopicPartition(self.dlq, 0, 0)])
        keys: list[str] = []
        deadline = time.monotonic() + timeout
        quiet_since = time.monotonic()
        try:
            while time.monotonic() < deadline:
                batch = [m for m in reader.consume(500, timeout=0.2) if m.error() is None]
                for m in batch:
                    key = dict(m.headers() or []).get("idempotency-key")
                    keys.append(key.decode() if isinstance(key, bytes) else str(key))
                if batch:
                    quiet_since = time.monotonic()
                elif len(keys) >= expect and time.monotonic() - quiet_since > 1.0:
                    break
        finally:
            reader.close()
        return keys
