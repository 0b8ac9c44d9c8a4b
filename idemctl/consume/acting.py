"""The consume loop's acts on a message once the policy decided, by the shared act layer
(``idemctl.kafka.acts``, which the FastStream middleware drives too): this part writes dead
letters with confluent-kafka, carrying the trace on."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from idemctl.consume.event import Event
from idemctl.consume.item import Item, Pause
from idemctl.consume.options import ConsumeOptions
from idemctl.kafka.acts import Acts, DeadLetter, Finished, Paused, about, where
from idemctl.kafka.options import Summary
from idemctl.runner import RunResult

if TYPE_CHECKING:
    from idemctl.consume.deadletter import DeadLetters
    from idemctl.consume.traced import Tracing


class Acting:
    """A part of Consumer: what it does with a message once the policy has decided."""

    options: ConsumeOptions
    summary: Summary
    _acts: Acts
    _dlq: DeadLetters | None
    _trace: Tracing | None
    _storm_tripped: str | None
    _owns: Callable[[Item], bool]

    def _count(self, outcome: str, n: int = 1) -> None:
        self._acts.count(outcome, n)

    def _act(self, item: Item, result: RunResult) -> Pause | None:
        """What a RunResult comes to in Kafka, for both modes: None when the message is
        finished (or its completion is on its way), else how long to pause its partition
        and why."""
        return self._do(item, self._acts.after(item, result))

    def _unusable(self, item: Item) -> Pause | None:
        """A message that cannot be claimed: dead-lettered, or passed by (``skip``)."""
        return self._do(item, self._acts.unusable(item))

    def _do(self, item: Item, next_: Finished | Paused | DeadLetter | None) -> Pause | None:
        if isinstance(next_, DeadLetter):
            wait = self._dead_letter(item, next_.reason, next_.detail, next_.error)
            if wait is None and next_.then:
                self._count(next_.then)
            return wait
        if isinstance(next_, Finished):
            item.done, item.outcome = True, next_.outcome
            return None
        if isinstance(next_, Paused):
            return next_.seconds, next_.why
        return None  # completed (or not) by the batch: its answer comes back here

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

    def _dead_letter(
        self, item: Item, reason: str, detail: str, exc: BaseException | None = None
    ) -> Pause | None:
        """Produce the message to the dead-letter topic and wait for the broker's ack;
        only then is it finished (and its offset may be stored). A dead letter the broker
        refuses pauses the partition. The ``dlq_breaker``-th in a row for one reason trips
        the breaker: the round ends and the consumer stops."""
        if self._storm_tripped is not None:
            return None  # left unfinished: the consumer stops before storing its offset
        if not self._owns(item):
            # Revoked while its handler ran: the partition's next owner (maybe this
            # consumer again) gets the message again and dead-letters it (``failed
            # before``); a letter from here too would be a second one (CI: two for one
            # key under --processes). Left unfinished.
            self._acts.log.info(
                "%s (key %r) not dead-lettered here (%s): its partition was revoked while "
                "its handler ran, and its next owner dead-letters it",
                where(item),
                item.key,
                reason,
                extra=about(item, "revoked", reason=reason),
            )
            return 0.0, "revoked"
        assert self._dlq is not None
        m = item.msg
        if self._trace is None or item.span is None:
            refused = self._dlq.send(m, reason, detail, exc)
        else:  # the dead letter carries the trace on
            with self._trace.dead_letter(item.span, reason, self._dlq.topic(m)) as span:
                refused = self._dlq.send(m, reason, detail, exc, span)
        if refused is not None:
            paused = self._acts.refused(item, reason, refused)
            return paused.seconds, paused.why
        item.done, item.outcome = True, "dead_lettered"
        storm = self._acts.dead_lettered(item, reason, detail, self._dlq.topic(m))
        if storm is not None and self._storm_tripped is None:
            self._storm_tripped = (
                f"{storm}, and the offsets of this last batch were not committed. Fix the "
                "cause (often --key or the handler) and start again"
            )
        return None
