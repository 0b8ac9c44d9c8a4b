"""The watchdog: a partition that is assigned, not paused by idemctl, behind its end and makes
no progress is stalled, whoever stopped it (the Kafka client, a broker, idemctl itself).
It is said (a warning with its offsets, ``idemctl_stalled_partitions``, ``/readyz``) and
recovered: resumed, and sent back to its committed offset, from where nothing is skipped.

A partition the recovery brings nothing from is left alone at that offset (its lag may be
transaction markers, which no consumer is ever given) until it moves again."""

from __future__ import annotations

import logging
from collections.abc import Container, Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("idemctl.consume")

Partition = tuple[str, int]

MIN_POLLS = 3
"""Polls a partition must have gone without progress as well: a slow batch of handlers
(no polls while it runs) does not stall the partitions it leaves waiting."""


@dataclass
class _Seen:
    offset: int
    """Where the partition stood (its position, or its committed offset before any fetch)."""
    since: float
    polls: int
    """The consumer's poll count at ``since``."""


class Stalls:
    """What the watchdog knows of each assigned partition, from the consumer's loop."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        """Seconds without progress, with lag, before a partition is stalled (0: never)."""
        self.stalled: dict[Partition, str] = {}
        """Stalled now, and why (for ``/readyz``)."""
        self.lags: dict[Partition, int] = {}
        """Each assigned partition's lag at the last check, where the client knows it."""
        self.recovered = 0
        """Stalls found and recovered since the start."""
        self._seen: dict[Partition, _Seen] = {}
        self._sent_back: dict[Partition, int] = {}
        """Where a recovery sent a partition: stalled there again, it is left alone."""
        self._checked = 0.0

    @property
    def every(self) -> float:
        """Seconds between two checks: the lags ``exit_when_idle`` waits on stay fresh."""
        return min(max(self.timeout / 4, 0.25), 1.0)

    def forget(self, partitions: Iterable[Partition]) -> None:
        """Revoked or lost: another member, or a later assignment, starts afresh."""
        for tp in partitions:
            self._seen.pop(tp, None)
            self._sent_back.pop(tp, None)
            self.stalled.pop(tp, None)
            self.lags.pop(tp, None)

    def lagging(self) -> list[Partition]:
        """Partitions behind their end, not left alone after a recovery that brought
        nothing: ``exit_when_idle`` waits for them (with the watchdog on)."""
        if not self.timeout:
            return []
        return [
            tp
            for tp, lag in self.lags.items()
            if lag > 0
            and (tp not in self._seen or self._sent_back.get(tp) != self._seen[tp].offset)
        ]

    def check(
        self,
        kafka: Any,
        partitions: set[Partition],
        ours: Container[Partition],
        polls: int,
        now: float,
    ) -> None:
        """Look at every assigned partition (at most every ``every`` seconds): recover
        those that stalled."""
        if not partitions or now - self._checked < self.every:
            return
        self._checked = now
        for tp, offset, lag in _where(kafka, partitions):
            if lag is None:
                self.lags.pop(tp, None)
            else:
                self.lags[tp] = lag
            seen = self._seen.get(tp)
            if tp in ours or lag is None or lag <= 0 or seen is None or seen.offset != offset:
                self._seen[tp] = _Seen(offset, now, polls)
                self.stalled.pop(tp, None)
                if seen is not None and seen.offset != offset:
                    self._sent_back.pop(tp, None)
                continue
            if (
                not self.timeout
                or now - seen.since < self.timeout
                or polls - seen.polls < MIN_POLLS
            ):
                continue
            if self._sent_back.get(tp) == offset:
                continue  # a recovery brought nothing from here: left alone until it moves
            self._recover(kafka, tp, offset, lag, now - seen.since)
            self._seen[tp] = _Seen(offset, now, polls)

    def _recover(self, kafka: Any, tp: Partition, offset: int, lag: int, idle: float) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        topic, partition = tp
        self.stalled[tp] = (
            f"partition {topic}[{partition}] stalled at offset {offset} with {lag} messages "
            f"behind it, no progress for {idle:.0f}s"
        )
        self.recovered += 1
        try:
            kafka.resume([TopicPartition(topic, partition)])
            (committed,) = kafka.committed([TopicPartition(topic, partition)], timeout=5.0)
            back = committed.offset if committed.offset >= 0 else offset
            kafka.seek(TopicPartition(topic, partition, back))
        except KafkaException as exc:  # revoked meanwhile, or no answer: the next check sees
            log.warning("%s; recovering it failed: %s", self.stalled[tp], exc)
            return
        self._sent_back[tp] = back
        log.warning(
            "%s, though idemctl did not pause it; resumed it and went back to its committed "
            "offset %d",
            self.stalled[tp],
            back,
            extra={
                "idemctl": {
                    "topic": topic,
                    "partition": partition,
                    "offset": offset,
                    "lag": lag,
                    "outcome": "stalled",
                }
            },
        )


def _where(kafka: Any, partitions: set[Partition]) -> list[tuple[Partition, int, int | None]]:
    """Each partition's position (or, before its first message, its committed offset) and
    its lag behind the high watermark the last fetch reported (None where unknown)."""
    from confluent_kafka import KafkaException, TopicPartition

    try:
        positions = kafka.position([TopicPartition(t, p) for t, p in sorted(partitions)])
        unknown = [tp for tp in positions if tp.offset < 0]
        committed = kafka.committed(unknown, timeout=2.0) if unknown else []
    except (KafkaException, RuntimeError):
        return []
    start = {(tp.topic, tp.partition): tp.offset for tp in committed}
    out = []
    for tp in positions:
        key = (tp.topic, tp.partition)
        offset = tp.offset if tp.offset >= 0 else start.get(key, -1)
        try:
            high = kafka.get_watermark_offsets(tp, cached=True)
        except (KafkaException, RuntimeError):
            high = None
        known = high is not None and high[1] >= 0 and offset >= 0
        out.append((key, offset, max(high[1] - offset, 0) if known and high else None))
    return out
