"""The FastStream middleware's aiokafka side: pausing a partition at a message (seek back,
pause, resume after a back-off), writing dead letters and waiting for the broker, and
stopping the app before a record is committed."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NoReturn

from idemctl.errors import MissingDriver
from idemctl.kafka.deadletter import HEADROOM, RECEIVE_MAX
from idemctl.model import JSON, Order

try:
    # aiokafka ships no type information (no py.typed): untyped here.
    from aiokafka import AIOKafkaProducer, TopicPartition  # type: ignore[import-untyped]
    from aiokafka.errors import IllegalStateError, KafkaError  # type: ignore[import-untyped]
    from faststream.exceptions import StopApplication
except ModuleNotFoundError as exc:  # faststream, or aiokafka underneath its Kafka broker
    raise MissingDriver(
        f"idemctl.faststream needs FastStream's Kafka broker ({exc.name} is missing): "
        "pip install 'idemctl[faststream]'"
    ) from exc

log = logging.getLogger("idemctl.faststream")


@dataclass
class _Item:
    """One consumed record and what idemctl made of it."""

    record: Any  # aiokafka.ConsumerRecord
    subscriber: Any  # FastStream's Kafka subscriber
    consumer: Any  # aiokafka.AIOKafkaConsumer: the subscriber's that fetched the record
    group: str
    topic: str
    partition: int
    offset: int
    key: str | None = None
    fingerprint: str | None = None
    order: Order | None = None
    bad: tuple[str, str] | None = None
    """Why no key can be had from it (reason, detail): dead-lettered or skipped."""
    result: JSON = None

    @property
    def where(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


class _Pauses:
    """The partitions of one Kafka consumer paused, and when each resumes."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.until: dict[Any, float] = {}
        self._timer: asyncio.TimerHandle | None = None

    def pause(self, item: _Item, seconds: float, *, everything: bool) -> None:
        tp = TopicPartition(item.topic, item.partition)
        tps = set(self.consumer.assignment()) | {tp} if everything else {tp}
        try:
            self.consumer.pause(*tps)
            self.consumer.seek(tp, item.offset)
        except IllegalStateError as exc:  # revoked meanwhile: its new owner goes on from the commit
            log.debug("pause %s: %s", item.where, exc)
            return
        loop = asyncio.get_running_loop()
        at = loop.time() + seconds
        for paused in tps:
            self.until[paused] = max(self.until.get(paused, 0.0), at)
        self._schedule(loop)

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = (
            loop.call_at(min(self.until.values()), self._resume_due) if self.until else None
        )

    def _resume_due(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = [tp for tp, at in self.until.items() if at <= now]
        for tp in due:
            del self.until[tp]
            try:
                self.consumer.resume(tp)
            except (IllegalStateError, KafkaError) as exc:  # revoked or stopped meanwhile
                log.debug("resume %s: %s", tp, exc)
        self._timer = None
        self._schedule(loop)


class _DeadLetters:
    """An aiokafka producer of dead letters, on the subscriber's connection: each dead
    letter is sent alone and waited for until every in-sync replica has it (``acks=all``).
    Not idempotent by default: with one record in flight at a time there is nothing to
    reorder, and aiokafka's InitProducerId (v0 only) is refused by some Kafka-protocol
    brokers; ``dlq_config={"enable_idempotence": True}`` turns it on."""

    def __init__(self, timeout: float, overrides: dict[str, Any]) -> None:
        self.timeout = timeout
        self.overrides = overrides
        self._producer: Any = None

    async def send(
        self, item: _Item, topic: str, headers: list[tuple[str, bytes | None]]
    ) -> str | None:
        """None once the broker acknowledged the dead letter, else why not (one line)."""
        record = item.record
        if "bootstrap_servers" not in self._config(item.subscriber):
            return (
                f"could not dead-letter to {topic}: the subscriber's bootstrap servers are "
                "unknown; give dlq_config={'bootstrap_servers': ...}"
            )
        try:
            producer = await self._start(item)
            await asyncio.wait_for(
                producer.send_and_wait(topic, record.value, key=record.key, headers=headers),
                self.timeout,
            )
        except (KafkaError, TimeoutError) as exc:
            await self.close()  # a new producer next time: nothing given up on arrives later
            return f"could not dead-letter to {topic}: {type(exc).__name__}: {exc}"
        return None

    async def _start(self, item: _Item) -> Any:
        if self._producer is None:
            producer = AIOKafkaProducer(**self._config(item.subscriber))
            try:
                await producer.start()
            except BaseException:
                await producer.stop()
                raise
            self._producer = producer
        return self._producer

    def _config(self, subscriber: Any) -> dict[str, Any]:
        """The consumer's connection settings that a producer takes, then what makes a dead
        letter safe and able to carry any message the consumer can read."""
        taken = inspect.signature(AIOKafkaProducer.__init__).parameters
        connection = {k: v for k, v in _connection(subscriber).items() if k in taken}
        return {
            **connection,
            "acks": "all",
            "max_request_size": RECEIVE_MAX + HEADROOM,
            "request_timeout_ms": max(int(self.timeout * 1000), 1),
            **self.overrides,
        }

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()


def _connection(subscriber: Any) -> dict[str, Any]:
    """The settings the subscriber's consumers are built with (bootstrap servers, security,
    client id): FastStream's consumer factory, ``subscriber.builder``, holds them."""
    builder = getattr(subscriber, "builder", None)
    if isinstance(builder, functools.partial):
        return dict(builder.keywords)
    return {}


def _refuse(consumer: Any, records: Iterable[Any], text: str) -> NoReturn:
    """Stop the app (FastStream's StopApplication) before ``records`` are committed, saying
    why at CRITICAL."""
    _seek_back(consumer, records)
    log.critical("stopping: %s", text, extra={"idemctl": {"outcome": "stopped"}})
    raise StopApplication


def _seek_back(consumer: Any, records: Iterable[Any]) -> None:
    """Each record's partition back to its earliest record: nothing past it is committed."""
    if consumer is None or not hasattr(consumer, "seek"):
        return
    earliest: dict[Any, int] = {}
    for r in records:
        tp = TopicPartition(r.topic, r.partition)
        earliest[tp] = min(earliest.get(tp, r.offset), r.offset)
    for tp, offset in earliest.items():
        try:
            consumer.seek(tp, offset)
        except IllegalStateError as exc:  # revoked meanwhile
            log.debug("seek %s: %s", tp, exc)
