"""The Kafka message policy of ``idemctl consume`` and of the FastStream middleware, written
once and free of I/O.

- ``Keying.admit``: what a message is: its key, fingerprint and order, or why it has none
  usable (``--on-missing-key``); a key template the first message cannot fill, and
  ``--on-missing-key stop``, refuse to go on.
- ``decide``: what a run's outcome comes to in Kafka: finish the message, leave it to the
  batch (its completion is on its way), pause its partition a while, or dead-letter it.
- ``log_line``: the line each decision is logged with.
- ``Breaker``: dead letters in a row for one reason; at ``--dlq-breaker`` the consumer stops.
- ``Refusals``: the back-off of a partition whose dead letter the broker refused, doubling
  with each refusal in a row.

The loop and the middleware keep their I/O: fetching, claiming through the runner,
producing dead letters, seeking, pausing and committing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from idemctl.errors import (
    AttemptsExhausted,
    ConfigError,
    ConsumeAborted,
    InvalidKey,
    InvalidPayload,
)
from idemctl.kafka.keys import Message, MissingField, key_strategy, order_strategy, unusable_reason
from idemctl.model import Order
from idemctl.runner import Outcome, RunResult, Step

if TYPE_CHECKING:
    from idemctl.kafka.options import Handling

MAX_BACKOFF = 60.0
"""Seconds a partition is paused at most, whatever the back-off doubled to."""

Spelling = Callable[[str, Any], str]
"""How an option is named in a message: ``--on-missing-key stop`` on the command line,
``on_missing_key='stop'`` for the middleware's keyword arguments."""


def flag(option: str, value: Any) -> str:
    return f"--{option.replace('_', '-')} {value}"


def keyword(option: str, value: Any) -> str:
    return f"{option}={value!r}"


@dataclass(slots=True)
class Admission:
    """A message as the policy sees it: its key (None when it has none usable, and
    ``bad`` says why: reason, detail), fingerprint and the sequence guard's order."""

    key: str | None
    fingerprint: str | None = None
    order: Order | None = None
    bad: tuple[str, str] | None = None


class KeyOptions(Protocol):
    """The options a message's key is derived by: Handling (consume's, the FastStream
    middleware's), audit's AuditOptions."""

    key: str
    on_missing_key: str
    order_key: str | None
    sequence: str | None


class Keying:
    """Keys messages by ``--key`` and the sequence guard's ``--order-key``/``--sequence``,
    applying ``--on-missing-key`` to a message without a usable key. ``refuse``: whether
    a template the first message cannot fill, and ``stop``, raise (consume's refusals);
    without, such a message is only unusable (audit judges it)."""

    def __init__(self, options: KeyOptions, spell: Spelling = flag, refuse: bool = True) -> None:
        self.options, self.spell, self.refuse = options, spell, refuse
        self._strategy = key_strategy(options.key)
        self._by_offset = key_strategy("offset")
        self._order = (
            order_strategy(options.order_key, options.sequence)
            if options.order_key is not None and options.sequence is not None
            else None
        )
        self._first = True

    @property
    def ordered(self) -> bool:
        """Whether the sequence guard orders the events (``--order-key``/``--sequence``)."""
        return self._order is not None

    def admit(self, message: Message) -> Admission:
        """ConfigError when the key template cannot fill the very first message (a JSON
        object without its field: the template is wrong, not the message); ConsumeAborted
        for a message without a usable key under ``on_missing_key`` stop."""
        first, self._first = self._first, False
        o = self.options
        try:
            key = self._strategy(message)
            order = None if self._order is None else self._order(message)
            return Admission(key, message.fingerprint(), order)
        except (InvalidKey, InvalidPayload) as exc:
            where = f"{message.topic}[{message.partition}]@{message.offset}"
            if (
                self.refuse
                and first
                and isinstance(exc, MissingField)
                and o.on_missing_key == "dlq"
            ):
                raise ConfigError(
                    f"{self.spell('key', o.key)} cannot work: the first message, {where}, is a "
                    f"JSON object but {exc}; stopping before anything is claimed or "
                    "dead-lettered"
                ) from None
            reason = unusable_reason(exc)
            if o.on_missing_key == "offset":
                try:
                    fingerprint = message.fingerprint()
                except InvalidPayload:
                    fingerprint = None  # the offset is the key: nothing to compare it with
                return Admission(self._by_offset(message), fingerprint)
            if self.refuse and o.on_missing_key in ("stop", "fail"):
                raise ConsumeAborted(
                    f"message {where}: {reason} ({exc}); stopping "
                    f"({self.spell('on_missing_key', o.on_missing_key)})"
                ) from None
            return Admission(None, bad=(reason, str(exc)))


class Act(StrEnum):
    FINISH = "finish"
    """Finished: its offset may be committed."""
    PENDING = "pending"
    """Run by the batch, its completion (or release) on its way: decided when that comes."""
    PAUSE = "pause"
    """Not finished: its partition waits ``delay`` seconds at it, then it comes again."""
    DEAD_LETTER = "dead_letter"
    """To the dead-letter topic; finished once the broker acknowledged it."""


class Decision(NamedTuple):
    act: Act
    outcome: str = ""
    """What it is counted as (``Summary.counts``); for a dead letter, what is counted
    besides ``dead_lettered`` once it is written (``stale``), if anything."""
    delay: float = 0.0
    reason: str = ""
    """A dead letter's reason (its ``idemctl-dlt-reason`` header)."""
    detail: str = ""
    error: BaseException | None = None
    attempt: int = 0


def decide(
    result: RunResult, options: Handling, key: str | None, order: Order | None = None
) -> Decision:
    """What ``result`` (the runner's answer for the message's ``key``) comes to in Kafka."""
    outcome = result.outcome
    if outcome in (Outcome.EXECUTED, Outcome.REPLAYED):
        return Decision(Act.FINISH, outcome.value)
    if outcome in (Step.RAN, Step.RELEASED, Step.HELD):
        return Decision(Act.PENDING, outcome.value)
    if outcome in (Outcome.BUSY, Outcome.LEASE_LOST):
        return Decision(Act.PAUSE, outcome.value, options.backoff)
    if outcome is Step.UNAVAILABLE:
        return Decision(Act.PAUSE, "store_unavailable", options.backoff, error=result.error)
    if outcome is Outcome.MISMATCH:
        detail = f"key {key!r} was seen before with another payload"
        return Decision(Act.DEAD_LETTER, reason="fingerprint mismatch", detail=detail)
    if outcome is Outcome.FAILED:
        error = result.record.error if result.record else None
        return Decision(Act.DEAD_LETTER, reason="failed before", detail=error or "")
    if outcome is Outcome.STALE:
        detail = (
            f"entity {order.entity!r} applied sequence {result.last}; this event is "
            f"{order.sequence}"
            if order is not None
            else "the entity applied a later sequence"
        )
        if options.on_stale == "dlq":
            return Decision(Act.DEAD_LETTER, "stale", reason="stale event", detail=detail)
        return Decision(Act.FINISH, "stale", detail=detail)
    if outcome is Outcome.ERROR:
        verdict = failure_verdict(result, options.max_attempts, options.backoff)
        if verdict.dead_letter is not None:
            return Decision(
                Act.DEAD_LETTER, reason=verdict.dead_letter, detail=verdict.error,
                error=result.error,
            )  # fmt: skip
        return Decision(
            Act.PAUSE, "retried", verdict.retry_in, detail=verdict.error, attempt=verdict.attempt
        )
    raise AssertionError(f"no decision for {outcome}")


def log_line(decision: Decision, where: str, key: str | None) -> tuple[str, str, tuple[Any, ...]]:
    """The level, format and arguments ``decision`` is logged with (finished runs and the
    batch's pending ones are not logged here; dead letters are logged once written)."""
    d = decision
    if d.outcome == "stale":
        return "info", "stale %s: %s: skipped", (where, d.detail)
    if d.outcome == "store_unavailable":
        return "warning", "store unavailable, will retry: %s", (d.error,)
    if d.outcome == "retried":
        return "info", "%s failed (attempt %d), retrying: %s", (key, d.attempt, d.detail)
    return "debug", "%s %s: key %r; pausing its partition %.1fs", (d.outcome, where, key, d.delay)


class Breaker:
    """Dead letters in a row for one reason: ``limit`` of them trips it (0: never). A
    message that ran (executed or replayed) starts the count again."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.reason: str | None = None
        self.count = 0

    def ran(self) -> None:
        self.reason, self.count = None, 0

    def dead_lettered(self, reason: str) -> bool:
        """Count one; True when this one trips the breaker."""
        if reason != self.reason:
            self.reason, self.count = reason, 0
        self.count += 1
        return bool(self.limit) and self.count == self.limit

    def storm(self, detail: str, topic: str, spell: Spelling) -> str:
        """What stopping says, the breaker just tripped for ``detail``, into ``topic``."""
        return (
            f"{self.count} messages in a row were dead-lettered for the same reason "
            f"({self.reason}: {detail}); stopping ({spell('dlq_breaker', self.limit)}): they "
            f"are in {topic}"
        )


class Refusals:
    """Dead letters the broker refused in a row, per partition: the back-off before the
    next try doubles with each, at most MAX_BACKOFF."""

    def __init__(self, backoff: float) -> None:
        self.backoff = backoff
        self._in_a_row: dict[tuple[str, int], int] = {}

    def refused(self, tp: tuple[str, int]) -> float:
        n = self._in_a_row[tp] = self._in_a_row.get(tp, 0) + 1
        return float(min(self.backoff * 2 ** (n - 1), MAX_BACKOFF))

    def accepted(self, tp: tuple[str, int]) -> None:
        self._in_a_row.pop(tp, None)


REFUSED = (
    "%s (%s) is neither handled nor dead-lettered: %s; pausing its partition there, trying "
    "again in %.1fs; nothing past it is committed"
)
"""The warning for a refused dead letter: where, reason, the broker's answer, the wait."""
DEAD_LETTERED = "dead-lettered %s to %s: %s: %s"
"""The warning for a dead letter written: where, its topic, reason, detail."""
SKIPPED = "skipped %s: %s: %s (%s)"
"""The warning for a message passed by: where, reason, detail, the option that said so."""


@dataclass(frozen=True)
class FailureVerdict:
    """What a handler's failure (``Outcome.ERROR``) comes to in Kafka."""

    error: str
    """The exception as ``Type: message``."""
    attempt: int
    dead_letter: str | None
    """The dead letter's reason when the message goes to the dead-letter topic now."""
    retry_in: float
    """Otherwise: seconds its partition waits before the message runs again."""


def failure_verdict(result: RunResult, max_attempts: int, backoff: float) -> FailureVerdict:
    """A handler failed on its ``attempt``-th run (or was not run again: AttemptsExhausted):
    dead-letter it (its last allowed attempt, or a permanent failure), else retry it after
    ``backoff`` doubled per attempt."""
    exc = result.error
    assert exc is not None
    error = f"{type(exc).__name__}: {exc}"
    attempt = result.attempt or 1
    if isinstance(exc, AttemptsExhausted) or (result.retriable and attempt >= max_attempts):
        return FailureVerdict(error, attempt, f"failed {max_attempts} times", 0.0)
    if not result.retriable:
        return FailureVerdict(error, attempt, "permanent failure", 0.0)
    return FailureVerdict(error, attempt, None, float(backoff * 2 ** (attempt - 1)))
