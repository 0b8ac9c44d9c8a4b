"""Replay: publish chosen outbox rows again, published or not, with their original ids,
so consumers that deduplicate on the ``id`` header see each event once."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from idemctl.outbox.relay import (
    DEFAULT_TOPIC_TEMPLATE,
    TopicTemplate,
    batch_rows,
    new_producer,
    publish,
)
from idemctl.outbox.table import OutboxRow, OutboxTable, Selection

if TYPE_CHECKING:
    from idemctl.stores.base import Store


@dataclass
class ReplayReport:
    sent: int = 0
    failed: list[tuple[uuid.UUID, str]] = field(default_factory=list)
    marked: int = 0
    """Rows that were unpublished and are marked published now (replayed to their topics)."""


class Replay:
    """The rows ``selection`` picks, and publishing them again."""

    def __init__(
        self,
        store: Store,
        selection: Selection,
        *,
        topic_template: str = DEFAULT_TOPIC_TEMPLATE,
        to_topic: str | None = None,
        batch_size: int = 100,
    ) -> None:
        self.table = OutboxTable(store)
        self.selection = selection
        self.to_topic = to_topic
        template = TopicTemplate(topic_template)
        self.topic_of: Callable[[OutboxRow], str] = (
            template if to_topic is None else lambda _row: to_topic
        )
        self.batch_size = batch_rows(batch_size)

    def count(self) -> int:
        return self.table.count(self.selection)

    def rows(self) -> list[OutboxRow]:
        return [row for page in self.table.select(self.selection) for row in page]

    def send(
        self,
        brokers: str,
        kafka_config: dict[str, str] | None = None,
        *,
        delivery_timeout: float = 30.0,
        progress: Callable[[int], None] | None = None,
    ) -> ReplayReport:
        """Publish the rows in the order they were written, a batch at a time, each batch
        acknowledged before the next. Rows replayed to their own topics that were not
        published yet are marked published (unless a relay holds them right now)."""
        producer = new_producer(brokers, kafka_config or {}, delivery_timeout)
        report = ReplayReport()
        for page in self.table.select(self.selection, self.batch_size):
            results = publish(producer, page, self.topic_of, delivery_timeout + 5.0)
            acked = {row.id for row in page if results[row.id] is None}
            report.sent += len(acked)
            report.failed += [(i, e) for i, e in results.items() if e is not None]
            if self.to_topic is None:
                report.marked += self.table.mark_replayed(
                    [row.id for row in page if row.published_at is None and row.id in acked]
                )
            if progress is not None:
                progress(len(page))
        return report
