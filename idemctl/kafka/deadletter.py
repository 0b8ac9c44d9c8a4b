"""Dead letters as every Kafka front end of idemctl writes them (``idemctl consume``'s
confluent-kafka producer and the FastStream middleware's aiokafka one): the topic, Spring
Kafka's header names and encodings (so Java tools read them), and the size limits."""

from __future__ import annotations

from collections.abc import Sequence

RECEIVE_MAX = 100_000_000
"""librdkafka's default ``receive.message.max.bytes``: the largest message a consumer reads."""
HEADROOM = 64 * 1024
"""Bytes a dead letter adds to its message: the headers that say where and why."""


def dead_letter_topic(dlq_topic: str | None, topic: str) -> str:
    """Where a message of ``topic`` goes: ``dlq_topic`` if given, else ``<topic>.dlq``."""
    return dlq_topic or f"{topic}.dlq"


def dead_letter_headers(
    original: Sequence[tuple[str, bytes | None]],
    topic: str,
    partition: int,
    offset: int,
    group: str,
    reason: str,
    detail: str,
    exc: BaseException | None,
) -> list[tuple[str, bytes | None]]:
    """A dead letter's headers: the message's own, then where it came from and why, under
    Spring Kafka's names and encodings (partition a 4-byte and offset an 8-byte big-endian
    integer), and ``idemctl-dlt-reason``. The same for every Kafka client idemctl drives."""
    return [
        *original,
        ("kafka_dlt-original-topic", topic.encode()),
        ("kafka_dlt-original-partition", partition.to_bytes(4, "big", signed=True)),
        ("kafka_dlt-original-offset", offset.to_bytes(8, "big", signed=True)),
        ("kafka_dlt-original-consumer-group", group.encode()),
        ("kafka_dlt-exception-fqcn", fqcn(exc).encode()),
        ("kafka_dlt-exception-message", f"{reason}: {detail}".encode()[:4000]),
        ("idemctl-dlt-reason", reason.encode()),
    ]


def fqcn(exc: BaseException | None) -> str:
    if exc is None:
        return "idemctl.consume.DeadLetter"
    return f"{type(exc).__module__}.{type(exc).__qualname__}"
