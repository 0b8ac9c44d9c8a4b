"""What a message comes to once the policy decided, written once for both Kafka front ends:
``idemctl consume``'s loop (confluent-kafka, threads) and the FastStream middleware
(aiokafka, asyncio). Each asks ``Acts`` what to do with a run's result, with a message that
has no usable key, or with its dead letter's fate, and does the Kafka part its own way
(produce the dead letter, pause the partition, store or commit the offset). Counting,
logging, the refused dead letters' back-off and the dead-letter breaker live here."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from idemctl.kafka.options import Handling, Summary
from idemctl.kafka.policy import (
    DEAD_LETTERED,
    REFUSED,
    SKIPPED,
    Act,
    Breaker,
    Refusals,
    Spelling,
    decide,
    log_line,
)
from idemctl.model import Order
from idemctl.runner import RunResult


class Placed(Protocol):
    """A message as the acts need it: where it is, its key and the guard's order."""

    @property
    def key(self) -> str | None: ...
    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def order(self) -> Order | None: ...
    @property
    def bad(self) -> tuple[str, str] | None: ...


@dataclass(frozen=True, slots=True)
class Finished:
    """The message is done: counted under ``outcome``. ``ran``: its handler ran now or
    before, and its result stands (not stale, not skipped)."""

    outcome: str
    ran: bool = False


@dataclass(frozen=True, slots=True)
class Paused:
    """Pause the message's partition at it for ``seconds``; ``why`` is counted then."""

    seconds: float
    why: str


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Write the message to its dead-letter topic; once the broker took it, count ``then``
    (the outcome of the run that sent it there) if any."""

    reason: str
    detail: str
    error: BaseException | None = None
    then: str | None = None


Next = Finished | Paused | DeadLetter | None
"""What to do with a message; None: a batch completes it, and its answer comes back."""


def where(item: Placed) -> str:
    return f"{item.topic}[{item.partition}]@{item.offset}"


def about(item: Placed, outcome: str, **more: Any) -> dict[str, Any]:
    """A log call's ``extra`` about ``item``: its key, topic, partition and offset, and
    ``outcome``, the name ``Summary.counts`` counts it under (the CLI's JSON and logfmt
    lines carry them as fields)."""
    fields = dict(
        key=item.key,
        topic=item.topic,
        partition=item.partition,
        offset=item.offset,
        outcome=outcome,
        **more,
    )
    return {"idemctl": fields}


class Acts:
    """One front end's acts: ``summary`` counts them, ``log`` tells them, ``spell`` names
    an option the way its users give it (``--on-missing-key skip``, ``on_missing_key=``)."""

    def __init__(
        self, options: Handling, summary: Summary, log: logging.Logger, spell: Spelling
    ) -> None:
        self.options, self.summary, self.log, self.spell = options, summary, log, spell
        self.refusals = Refusals(options.backoff)
        self.breaker = Breaker(options.dlq_breaker)
        self._lock = threading.Lock()

    def count(self, outcome: str, n: int = 1) -> None:
        if not n:
            return
        with self._lock:
            self.summary.counts[outcome] += n
            if outcome in ("executed", "replayed"):
                self.breaker.ran()

    def after(self, item: Placed, result: RunResult) -> Next:
        """What ``result``, the run at ``item``'s key, comes to in Kafka (``decide``)."""
        d = decide(result, self.options, item.key, item.order)
        if d.act is Act.PENDING:
            return None
        if d.act is Act.DEAD_LETTER:
            return DeadLetter(d.reason, d.detail, d.error, d.outcome or None)
        if d.act is Act.FINISH and d.outcome != "stale":
            self.count(d.outcome)
            return Finished(d.outcome, ran=True)
        level, text, args = log_line(d, where(item), item.key)
        more: dict[str, Any] = {}
        if d.outcome == "stale":
            more["entity"] = item.order.entity if item.order else None
        elif d.outcome == "retried":
            more["attempt"] = d.attempt
        getattr(self.log, level)(text, *args, extra=about(item, d.outcome, **more))
        if d.act is Act.FINISH:
            self.count(d.outcome)
            return Finished(d.outcome)
        return Paused(d.delay, d.outcome)

    def unusable(self, item: Placed) -> Finished | DeadLetter:
        """A message with no usable key: dead-lettered, or passed by (``skip``)."""
        assert item.bad is not None
        reason, detail = item.bad
        if self.options.on_missing_key != "skip":
            return DeadLetter(reason, detail)
        self.count("skipped")
        self.log.warning(
            SKIPPED,
            where(item),
            reason,
            detail,
            self.spell("on_missing_key", "skip"),
            extra=about(item, "skipped", reason=reason),
        )
        return Finished("skipped")

    def refused(self, item: Placed, reason: str, refusal: str) -> Paused:
        """The broker refused ``item``'s dead letter: pause its partition, the back-off
        doubling with each refusal in a row."""
        wait = self.refusals.refused((item.topic, item.partition))
        self.log.warning(
            REFUSED,
            where(item),
            reason,
            refusal,
            wait,
            extra=about(item, "dead_letter_refused", reason=reason),
        )
        return Paused(wait, "dead_letter_refused")

    def dead_lettered(self, item: Placed, reason: str, detail: str, topic: str) -> str | None:
        """The broker took ``item``'s dead letter into ``topic``: counted and told. What
        stopping says when this one trips the breaker (``dlq_breaker`` in a row for one
        reason), else None."""
        self.refusals.accepted((item.topic, item.partition))
        self.count("dead_lettered")
        with self._lock:
            self.summary.dead_letters[reason] += 1
        self.log.warning(
            DEAD_LETTERED,
            where(item),
            topic,
            reason,
            detail,
            extra=about(item, "dead_lettered", reason=reason, dlq_topic=topic),
        )
        with self._lock:
            if self.breaker.dead_lettered(reason):
                return self.breaker.storm(detail, topic, self.spell)
        return None
