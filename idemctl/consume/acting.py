"""The consume loop's acts on a message once the policy decided: count it, log it, pause
its partition or write its dead letter (and count the storm), by ``consume.policy``."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from idemctl.consume.event import Event
from idemctl.consume.item import Item, Pause, about
from idemctl.consume.options import ConsumeOptions, Summary
from idemctl.consume.policy import (
    DEAD_LETTERED,
    REFUSED,
    SKIPPED,
    Act,
    Breaker,
    Refusals,
    decide,
    flag,
    log_line,
)
from idemctl.consume.watch import log
from idemctl.runner import RunResult

if TYPE_CHECKING:
    from idemctl.consume.deadletter import DeadLetters
    from idemctl.consume.traced import Tracing


class Acting:
    """A part of Consumer: what it does with a message once the policy has decided."""

    options: ConsumeOptions
    summary: Summary
    _counting: threading.Lock
    _dlq: DeadLetters | None
    _trace: Tracing | None
    _refusals: Refusals
    _breaker: Breaker
    _storm_tripped: str | None

    def _count(self, outcome: str, n: int = 1) -> None:
        if not n:
            return
        with self._counting:
            self.summary.counts[outcome] += n
            if outcome in ("executed", "replayed"):
                self._breaker.ran()

    def _act(self, item: Item, result: RunResult) -> Pause | None:
        """What a RunResult comes to in Kafka, by the policy's ``decide``, for both modes:
        None when the message is finished (or its completion is on its way), else how long
        to pause its partition and why."""
        d = decide(result, self.options, item.key, item.order)
        if d.act is Act.PENDING:
            return None  # completed (or not) by the batch: its answer comes back here
        if d.act is Act.DEAD_LETTER:
            wait = self._dead_letter(item, d.reason, d.detail, d.error)
            if wait is None and d.outcome:
                self._count(d.outcome)
            return wait
        if d.act is Act.FINISH:
            item.done, item.outcome = True, d.outcome
            self._count(d.outcome)
            if d.outcome != "stale":
                return None
        level, text, args = log_line(d, f"{item.tp[0]}[{item.tp[1]}]@{item.offset}", item.key)
        more: dict[str, Any] = {}
        if d.outcome == "stale":
            more["entity"] = item.order.entity if item.order else None
        elif d.outcome == "retried":
            more["attempt"] = d.attempt
        getattr(log, level)(text, *args, extra=about(item, d.outcome, **more))
        return None if d.act is Act.FINISH else (d.delay, d.outcome)

    def _unusable(self, item: Item) -> Pause | None:
        """A message that cannot be claimed: dead-lettered, or passed by (``skip``)."""
        assert item.bad is not None
        reason, detail = item.bad
        if self.options.on_missing_key != "skip":
            return self._dead_letter(item, reason, detail)
        item.done, item.outcome = True, "skipped"
        self._count("skipped")
        m = item.msg
        log.warning(
            SKIPPED,
            f"{m.topic()}[{m.partition()}]@{m.offset()}",
            reason,
            detail,
            flag("on_missing_key", "skip"),
            extra=about(item, "skipped", reason=reason),
        )
        return None

    @staticmethod
    def _event(item: Item) -> Event:
        m = item.msg
        kind, timestamp = m.timestamp()
        headers = tuple(m.headers() or ())
        return Event(
            m.topic(),
            m.partition(),
            m.offset(),
            m.key(),
            m.value(),
            headers,
            timestamp if kind else None,
        )

    # Dead letters and offsets -------------------------------------------------------------

    def _dead_letter(
        self, item: Item, reason: str, detail: str, exc: BaseException | None = None
    ) -> Pause | None:
        """Produce the message to the dead-letter topic and wait for the broker's ack;
        only then is it finished (and its offset may be stored). A dead letter the broker
        refuses pauses the partition, the back-off doubling with each refusal in a row. The
        ``dlq_breaker``-th in a row for one reason trips the breaker: the round ends and
        the consumer stops."""
        if self._storm_tripped is not None:
            return None  # left unfinished: the consumer stops before storing its offset
        assert self._dlq is not None
        m, tp = item.msg, item.tp
        if self._trace is None or item.span is None:
            refused = self._dlq.send(m, reason, detail, exc)
        else:  # the dead letter carries the trace on
            with self._trace.dead_letter(item.span, reason, self._dlq.topic(m)) as span:
                refused = self._dlq.send(m, reason, detail, exc, span)
        where = f"{m.topic()}[{m.partition()}]@{m.offset()}"
        if refused is not None:
            wait = self._refusals.refused(tp)
            log.warning(
                REFUSED,
                where,
                reason,
                refused,
                wait,
                extra=about(item, "dead_letter_refused", reason=reason),
            )
            return wait, "dead_letter_refused"
        self._refusals.accepted(tp)
        item.done, item.outcome = True, "dead_lettered"
        self._count("dead_lettered")
        with self._counting:
            self.summary.dead_letters[reason] += 1
        topic = self._dlq.topic(m)
        log.warning(
            DEAD_LETTERED,
            where,
            topic,
            reason,
            detail,
            extra=about(item, "dead_lettered", reason=reason, dlq_topic=topic),
        )
        self._storm_count(reason, detail, topic)
        return None

    def _storm_count(self, reason: str, detail: str, topic: str) -> None:
        with self._counting:
            if self._breaker.dead_lettered(reason) and self._storm_tripped is None:
                self._storm_tripped = (
                    f"{self._breaker.storm(detail, topic, flag)}, and the offsets of this last "
                    "batch were not committed. Fix the cause (often --key or the handler) and "
                    "start again"
                )
