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
from idemctl.kafka.keys import Message
from idemctl.kafka.policy import Keying
from idemctl.pacing import paced
from idemctl.stores.base import Store


@dataclass
class AuditProgress:
    total: int = 0
    """Messages to judge, below the committed offsets."""
    done: int = 0
    lost: int = 0


def seen(keying: Keying, m: Any) -> Seen:
    """A message keyed as ``consume`` keys it (the shared policy's ``Keying``), with its
    timestamp."""
    kind, ms = m.timestamp()
    at = datetime.fromtimestamp(ms / 1000, UTC) if kind and ms >= 0 else None
    a = keying.admit(Message(m.topic(), m.partition(), m.offset(), m.value(), m.headers() or ()))
    unusable, detail = (None, None) if a.bad is None else a.bad
    return Seen(m.partition(), m.offset(), at, a.key, a.fingerprint, a.order, unusable, detail)


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
    report.key = options.key
    report.dlq_checked = options.dlq_topic
    progress = AuditProgress(total=sum(s.wanted for s in spans))
    if on_progress is not None:
        on_progress(progress)
    pace = paced(options.rate) if options.rate else None
    keying = Keying(options, refuse=False)
    lost: list[LostMessage] = []
    for batch in kafka.read(spans):
        read = [seen(keying, m) for m in batch]
        if options.since is not None:  # offsets_for_times only finds the first: timestamps
            read = [s for s in read if s.timestamp is None or s.timestamp >= options.since]
        records = store.get_many([s.key for s in read if s.key is not None])
        for s in read:
            record = None if s.key is None else records.get(s.key)
            verdict = judge(s, record)
            parts[s.partition].counts[verdict.kind] += 1
            _tally(report, s, record is not None, verdict.kind)
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


def _tally(report: AuditReport, s: Seen, found: bool, kind: str) -> None:
    """What the report's doubts are judged by: messages without a usable key, and keys
    with and without a record (absent and young enough that it would be there)."""
    if s.key is None:
        report.unkeyed += 1
        if report.unkeyed_example is None:
            why = s.unusable or "no usable key"
            detail = f" ({s.detail})" if s.detail else ""
            report.unkeyed_example = f"{report.topic}[{s.partition}]@{s.offset}: {why}{detail}"
    elif found:
        report.found += 1
    elif kind == "lost":
        report.absent += 1


def _first(lost: list[LostMessage]) -> list[LostMessage]:
    return sorted(lost, key=lambda m: (m.partition, m.offset))[:LOST_SHOWN]
