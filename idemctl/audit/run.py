"""``audit``: read a group's committed work back from Kafka and judge each message by its
key's record, a batch (one store round trip) at a time."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from idemctl.audit.judge import Judge, Seen
from idemctl.audit.kafka import Kafka
from idemctl.audit.model import LOST_SHOWN, AuditOptions, AuditReport, LostMessage, PartitionAudit
from idemctl.errors import InvalidKey, InvalidPayload
from idemctl.keys import Message, key_strategy, order_strategy, unusable_reason
from idemctl.pacing import paced
from idemctl.stores.base import Store


@dataclass
class AuditProgress:
    total: int = 0
    """Messages to judge, below the committed offsets."""
    done: int = 0
    lost: int = 0


class Keyer:
    """A message's key, fingerprint and order, derived as ``consume`` derives them."""

    def __init__(self, options: AuditOptions) -> None:
        self.key = key_strategy(options.key)
        self.by_offset = key_strategy("offset")
        self.order = (
            order_strategy(options.order_key, options.sequence)
            if options.order_key is not None and options.sequence is not None
            else None
        )
        self.on_missing_key = options.on_missing_key

    def __call__(self, m: Any) -> Seen:
        message = Message(m.topic(), m.partition(), m.offset(), m.value(), m.headers() or ())
        kind, ms = m.timestamp()
        at = datetime.fromtimestamp(ms / 1000, UTC) if kind and ms >= 0 else None
        try:
            key = self.key(message)
            order = None if self.order is None else self.order(message)
            return Seen(message.partition, message.offset, at, key, message.fingerprint(), order)
        except (InvalidKey, InvalidPayload) as exc:
            if self.on_missing_key == "offset":
                try:
                    fp = message.fingerprint()
                except InvalidPayload:
                    fp = None
                return Seen(message.partition, message.offset, at, self.by_offset(message), fp)
            return Seen(message.partition, message.offset, at, None, unusable=unusable_reason(exc))


def audit(
    store: Store,
    options: AuditOptions,
    on_progress: Callable[[AuditProgress], None] | None = None,
) -> AuditReport:
    """Judge the messages below ``options.group``'s committed offsets on ``options.topic``
    (the last ``options.last`` of each partition, or those since ``options.since``). Never
    joins the group or commits: its offsets and members stay as they are."""
    started = time.monotonic()
    kafka = Kafka(options)
    spans = kafka.spans()
    dead = kafka.dead_letters(options.dlq_topic) if options.dlq_topic else None
    judge = Judge(datetime.now(UTC), store.default_retention, options.on_missing_key, dead)
    parts = {s.partition: PartitionAudit(s.partition, s.committed, s.start, s.high) for s in spans}
    report = AuditReport(options.topic, options.group, store.url, list(parts.values()))
    report.dlq_checked = options.dlq_topic
    progress = AuditProgress(total=sum(s.wanted for s in spans))
    if on_progress is not None:
        on_progress(progress)
    pace = paced(options.rate) if options.rate else None
    keyer = Keyer(options)
    lost: list[LostMessage] = []
    for batch in kafka.read(spans):
        seen = [keyer(m) for m in batch]
        if options.since is not None:  # offsets_for_times only finds the first: timestamps
            seen = [s for s in seen if s.timestamp is None or s.timestamp >= options.since]
        records = store.get_many([s.key for s in seen if s.key is not None])
        for s in seen:
            verdict = judge(s, None if s.key is None else records.get(s.key))
            parts[s.partition].counts[verdict.kind] += 1
            if verdict.kind == "lost":
                progress.lost += 1
                lost.append(LostMessage(s.partition, s.offset, s.key, verdict.why or "lost"))
        if len(lost) > 4 * LOST_SHOWN:
            lost = _first(lost)
        progress.done += len(batch)
        if on_progress is not None:
            on_progress(progress)
        if pace is not None:
            pace(len(batch))
    report.lost = _first(lost)
    report.seconds = time.monotonic() - started
    return report


def _first(lost: list[LostMessage]) -> list[LostMessage]:
    return sorted(lost, key=lambda m: (m.partition, m.offset))[:LOST_SHOWN]
