"""The relay: publishes committed outbox rows to Kafka, marking each published only once
the broker has acknowledged it, and keeping each aggregate's events in write order.

Each round, in one PostgreSQL transaction: take up to ``batch_size`` rows
(``OutboxTable.take``: the aggregates whose earliest unpublished row is due and not held by
another relay, each from that row on, locked until the commit), produce them with an
idempotent producer keyed by ``aggregateid``, one row of an aggregate at a time (the next
only once the broker acknowledged the one before; rows of different aggregates go out
together), then mark the acknowledged rows published and count a failed attempt (with
its error and a back-off) on the row that failed, and commit. A failed row stays its
aggregate's earliest unpublished row, so the aggregate's later rows wait for it, while
other aggregates go on. A relay that dies before the commit leaves its rows unpublished,
so another publishes them again: an event may appear twice, always with the same ``id``
header, and is never lost.
"""

from __future__ import annotations

import contextlib
import logging
import string
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from idemctl import tracing
from idemctl.drivers import require
from idemctl.durations import MAX_TIMEOUT_MS
from idemctl.errors import ConfigError, StoreUnavailable
from idemctl.metrics import Ready, Scraped, build_info, counter, store_answers
from idemctl.model import canonical_json
from idemctl.outbox.table import OutboxRow, OutboxTable
from idemctl.outbox.wakeup import Wakeup

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from idemctl.stores.base import Store

log = logging.getLogger("idemctl.outbox")
kafka_log = logging.getLogger("idemctl.outbox.kafka")
"""librdkafka's own log lines (connection retries and the like)."""

DEFAULT_TOPIC_TEMPLATE = "outbox.event.{aggregatetype}"
"""Debezium's outbox event router names topics the same way."""
TEMPLATE_FIELDS = ("aggregatetype", "aggregateid", "type")
MAX_STORE_BACKOFF = 30.0


class TopicTemplate:
    """``outbox.event.{aggregatetype}``: a topic per row from its fields."""

    def __init__(self, template: str) -> None:
        try:
            names = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
        except ValueError as exc:
            raise ConfigError(f"topic template {template!r}: {exc}") from None
        for name in names:
            if name not in TEMPLATE_FIELDS:
                raise ConfigError(
                    f"topic template {template!r}: unknown field {{{name}}} "
                    f"(use {', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)})"
                )
        if not template.strip():
            raise ConfigError("the topic template is empty")
        self.template = template

    def __call__(self, row: OutboxRow) -> str:
        return self.template.format(
            aggregatetype=row.aggregatetype, aggregateid=row.aggregateid, type=row.type
        )


def message(row: OutboxRow) -> dict[str, Any]:
    """The Kafka message of a row, the same from the relay and from replay: keyed by
    ``aggregateid``, the payload as JSON (none: a tombstone), the row's ``id`` and ``type``
    and its own headers."""
    return {
        "key": row.aggregateid.encode(),
        "value": None if row.payload is None else canonical_json(row.payload),
        "headers": [("id", str(row.id)), ("type", row.type), *row.headers.items()],
    }


def batch_rows(n: int) -> int:
    """``n``, rows a relay or replay takes at a time, when it fits in librdkafka's producer
    queue (100,000 messages by default); else ConfigError."""
    if not 1 <= n <= 100_000:
        raise ConfigError(f"--batch-size {n}: use from 1 to 100000")
    return n


def new_producer(
    brokers: str, kafka_config: dict[str, str], delivery_timeout: float
) -> Any:  # confluent_kafka.Producer
    """An idempotent producer: the broker drops its own retries' duplicates and keeps each
    partition's order; a message not acknowledged within ``delivery_timeout`` fails."""
    require("confluent_kafka", "kafka", "publishing the outbox")
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": brokers,
            "message.timeout.ms": round(delivery_timeout * 1000),
            **kafka_config,
            "enable.idempotence": True,
        },
        logger=kafka_log,
    )


def publish(
    producer: Any,
    rows: Sequence[OutboxRow],
    topic_of: Callable[[OutboxRow], str],
    timeout: float,
) -> dict[uuid.UUID, str | None]:
    """Produce ``rows`` and wait for the broker: each row's id maps to None when it was
    acknowledged, else to why not."""
    from confluent_kafka import KafkaException

    results: dict[uuid.UUID, str | None] = {}
    tracer = tracing.tracer()
    spans: dict[uuid.UUID, Any] = {}

    def reported(row: OutboxRow) -> Callable[[Any, Any], None]:
        def done(err: Any, msg: Any) -> None:
            results[row.id] = None if err is None else err.str()
            if log.isEnabledFor(logging.DEBUG):
                _log_delivery(row, err, msg)
            span = spans.pop(row.id, None)
            if span is not None:
                span.set_attribute("idemctl.outcome", "published" if err is None else "failed")
                span.end()

        return done

    for row in rows:
        topic, kafka_message = topic_of(row), message(row)
        if tracer is not None:
            spans[row.id] = span = _publish_span(tracer, row, topic, kafka_message["headers"])
            kafka_message["headers"] = tracing.inject(span, kafka_message["headers"])
        for _ in range(2):
            try:
                producer.produce(topic, on_delivery=reported(row), **kafka_message)
                break
            except BufferError:
                producer.poll(1.0)  # the local queue is full: let deliveries drain it
            except (KafkaException, ValueError, TypeError) as exc:
                results[row.id] = f"could not produce: {exc}"
                break
        else:
            results[row.id] = "could not produce: the producer's queue stayed full"
    deadline = time.monotonic() + timeout
    while len(results) < len(rows) and time.monotonic() < deadline:
        producer.flush(min(1.0, max(deadline - time.monotonic(), 0.0)))
    for row in rows:
        results.setdefault(row.id, f"no acknowledgement within {timeout:g}s")
    for span in spans.values():  # never answered
        span.set_attribute("idemctl.outcome", "failed")
        span.end()
    return results


def _publish_span(tracer: Any, row: OutboxRow, topic: str, headers: list[Any]) -> Any:
    """A PRODUCER span for an event, continuing the trace the handler that wrote it was in
    (the ``traceparent`` ``ctx.outbox.add`` put in its headers)."""
    from opentelemetry.trace import SpanKind

    return tracer.start_span(
        "idemctl.publish",
        context=tracing.extract(headers),
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": "kafka",
            "messaging.operation": "publish",
            "messaging.destination.name": topic,
            "idemctl.event_id": str(row.id),
            "idemctl.aggregatetype": row.aggregatetype,
            "idemctl.type": row.type,
        },
    )


def _log_delivery(row: OutboxRow, err: Any, msg: Any) -> None:
    """A debug line for each event the broker answered for: where it went (topic,
    partition, offset), or why it was not taken; keyed by its aggregate id, as on Kafka."""
    fields = {"key": row.aggregateid, "event_id": str(row.id), "type": row.type}
    if err is None and msg is not None:
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        log.debug(
            "published %s (%s %s) to %s[%d]@%d",
            row.id,
            row.aggregatetype,
            row.type,
            topic,
            partition,
            offset,
            extra={
                "idemctl": {
                    **fields,
                    "topic": topic,
                    "partition": partition,
                    "offset": offset,
                    "outcome": "published",
                }
            },
        )
    elif err is not None:
        log.debug(
            "not delivered: %s (%s %s): %s",
            row.id,
            row.aggregatetype,
            row.type,
            err.str(),
            extra={"idemctl": {**fields, "outcome": "failed"}},
        )


def publish_in_order(
    producer: Any,
    rows: Sequence[OutboxRow],
    topic_of: Callable[[OutboxRow], str],
    timeout: float,
) -> tuple[dict[uuid.UUID, str | None], list[OutboxRow]]:
    """Produce ``rows`` (in write order) so that no row goes out before the rows written
    before it of its aggregate are acknowledged: in waves, each holding the next row of
    every aggregate, each waited for (up to ``timeout``) before the next. An aggregate
    whose row failed stops there.

    Returns the outcome of each row produced (as ``publish``), and the rows held back, not
    produced, because an earlier row of their aggregate failed."""
    queues: dict[tuple[str, str], deque[OutboxRow]] = {}
    for row in rows:
        queues.setdefault((row.aggregatetype, row.aggregateid), deque()).append(row)
    results: dict[uuid.UUID, str | None] = {}
    held: list[OutboxRow] = []
    while queues:
        wave = [queue[0] for queue in queues.values()]
        results.update(publish(producer, wave, topic_of, timeout))
        for aggregate, queue in list(queues.items()):
            row = queue.popleft()
            if results[row.id] is not None:
                held.extend(queue)
                del queues[aggregate]
            elif not queue:
                del queues[aggregate]
    return results, held


@dataclass
class RelayOptions:
    brokers: str
    topic_template: str = DEFAULT_TOPIC_TEMPLATE
    batch_size: int = 100
    """Rows per transaction and per wait for acknowledgements."""
    poll_interval: float = 1.0
    """Seconds between looks at the table while it has nothing due."""
    backoff: float = 1.0
    """Seconds before a failed row's first retry; doubled with each failure after."""
    max_backoff: float = 300.0
    delivery_timeout: float = 30.0
    """Seconds the broker has to acknowledge a message before its delivery counts as failed
    (librdkafka's message.timeout.ms); the batch's rows stay locked meanwhile."""
    exit_when_idle: float | None = None
    """Stop after this many seconds without a row due (for scripted runs)."""
    listen: bool = True
    """Wake at once when rows are written (LISTEN/NOTIFY), not only every poll interval."""
    kafka_config: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        batch_rows(self.batch_size)
        if not 0 < self.delivery_timeout <= MAX_TIMEOUT_MS:
            raise ConfigError("--delivery-timeout must be more than 0 and at most 24d20h")
        self.topic_of = TopicTemplate(self.topic_template)


@dataclass
class RelaySummary:
    published: int = 0
    failed: int = 0
    """Failed deliveries (each counted on its row, which is retried after a back-off)."""
    batches: int = 0
    store_unavailable: int = 0
    last_error: str | None = None
    undelivered: int = 0
    """Rows this relay took and could not deliver, and has not delivered since: when a run
    ends with any, the broker did not take everything it was given."""
    delivery_error: str | None = None
    """Why the last failed delivery failed."""


def register_metrics(relay: Relay, registry: CollectorRegistry) -> Ready:
    """The relay's counters for ``--metrics-port``, read from its summary at each scrape
    (``idemctl_outbox_events_total{outcome}``, ``idemctl_outbox_batches_total``,
    ``idemctl_outbox_store_unavailable_total``, ``idemctl_build_info``); ready while the
    database answers."""
    build_info(registry, relay.table.store)
    registry.register(Scraped(lambda: _families(relay)))
    return lambda: store_answers(relay.table.store)


def _families(relay: Relay) -> Iterator[Any]:
    s = relay.summary
    yield counter(
        "idemctl_outbox_events",
        "Outbox rows the relay published, and deliveries that failed (retried later).",
        {"published": s.published, "failed": s.failed},
        "outcome",
    )
    yield counter("idemctl_outbox_batches", "Batches committed.", s.batches)
    yield counter(
        "idemctl_outbox_store_unavailable",
        "Rounds that found the database unreachable.",
        s.store_unavailable,
    )


class Relay:
    """Publishes the outbox of a PostgreSQL store until stopped."""

    def __init__(
        self,
        store: Store,
        options: RelayOptions,
        *,
        on_progress: Callable[[RelaySummary], None] | None = None,
        producer: Any = None,
    ) -> None:
        """``producer``: a ``confluent_kafka.Producer`` (or an object with its ``produce``,
        ``poll`` and ``flush``) to publish with; by default one is made from ``options``
        on first use. Tests pass one that fails deliveries on purpose."""
        self.table = OutboxTable(store)
        self.options = options
        self.summary = RelaySummary()
        self._on_progress = on_progress
        self._stop = threading.Event()
        self._producer: Any = producer
        self._undelivered: set[uuid.UUID] = set()
        self._wakeup = Wakeup(self.table.store) if options.listen else None

    def stop(self) -> None:
        """Finish the batch in hand (its acknowledgements and marks), then return (signal-safe)."""
        self._stop.set()

    def run(self) -> RelaySummary:
        try:
            return self._run()
        finally:
            if self._wakeup is not None:
                self._wakeup.close()

    def _idle(self, seconds: float) -> None:
        """Wait ``seconds`` for rows, or less: until a new row's notification or stop()."""
        if self._wakeup is None:
            self._stop.wait(seconds)
        else:
            self._wakeup.wait(seconds, self._stop)

    def _run(self) -> RelaySummary:
        o = self.options
        if self._wakeup is not None:
            with contextlib.suppress(StoreUnavailable):  # the loop below says so
                if not self.table.notifies():
                    log.warning(
                        "the outbox table %s has no trigger to wake the relay (an idemctl "
                        "schema from before version 5): run 'idemctl init'; polling every "
                        "%gs meanwhile",
                        self.table.name,
                        o.poll_interval,
                    )
        idle_since = time.monotonic()
        store_failures = 0
        while not self._stop.is_set():
            try:
                taken = self.relay_once()
                store_failures = 0
            except StoreUnavailable as exc:
                # Fail closed: nothing was marked, so whatever was produced goes out again.
                store_failures += 1
                self.summary.store_unavailable += 1
                self.summary.last_error = str(exc)
                log.warning(
                    "store unavailable, will retry: %s",
                    exc,
                    extra={"idemctl": {"outcome": "store_unavailable"}},
                )
                self._progress()
                self._stop.wait(min(o.poll_interval * 2**store_failures, MAX_STORE_BACKOFF))
                continue
            self._progress()
            now = time.monotonic()
            if taken:
                idle_since = now
            elif o.exit_when_idle is not None and now - idle_since >= o.exit_when_idle:
                break
            if taken < o.batch_size:
                self._idle(o.poll_interval)
        return self.summary

    def relay_once(self) -> int:
        """One round: take due rows, publish them, mark them; returns how many were taken."""
        o = self.options
        with self.table.store.connection() as conn, conn.transaction():
            # The rows are ours until the commit; marking them must not fail on a brief
            # table lock elsewhere (that would publish the batch twice): wait, up to the
            # statement timeout.
            conn.execute("SET LOCAL lock_timeout = 0")
            rows = self.table.take(conn, o.batch_size)
            if not rows:
                return 0
            if self._producer is None:
                self._producer = new_producer(o.brokers, o.kafka_config, o.delivery_timeout)
            results, held = publish_in_order(
                self._producer, rows, o.topic_of, o.delivery_timeout + 5.0
            )
            acked = [row for row in rows if row.id in results and results[row.id] is None]
            failed = [(row, error) for row in rows if (error := results.get(row.id)) is not None]
            self.table.mark_published(conn, acked)
            self.table.mark_failed(conn, failed, o.backoff, o.max_backoff)
        self.summary.batches += 1
        self.summary.published += len(acked)
        self.summary.failed += len(failed)
        self._undelivered.difference_update(row.id for row in acked)
        self._undelivered.update(row.id for row, _ in failed)
        self.summary.undelivered = len(self._undelivered)
        if failed:
            row, error = failed[-1]
            self.summary.last_error = self.summary.delivery_error = error
            log.warning(
                "%d of %d outbox row(s) not delivered to the brokers at %s, each retried "
                "after its back-off (from %gs, doubling), %d later row(s) of their aggregates "
                "waiting for them; the last: %s (%s %s) to %s, attempt %d: %s",
                len(failed),
                len(rows),
                o.brokers,
                o.backoff,
                len(held),
                row.id,
                row.aggregatetype,
                row.type,
                o.topic_of(row),
                row.attempts + 1,
                error,
                extra={
                    "idemctl": {
                        "key": row.aggregateid,
                        "topic": o.topic_of(row),
                        "outcome": "failed",
                        "event_id": str(row.id),
                        "attempt": row.attempts + 1,
                        "failed_rows": len(failed),
                    }
                },
            )
        return len(rows)

    def _progress(self) -> None:
        if self._on_progress is not None:
            self._on_progress(self.summary)
