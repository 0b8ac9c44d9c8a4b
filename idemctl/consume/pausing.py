"""Where the consume loop stops partitions and where it stores their offsets: a partition
paused at a message (sought back to it, resumed after a back-off), partitions paused while
every lane is busy (back-pressure), and offsets past each partition's finished messages."""

from __future__ import annotations

import time
from typing import Any

from idemctl.consume.deadletter import kafka_text
from idemctl.consume.item import Item, while_done
from idemctl.consume.watch import log
from idemctl.kafka.policy import MAX_BACKOFF

Partition = tuple[str, int]


class Pausing:
    """A part of Consumer: pausing, resuming and storing offsets, in the loop's thread."""

    _kafka: Any
    _paused: dict[Partition, float]
    _resume_at: dict[Partition, int]
    _pressed: set[Partition]
    _partitions: set[Partition]

    def _pause(self, item: Item, seconds: float) -> None:
        """Stop ``item``'s partition at it: seek back, pause, resume after ``seconds``."""
        from confluent_kafka import KafkaException, TopicPartition

        m = item.msg
        tp = TopicPartition(m.topic(), m.partition(), m.offset())
        try:
            self._kafka.pause([tp])
            self._kafka.seek(tp)
        except KafkaException as exc:  # revoked meanwhile: its new owner starts from the commit
            log.debug("pause %s[%d]: %s", m.topic(), m.partition(), kafka_text(exc))
            return
        self._pressed.discard(item.tp)
        self._paused[item.tp] = time.monotonic() + min(seconds, MAX_BACKOFF)
        self._resume_at[item.tp] = m.offset()

    def _resume_due(self) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        now = time.monotonic()
        due = [tp for tp, at in self._paused.items() if at <= now]
        if due:
            for tp in due:
                del self._paused[tp]
            try:
                self._kafka.resume([TopicPartition(*tp) for tp in due if tp not in self._pressed])
            except KafkaException as exc:  # revoked meanwhile
                log.debug("resume: %s", kafka_text(exc))

    def _press(self) -> None:
        """Every lane busy for a while: pause the assigned partitions not paused yet, each
        sought to where it stands, so the polls that keep the membership bring nothing."""
        from confluent_kafka import KafkaException, TopicPartition

        tps = [tp for tp in self._partitions if tp not in self._paused and tp not in self._pressed]
        if not tps:
            return
        try:
            positions = self._kafka.position([TopicPartition(t, p) for t, p in tps])
            self._kafka.pause(positions)
            for tp in positions:
                if tp.offset >= 0:
                    self._kafka.seek(tp)
                    self._resume_at[(tp.topic, tp.partition)] = tp.offset
        except KafkaException as exc:  # revoked meanwhile
            log.debug("pause: %s", kafka_text(exc))
        self._pressed.update(tps)

    def _unpress(self) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        if not self._pressed:
            return
        pressed, self._pressed = self._pressed, set()
        try:
            self._kafka.resume(
                [TopicPartition(t, p) for t, p in pressed if (t, p) not in self._paused]
            )
        except KafkaException as exc:  # revoked meanwhile
            log.debug("resume: %s", kafka_text(exc))

    def _store_offsets(self, partitions: list[list[Item]]) -> None:
        """For each partition, the offset after its last finished message before the
        first unfinished one (which it was sought back to)."""
        from confluent_kafka import KafkaException, TopicPartition

        offsets = []
        for items in partitions:
            finished = while_done(items)
            if finished:
                m = finished[-1].msg
                offsets.append(TopicPartition(m.topic(), m.partition(), m.offset() + 1))
        if offsets:
            try:
                self._kafka.store_offsets(offsets=offsets)
            except KafkaException as exc:  # revoked meanwhile: the new owner goes on
                log.debug("store offsets: %s", kafka_text(exc))
