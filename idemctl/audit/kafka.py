"""audit's view of Kafka: the group's committed offsets, each partition's range, and the
messages in it, read with ``assign``. The group is asked for its offsets (OffsetFetch) by
a client that never joins it or commits; the messages are read by another, under a group
id of its own that it never uses either."""

from __future__ import annotations

import logging
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from idemctl.audit.model import AuditOptions
from idemctl.errors import ConfigError, KafkaUnavailable

kafka_log = logging.getLogger("idemctl.audit.kafka")

_DLT_TOPIC, _DLT_PARTITION, _DLT_OFFSET = (
    "kafka_dlt-original-topic",
    "kafka_dlt-original-partition",
    "kafka_dlt-original-offset",
)


TO_THE_END = sys.maxsize
"""A stop past any offset: read until the partition's end (librdkafka's EOF)."""


class Span:
    """One partition's committed offset and the offsets audit reads there: from ``start``
    up to ``stop``, or to the partition's end, whichever comes first. The high watermark is
    only reported (pending): reading stops at the end librdkafka finds, not at it."""

    def __init__(self, partition: int, low: int, high: int, committed: int | None) -> None:
        self.partition, self.low, self.high, self.committed = partition, low, high, committed
        self.start = self.stop = low if committed is None else committed

    @property
    def wanted(self) -> int:
        """Messages to read at most (a compacted partition has fewer)."""
        return max(0, min(self.stop, max(self.high, self.committed or 0)) - self.start)


class Kafka:
    def __init__(self, options: AuditOptions) -> None:
        self.options = options
        self.config: dict[str, Any] = {
            "bootstrap.servers": options.brokers,
            **options.kafka_config,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }

    def _consumer(self, group: str) -> Any:
        from confluent_kafka import Consumer, KafkaException

        try:
            return Consumer({**self.config, "group.id": group}, logger=kafka_log)
        except (KafkaException, ValueError) as exc:
            raise ConfigError(f"Kafka client settings: {exc}") from None

    def spans(self) -> list[Span]:
        """Each partition's range and the group's committed offset; the start of what is
        audited (``last`` below the committed offset, or from ``since``). ConfigError when
        the group has committed on none of the topic's partitions: there is nothing to judge,
        and a misspelt group must not pass as one that lost nothing."""
        from confluent_kafka import KafkaException, TopicPartition

        o = self.options
        c = self._consumer(o.group)  # asks for the group's offsets only: never joins
        try:
            meta = c.list_topics(o.topic, timeout=o.timeout)
            topic = meta.topics.get(o.topic)
            if topic is None or topic.error is not None or not topic.partitions:
                why = topic.error.str() if topic is not None and topic.error else "no partitions"
                raise ConfigError(f"topic {o.topic!r} on {o.brokers}: {why}")
            tps = [TopicPartition(o.topic, p) for p in sorted(topic.partitions)]
            committed = {tp.partition: tp.offset for tp in c.committed(tps, timeout=o.timeout)}
            spans = []
            for tp in tps:
                low, high = c.get_watermark_offsets(tp, timeout=o.timeout)
                at = committed.get(tp.partition, -1)
                spans.append(Span(tp.partition, low, high, at if at >= 0 else None))
            if all(s.committed is None for s in spans):  # a misspelt group: nothing to judge
                raise ConfigError(
                    f"group {o.group} has committed nothing on {o.topic}: check the group's "
                    f"name (kafka-consumer-groups --bootstrap-server {o.brokers} --list)"
                )
            if o.since is not None:
                ms = int(o.since.timestamp() * 1000)
                asked = [TopicPartition(o.topic, s.partition, ms) for s in spans]
                for s, tp in zip(spans, c.offsets_for_times(asked, timeout=o.timeout), strict=True):
                    s.start = min(s.stop, tp.offset) if tp.offset >= 0 else s.stop  # -1: none since
            else:
                for s in spans:
                    s.start = max(s.low, s.stop - o.last)
            return spans
        except KafkaException as exc:
            raise KafkaUnavailable(f"Kafka at {o.brokers}: {exc.args[0]}") from None
        finally:
            c.close()

    def read(self, spans: list[Span]) -> Iterator[list[Any]]:
        """The messages of ``spans`` in batches, each partition's in offset order."""
        from confluent_kafka import KafkaError, TopicPartition

        o = self.options
        todo = {s.partition: s for s in spans if s.wanted}
        if not todo:
            return
        c = self._consumer(f"idemctl-audit-{uuid.uuid4().hex}")  # never joins or commits
        try:
            c.assign([TopicPartition(o.topic, p, s.start) for p, s in todo.items()])
            quiet_since = time.monotonic()
            while todo:
                batch, done = [], []
                for m in c.consume(o.batch, timeout=0.5):
                    p = m.partition()
                    span = todo.get(p)
                    if span is None:
                        continue
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            done.append(p)
                        elif err.fatal() or not err.retriable():
                            raise KafkaUnavailable(f"reading {o.topic}[{p}]: {err.str()}")
                        continue
                    if m.offset() < span.stop:
                        batch.append(m)
                    if m.offset() >= span.stop - 1:
                        done.append(p)
                for p in dict.fromkeys(done):
                    if p in todo:
                        c.pause([TopicPartition(o.topic, p)])
                        del todo[p]
                if batch:
                    quiet_since = time.monotonic()
                    yield batch
                elif time.monotonic() - quiet_since > o.timeout:
                    left = ", ".join(f"{o.topic}[{p}]" for p in sorted(todo))
                    raise KafkaUnavailable(f"nothing read from {left} for {o.timeout:g}s")
        finally:
            c.close()

    def dead_letters(self, topic: str) -> set[tuple[int, int]]:
        """(partition, offset) of each message of the audited topic found in the dead-letter
        topic ``topic``, by its Spring Kafka headers (as consume writes them)."""
        from confluent_kafka import KafkaException, TopicPartition

        c = self._consumer(f"idemctl-audit-{uuid.uuid4().hex}")
        found: set[tuple[int, int]] = set()
        try:
            meta = c.list_topics(topic, timeout=self.options.timeout).topics.get(topic)
            if meta is None or meta.error is not None:
                why = meta.error.str() if meta is not None and meta.error else "not found"
                raise ConfigError(f"--dlq-topic {topic!r}: {why}")
            spans = []
            for p in sorted(meta.partitions):
                tp = TopicPartition(topic, p)
                low, high = c.get_watermark_offsets(tp, timeout=self.options.timeout)
                spans.append(Span(p, low, high, committed=None))
                spans[-1].stop = TO_THE_END
            for batch in Kafka(replace(self.options, topic=topic)).read(spans):
                for m in batch:
                    headers = dict(m.headers() or [])
                    if headers.get(_DLT_TOPIC) != self.options.topic.encode():
                        continue
                    part, offset = headers.get(_DLT_PARTITION), headers.get(_DLT_OFFSET)
                    if isinstance(part, bytes) and isinstance(offset, bytes):
                        found.add(
                            (int.from_bytes(part, "big", signed=True),
                             int.from_bytes(offset, "big", signed=True))
                        )  # fmt: skip
        except KafkaException as exc:
            raise KafkaUnavailable(f"Kafka at {self.options.brokers}: {exc.args[0]}") from None
        finally:
            c.close()
        return found
