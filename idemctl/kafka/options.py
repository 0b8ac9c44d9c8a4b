"""How a Kafka message is handled, declared once for every Kafka front end of idemctl:
``Keyed`` (how a message's key, entity and sequence are derived; ``audit`` looks keys up
so), ``Handling`` (``Keyed`` and what happens to each message: its attempts, its dead
letter, the sequence guard; ``idemctl consume`` and the FastStream middleware take it) and
``Summary`` (what a run did). Each field the command line takes carries its flag, help and
command-line default (``idemctl.kafka.flags``); the CLI's parameters are built from them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from idemctl.durations import MAX_TIMEOUT_MS
from idemctl.errors import ConfigError
from idemctl.kafka.flags import option
from idemctl.kafka.keys import DEFAULT_KEY_STRATEGY, key_strategy, order_strategy
from idemctl.stores.limits import LEASE_RANGE, in_range


@dataclass(kw_only=True)
class Keyed:
    """How a message's key (and the sequence guard's entity and sequence) is derived:
    ``idemctl consume`` and the FastStream middleware key messages so, ``audit`` looks the
    keys up again so."""

    key: str = option(
        DEFAULT_KEY_STRATEGY, metavar="STRATEGY",
        help="Key strategy: header:NAME, template:{field}:{field}, payload-hash, offset",
    )  # fmt: skip
    on_missing_key: str = option(
        "dlq", metavar="ACTION",
        help="A message without a usable key, or with an unreadable payload: dlq, offset "
        "(topic-partition-offset as its key), skip or stop",
    )  # fmt: skip
    """For a message without a usable key (none, or one ``validate_key`` refuses) or with a
    payload the fingerprint or the key template cannot read: dlq: dead-letter it; offset: use
    topic-partition-offset as its key; skip: pass it by (its offset is stored); stop (or
    fail): stop the consumer without storing its offset."""
    order_key: str | None = option(
        None, metavar="TEMPLATE",
        help="Sequence guard: the entity an event changes, e.g. account:{account_id} or "
        "header:NAME; with --sequence, an event older than the entity's last applied one "
        "is not run (stale)",
    )  # fmt: skip
    """The sequence guard's entity (``account:{account_id}`` or ``header:NAME``); with
    ``sequence``, an event runs only if its sequence is above the entity's last applied."""
    sequence: str | None = option(
        None, metavar="FIELD",
        help="Sequence guard: the event's sequence, a payload field or header:NAME "
        "(whole numbers or ISO 8601 timestamps)",
    )  # fmt: skip
    """Where the event's sequence is: a payload field or ``header:NAME`` (whole numbers,
    or ISO 8601 timestamps)."""

    def __post_init__(self) -> None:
        if self.on_missing_key not in ("dlq", "offset", "skip", "stop", "fail"):
            raise ConfigError(
                f"--on-missing-key {self.on_missing_key!r}: use dlq, offset, skip or stop"
            )
        key_strategy(self.key)  # fails early on a bad strategy
        if (self.order_key is None) != (self.sequence is None):
            raise ConfigError("--order-key and --sequence go together: give both or neither")
        if self.order_key is not None and self.sequence is not None:
            order_strategy(self.order_key, self.sequence)


@dataclass(kw_only=True)
class Handling(Keyed):
    """What happens to each message: its key, its attempts, its dead letter, the sequence
    guard. ``idemctl consume`` and the FastStream middleware take these alike."""

    on_stale: str = option(
        "skip", metavar="ACTION",
        help="A stale event: skip (offset stored, logged at info) or dlq",
    )  # fmt: skip
    """An event the guard finds stale: skip (its offset is stored, logged at info) or dlq
    (dead-lettered, then stored)."""
    dlq_breaker: int = option(
        20, least=0, metavar="N",
        help="Stop (exit 8) when N messages in a row are dead-lettered for the same reason; "
        "0: never",
    )  # fmt: skip
    """Stop (ConsumeStopped) when this many messages in a row are dead-lettered for the same
    reason: a storm says the consumer is misconfigured, not that the messages are bad.
    0: never."""
    dlq_timeout: float = option(
        30.0, kind="duration", given="30s", metavar="DURATION",
        help="How long the broker has to acknowledge a dead letter before the partition "
        "waits and it is tried again",
    )  # fmt: skip
    """Seconds the broker has to acknowledge a dead letter; past it, the message's partition
    waits (with back-off) and the dead letter is tried again."""
    lease: float | None = option(
        None, kind="duration", given="30s", metavar="DUR", help="Lease per claim"
    )
    max_attempts: int = option(5, least=1, metavar="N", help="Runs before dead-lettering")
    backoff: float = option(
        1.0, kind="duration", given="1s", metavar="DUR", help="First retry delay, doubling"
    )
    """Seconds before the first retry; doubled each attempt, at most 60 s."""
    dlq_topic: str | None = option(
        None, metavar="TOPIC", help="Dead-letter topic [default: TOPIC.dlq]"
    )
    """Default: ``<topic>.dlq`` for each input topic."""
    transactional: bool = option(
        False, help="PostgreSQL: the handler's SQL on ctx.connection commits with its key"
    )
    """PostgreSQL: claim, the handler's SQL on ``ctx.connection`` and completion commit in
    one transaction, a message at a time (no batched round trips)."""
    permanent_errors: tuple[type[BaseException], ...] = option(
        (), kind="exceptions", given=None, metavar="MODULE.CLASS",
        help="Exceptions never retried",
    )  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_attempts < 1:
            raise ConfigError("--max-attempts must be at least 1")
        if self.lease is not None:
            in_range("--lease", self.lease, LEASE_RANGE)
        if not 0 < self.dlq_timeout <= MAX_TIMEOUT_MS:
            raise ConfigError("--dlq-timeout must be more than 0 and at most 24d20h")
        if self.dlq_breaker < 0:
            raise ConfigError("--dlq-breaker cannot be negative")
        if self.on_stale not in ("skip", "dlq"):
            raise ConfigError(f"--on-stale {self.on_stale!r}: use skip or dlq")


@dataclass
class Summary:
    """What a run did, message by message, and where it stands now."""

    counts: Counter[str] = field(default_factory=Counter)
    """executed, replayed, dead_lettered, skipped, stale, retried, busy, store_unavailable,
    lease_lost, dead_letter_refused, revoked; with --contiguous, gap_wait (pauses for a missing
    predecessor) and gaps (events applied after waiting out --gap-timeout)"""
    dead_letters: Counter[str] = field(default_factory=Counter)
    """Dead letters by reason (no idempotency key, invalid idempotency key, ...)."""
    paused: int = 0
    """Partitions paused now (busy keys, retries, an unreachable store)."""
    partitions: int = 0
    """Partitions assigned to this consumer now."""
    state: str = "starting"
    """joining group, consuming, no partitions assigned, brokers unreachable for ..., stopped"""
    lag: int | None = None
    """Messages behind the end of the assigned partitions, where the broker reports it."""
    stalled: int = 0
    """Partitions stalled now: assigned, not paused, behind their end, no progress; or
    whose handler runs past --stall-timeout."""
    stalls: int = 0
    """Stalled partitions found and recovered since the start."""
    overdue: int = 0
    """Handlers running past --stall-timeout now."""

    @property
    def finished(self) -> int:
        c = self.counts
        # A stale event dead-lettered (--on-stale dlq) counts once, as a dead letter.
        stale = c["stale"] - self.dead_letters["stale event"]
        return c["executed"] + c["replayed"] + c["dead_lettered"] + stale
