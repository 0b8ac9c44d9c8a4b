"""What ``idemctl consume`` is asked to do, and what it did."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from idemctl.durations import MAX_TIMEOUT_MS
from idemctl.errors import ConfigError
from idemctl.keys import DEFAULT_KEY_STRATEGY, key_strategy, order_strategy
from idemctl.stores.limits import LEASE_RANGE, in_range
from idemctl.tracing import KEY_FORMS

MAX_BATCH = 1_000_000
"""Messages one poll may ask librdkafka for."""
MAX_CONCURRENCY = 1024
"""Handler threads one consumer may run."""


@dataclass
class ConsumeOptions:
    brokers: str
    topics: list[str]
    group: str
    key: str = DEFAULT_KEY_STRATEGY
    on_missing_key: str = "dlq"
    """For a message without a usable key (none, or one ``validate_key`` refuses) or with a
    payload the fingerprint or the key template cannot read: dlq: dead-letter it; offset: use
    topic-partition-offset as its key; skip: pass it by (its offset is stored); stop (or
    fail): stop the consumer without storing its offset."""
    lease: float | None = None
    max_attempts: int = 5
    backoff: float = 1.0
    """Seconds before the first retry; doubled each attempt, at most 60 s."""
    dlq_topic: str | None = None
    """Default: ``<topic>.dlq`` for each input topic."""
    batch_size: int = 100
    complete_batch: int = 20
    """Completions the completer sends in one round trip at most before it stops waiting."""
    complete_wait: float = 0.005
    """Seconds a finished key's completion waits for others to go with it, at most: with
    ``complete_batch``, what a SIGKILL can cost beyond the handlers it cuts off."""
    concurrency: int = 1
    """Partitions whose handlers run side by side (each partition's in order), for
    handlers that wait on I/O."""
    max_messages: int | None = None
    exit_when_idle: float | None = None
    kafka_config: dict[str, str] = field(default_factory=dict)
    permanent_errors: tuple[type[BaseException], ...] = ()
    transactional: bool = False
    """PostgreSQL: claim, the handler's SQL on ``ctx.connection`` and completion commit in
    one transaction, a message at a time (no batched round trips)."""
    poll_timeout: float = 0.5
    join_timeout: float = 60.0
    """Seconds from the start to the first partition, else KafkaUnavailable (0: wait for
    ever). Under ``exit_when_idle`` also how long lost brokers are waited for, and how long
    a member left without partitions waits for some before it exits."""
    dlq_oversize: str = "pause"
    """A dead letter the broker refuses as too large: pause (its partition waits, with
    back-off, until the topic takes it) or truncate (write it with the payload cut and
    headers saying so and where the original sits)."""
    dlq_timeout: float = 30.0
    """Seconds the broker has to acknowledge a dead letter; past it, the message's partition
    waits (with back-off) and the dead letter is tried again."""
    order_key: str | None = None
    """The sequence guard's entity (``account:{account_id}`` or ``header:NAME``); with
    ``sequence``, an event runs only if its sequence is above the entity's last applied."""
    sequence: str | None = None
    """Where the event's sequence is: a payload field or ``header:NAME`` (whole numbers,
    or ISO 8601 timestamps)."""
    on_stale: str = "skip"
    """An event the guard finds stale: skip (its offset is stored, logged at info) or dlq
    (dead-lettered, then stored)."""
    contiguous: bool = False
    """Pause the partition at an event whose predecessor (sequence - 1) is not applied yet, up to
    ``gap_timeout`` seconds, then apply it and count a gap."""
    gap_timeout: float = 30.0
    trace_keys: str = "hash"
    """With tracing (the ``otel`` extra): ``idemctl.key`` on the spans as its SHA-256's
    first 16 hex digits (hash), as it is (raw), or not at all (none)."""
    stall_timeout: float = 30.0
    """Seconds a partition may be assigned, not paused, behind its end and without progress
    before it counts as stalled: it is reported and recovered (resumed, sent back to its
    committed offset). 0: never."""
    handler_timeout: float = 300.0
    """Seconds a handler may run before ``HandlerTimeout`` is raised in its thread (the
    soft limit), as ``max.poll.interval.ms`` judges a consumer dead after 5 minutes.
    0: no limit."""
    handler_grace: float = 30.0
    """Seconds past the soft limit before the handler's thread is abandoned (the hard
    limit): its key is failed as timed out and a fresh thread takes its lane."""
    max_abandoned: int = 3
    """Threads abandoned past the hard limit before the consumer stops (StuckHandlers), so
    that its supervisor starts a fresh process; 0: stop at the first."""
    drain_timeout: float = 30.0
    """Seconds ``stop()`` waits for the handlers in hand (Kubernetes' default grace
    period); those still running then are left uncommitted (StuckHandlers)."""
    dlq_breaker: int = 20
    """Stop (ConsumeStopped) when this many messages in a row are dead-lettered for the same
    reason: a storm says the consumer is misconfigured, not that the messages are bad.
    0: never."""

    def __post_init__(self) -> None:
        if self.on_missing_key not in ("dlq", "offset", "skip", "stop", "fail"):
            raise ConfigError(
                f"--on-missing-key {self.on_missing_key!r}: use dlq, offset, skip or stop"
            )
        if min(self.max_attempts, self.batch_size, self.concurrency, self.complete_batch) < 1:
            raise ConfigError(
                "--max-attempts, --batch-size, --complete-batch and --concurrency must be at "
                "least 1"
            )
        if self.batch_size > MAX_BATCH:
            raise ConfigError(
                f"--batch-size {self.batch_size}: at most {MAX_BATCH} (librdkafka's limit for "
                "one poll)"
            )
        if self.concurrency > MAX_CONCURRENCY:
            raise ConfigError(f"--concurrency {self.concurrency}: at most {MAX_CONCURRENCY}")
        if self.lease is not None:
            in_range("--lease", self.lease, LEASE_RANGE)
        if self.dlq_oversize not in ("pause", "truncate"):
            raise ConfigError(f"--dlq-oversize {self.dlq_oversize!r}: use pause or truncate")
        if self.complete_wait < 0:
            raise ConfigError("--complete-wait cannot be negative")
        if not 0 < self.dlq_timeout <= MAX_TIMEOUT_MS:
            raise ConfigError("--dlq-timeout must be more than 0 and at most 24d20h")
        if self.dlq_breaker < 0 or self.join_timeout < 0:
            raise ConfigError("--dlq-breaker and --join-timeout cannot be negative")
        key_strategy(self.key)  # fails early on a bad strategy
        if (self.order_key is None) != (self.sequence is None):
            raise ConfigError("--order-key and --sequence go together: give both or neither")
        if self.order_key is not None and self.sequence is not None:
            order_strategy(self.order_key, self.sequence)
        elif self.contiguous:
            raise ConfigError("--contiguous needs --order-key and --sequence")
        if self.on_stale not in ("skip", "dlq"):
            raise ConfigError(f"--on-stale {self.on_stale!r}: use skip or dlq")
        if self.trace_keys not in KEY_FORMS:
            raise ConfigError(f"--trace-keys {self.trace_keys!r}: use hash, raw or none")
        if self.gap_timeout < 0:
            raise ConfigError("--gap-timeout cannot be negative")
        if self.stall_timeout < 0:
            raise ConfigError("--stall-timeout cannot be negative")
        if min(self.handler_timeout, self.handler_grace, self.drain_timeout) < 0:
            raise ConfigError(
                "--handler-timeout, --handler-grace and --drain-timeout cannot be negative"
            )
        if self.max_abandoned < 0:
            raise ConfigError("--max-abandoned cannot be negative")


@dataclass
class Summary:
    """What a run did, message by message, and where it stands now."""

    counts: Counter[str] = field(default_factory=Counter)
    """executed, replayed, dead_lettered, skipped, stale, retried, busy, store_unavailable,
    lease_lost, dead_letter_refused; with --contiguous, gap_wait (pauses for a missing
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
