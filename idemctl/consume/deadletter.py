"""The dead-letter topic: where a message goes that will never be handled, so its partition
can go on. A dead letter is finished only once the broker acknowledged it; one the broker
refuses (too large, no rights, no such topic, brokers down) leaves its message unfinished:
the partition waits at it, with back-off, until the dead letter is written. The topic and
the headers are ``idemctl.kafka.deadletter``'s, shared with the FastStream middleware; this
is consume's confluent-kafka producer of them."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
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


@dataclass(eq=False)
class Letter:
    """A dead letter posted: ``answered`` once the broker acknowledged it (``refusal`` None)
    or refused it (``refusal`` says why, in one line)."""

    msg: Any
    topic: str
    headers: list[Any]
    answered: bool = False
    refusal: str | None = None
    cut: str = ""
    """Why it was written again with its payload cut (``--dlq-oversize truncate``)."""
    sent: float = 0.0


class DeadLetters:
    """Writes dead letters with Spring Kafka's header names and encodings (so Java tools read
    them), from the loop's thread: ``post`` sends, ``poll`` takes the answers in."""

    def __init__(self, options: ConsumeOptions, consumer_config: dict[str, Any]) -> None:
        from confluent_kafka import KafkaException, Producer

        self.options = options
        self._config = producer_config(consumer_config, options.dlq_timeout)
        try:
            self._producer = Producer(self._config, logger=kafka_log)
        except KafkaException as exc:
            raise ConfigError(f"Kafka client settings: {kafka_text(exc)}") from None
        self._flying: set[Letter] = set()
        self._reports: list[tuple[Letter, Any]] = []
        self._failed = False
        """A delivery failed: the producer is renewed once no other letter is on its way."""

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

    def post(
        self, msg: Any, reason: str, detail: str, exc: BaseException | None, span: Any = None
    ) -> Letter:
        """Write ``msg`` to its dead-letter topic without waiting: the letter is answered
        by a later ``poll`` (acknowledged, or why not, in one line). A record refused as
        too large is written again with its payload cut under ``--dlq-oversize truncate``.
        With a tracing ``span``, its trace context replaces the message's ``traceparent``."""
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
        letter = Letter(msg, self.topic(msg), headers)
        self._produce(letter, msg.value(), headers)
        return letter

    def poll(self) -> None:
        """Take the broker's answers in: each answered letter says so. A letter with no
        answer past ``dlq_timeout`` and a little more (the producer's own
        ``message.timeout.ms`` fails it by then) is taken as refused."""
        self._producer.poll(0)
        reports, self._reports = self._reports, []
        for letter, error in reports:
            if error is None:
                letter.answered = True
                if letter.cut:
                    self._said_cut(letter)
            else:
                self._failed = True
                self._refused(letter, _name(error), error.str())
        now = time.monotonic()
        for letter in [x for x in self._flying if now - x.sent > self.options.dlq_timeout + 5]:
            self._flying.discard(letter)
            self._failed = True
            self._refused(letter, "_TIMED_OUT", "no acknowledgement")
        self._renew_if_idle()

    def _renew_if_idle(self) -> None:
        """Renew the producer after a failed delivery, once no other letter is on its way
        (a renewal drops what the producer holds)."""
        if self._failed and not self._flying:
            self._renew()
            self._failed = False

    def _produce(self, letter: Letter, value: bytes | None, headers: list[Any]) -> None:
        from confluent_kafka import KafkaException

        def reported(error: Any, _msg: Any) -> None:  # in poll(), on the loop's thread
            self._flying.discard(letter)
            self._reports.append((letter, error))

        letter.sent = time.monotonic()
        try:
            self._producer.produce(
                letter.topic, value=value, key=letter.msg.key(), headers=headers,
                on_delivery=reported,
            )  # fmt: skip
        except KafkaException as exc:  # refused before sending: too large, bad topic, ...
            error = exc.args[0] if exc.args else None
            self._refused(letter, _name(error), kafka_text(exc))
        except BufferError as exc:
            self._refused(letter, "QUEUE_FULL", str(exc))
        else:
            self._flying.add(letter)

    def _refused(self, letter: Letter, name: str, text: str) -> None:
        """``letter`` was not written: answered so, or written again with its payload cut."""
        refusal = f"could not dead-letter to {letter.topic}: {text}"
        value: bytes | None = letter.msg.value()
        if name in OVERSIZE and value is not None and not letter.cut:
            if self.options.dlq_oversize == "truncate":
                self._renew_if_idle()
                letter.cut = refusal
                cut = [
                    *letter.headers,
                    ("idemctl-dlt-truncated", f"{len(value)} bytes, cut to {TRUNCATE_TO}".encode()),
                ]
                self._produce(letter, value[:TRUNCATE_TO], cut)
                return
            refusal += " (--dlq-oversize truncate writes it with the payload cut)"
        letter.answered, letter.refusal = True, refusal

    @staticmethod
    def _said_cut(letter: Letter) -> None:
        msg, value = letter.msg, letter.msg.value()
        log.warning(
            "dead letter of %s[%d]@%d cut from %d to %d payload bytes (%s); the original "
            "stays at that offset while the topic's retention lasts",
            msg.topic(),
            msg.partition(),
            msg.offset(),
            len(value),
            TRUNCATE_TO,
            letter.cut,
            extra={
                "idemctl": {
                    "topic": msg.topic(),
                    "partition": msg.partition(),
                    "offset": msg.offset(),
                    "dlq_topic": letter.topic,
                    "truncated_from": len(value),
                }
            },
        )

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
