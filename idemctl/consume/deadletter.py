"""The dead-letter topic: where a message goes that will never be handled, so its partition
can go on. A dead letter is finished only once the broker acknowledged it; one the broker
refuses (too large, no rights, no such topic, brokers down) leaves its message unfinished:
the partition waits at it, with back-off, until the dead letter is written. The topic and
the headers are ``idemctl.kafka.deadletter``'s, shared with the FastStream middleware; this
is consume's confluent-kafka producer of them."""

from __future__ import annotations

import logging
from typing import Any

from idemctl import tracing
from idemctl.consume.options import ConsumeOptions
from idemctl.errors import ConfigError
from idemctl.kafka.deadletter import (
    HEADROOM,
    RECEIVE_MAX,
    dead_letter_headers,
    dead_letter_topic,
)

log = logging.getLogger("idemctl.consume")
kafka_log = logging.getLogger("idemctl.consume.kafka")

SHARED = ("bootstrap.servers", "security.", "sasl.", "ssl.", "client.", "socket.", "broker.")
"""Settings the dead-letter producer takes from the consumer's: the connection, no more."""
TRUNCATE_TO = 64 * 1024
"""Payload bytes kept by ``--dlq-oversize truncate``."""
OVERSIZE = frozenset({"MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE", "MESSAGE_TOO_LARGE"})
"""Error names that mean the record is too large for the producer or the topic."""


def producer_config(consumer: dict[str, Any], timeout: float) -> dict[str, Any]:
    """The dead-letter producer's settings: the consumer's connection; a message size limit
    that takes any message the consumer can read (``receive.message.max.bytes``) with its
    dead-letter headers, unless ``message.max.bytes`` is set; ``timeout`` seconds for the
    broker's acknowledgement."""
    config = {k: v for k, v in consumer.items() if k.startswith(SHARED)}
    largest = int(consumer.get("receive.message.max.bytes", RECEIVE_MAX)) + HEADROOM
    return {
        **config,
        "enable.idempotence": True,
        "message.max.bytes": consumer.get("message.max.bytes", min(largest, 1_000_000_000)),
        "message.timeout.ms": max(int(timeout * 1000), 1),
    }


class DeadLetters:
    """Writes dead letters with Spring Kafka's header names and encodings (so Java tools read
    them) and waits for each acknowledgement."""

    def __init__(self, options: ConsumeOptions, consumer_config: dict[str, Any]) -> None:
        from confluent_kafka import KafkaException, Producer

        self.options = options
        self._config = producer_config(consumer_config, options.dlq_timeout)
        try:
            self._producer = Producer(self._config, logger=kafka_log)
        except KafkaException as exc:
            raise ConfigError(f"Kafka client settings: {kafka_text(exc)}") from None

    def _renew(self) -> None:
        """After a failed delivery: drop what the producer still holds, so nothing it gave
        up on is delivered later behind our back, and start a new one (a new producer id:
        an idempotent producer whose sequence broke can be fenced for good)."""
        from confluent_kafka import Producer

        self._producer.purge()
        self._producer.flush(0)
        self._producer = Producer(self._config, logger=kafka_log)

    def topic(self, msg: Any) -> str:
        return dead_letter_topic(self.options.dlq_topic, msg.topic())

    def send(
        self, msg: Any, reason: str, detail: str, exc: BaseException | None, span: Any = None
    ) -> str | None:
        """Write ``msg`` to its dead-letter topic and wait for the broker: None once it is
        acknowledged, else why it is not (one line). A record refused as too large is
        written again with its payload cut under ``--dlq-oversize truncate``. With a
        tracing ``span``, its trace context replaces the message's ``traceparent``."""
        topic = self.topic(msg)
        original = msg.headers() or ()
        headers = dead_letter_headers(
            original if span is None else tracing.inject(span, original),
            msg.topic(),
            msg.partition(),
            msg.offset(),
            self.options.group,
            reason,
            detail,
            exc,
        )
        value: bytes | None = msg.value()
        refused = self._produce(topic, msg.key(), value, headers)
        if refused is None or refused[0] not in OVERSIZE or value is None:
            return None if refused is None else refused[1]
        if self.options.dlq_oversize != "truncate":
            return f"{refused[1]} (--dlq-oversize truncate writes it with the payload cut)"
        cut = [
            *headers,
            ("idemctl-dlt-truncated", f"{len(value)} bytes, cut to {TRUNCATE_TO}".encode()),
        ]
        again = self._produce(topic, msg.key(), value[:TRUNCATE_TO], cut)
        if again is None:
            log.warning(
                "dead letter of %s[%d]@%d cut from %d to %d payload bytes (%s); the original "
                "stays at that offset while the topic's retention lasts",
                msg.topic(),
                msg.partition(),
                msg.offset(),
                len(value),
                TRUNCATE_TO,
                refused[1],
                extra={
                    "idemctl": {
                        "topic": msg.topic(),
                        "partition": msg.partition(),
                        "offset": msg.offset(),
                        "dlq_topic": topic,
                        "truncated_from": len(value),
                    }
                },
            )
            return None
        return again[1]

    def _produce(
        self, topic: str, key: bytes | None, value: bytes | None, headers: list[Any]
    ) -> tuple[str, str] | None:
        """Produce one record and wait for its delivery report: None when acknowledged,
        else (error name, one line). Waits at most ``dlq_timeout`` and a little more: the
        producer's own ``message.timeout.ms`` fails the record by then."""
        from confluent_kafka import KafkaException

        delivered: list[Any] = []
        try:
            self._producer.produce(
                topic,
                value=value,
                key=key,
                headers=headers,
                on_delivery=lambda err, _msg: delivered.append(err),
            )
        except KafkaException as exc:  # refused before sending: too large, bad topic, ...
            error = exc.args[0] if exc.args else None
            return _name(error), f"could not dead-letter to {topic}: {kafka_text(exc)}"
        except BufferError as exc:
            return "QUEUE_FULL", f"could not dead-letter to {topic}: {exc}"
        self._producer.flush(self.options.dlq_timeout + 5)
        if delivered and delivered[0] is None:
            return None
        self._renew()
        if not delivered:
            return "_TIMED_OUT", f"could not dead-letter to {topic}: no acknowledgement"
        error = delivered[0]
        return _name(error), f"could not dead-letter to {topic}: {error.str()}"

    def close(self) -> None:
        self._producer.flush(10)


def _name(error: Any) -> str:
    from confluent_kafka import KafkaError

    return str(error.name()) if isinstance(error, KafkaError) else "UNKNOWN"


def kafka_text(exc: BaseException) -> str:
    """A KafkaException's own words (librdkafka's), not its repr."""
    from confluent_kafka import KafkaError

    error = exc.args[0] if exc.args else None
    return str(error.str()) if isinstance(error, KafkaError) else str(exc)
