"""What ``audit`` is asked to check, and what it found: a class for each message below the
group's committed offset, counts per partition, and the lost messages by name."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

from idemctl.errors import ConfigError
from idemctl.kafka.keys import DEFAULT_KEY_STRATEGY
from idemctl.kafka.options import Keyed

CLASSES = ("done", "dead_lettered", "stale", "skipped", "lost", "beyond_retention", "in_flight")
"""What a message below the committed offset can be (see README, "idemctl audit")."""
FAIL_ON = ("lost", "in_flight", "beyond_retention", "dead_lettered", "stale", "pending")
"""The classes ``--fail-on`` accepts."""
LOST_SHOWN = 100
"""Lost messages a report names; the count is always whole."""
MAX_BATCH = 10_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
"""Kafka's timestamps count milliseconds from here: a ``--since`` before it means nothing."""
MOST_UNKEYED = 0.5
"""A report is doubted when more than this share of its audited messages have no usable
key under ``--key``: the template is then likelier wrong than the messages."""


@dataclass
class AuditOptions(Keyed):
    """What to audit: the group, its topic, where to look, how fast; the keys are derived
    as ``consume`` was run (``Keyed``: ``key``, ``on_missing_key``, ``order_key``,
    ``sequence``)."""

    brokers: str
    topic: str
    group: str
    last: int = 10_000
    """Messages per partition, the last below the committed offset."""
    since: datetime | None = None
    """Instead of ``last``: the messages from this time (by their timestamps) on."""
    dlq_topic: str | None = None
    """Cross-check: a message counted dead-lettered must be in this topic, else it is lost."""
    rate: float | None = None
    """Messages a second at most (reading and judging together)."""
    batch: int = 500
    """Messages judged per store round trip."""
    kafka_config: dict[str, str] = field(default_factory=dict)
    timeout: float = 30.0
    """Seconds a Kafka request, or a read that brings nothing, may take."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.last < 1:
            raise ConfigError("--last must be at least 1")
        if not 1 <= self.batch <= MAX_BATCH:
            raise ConfigError(f"--batch must be between 1 and {MAX_BATCH}")
        if self.rate is not None and self.rate <= 0:
            raise ConfigError("--rate must be above 0")
        if self.timeout <= 0:
            raise ConfigError("the Kafka timeout must be above 0")
        if self.since is not None:
            since = self.since if self.since.tzinfo else self.since.replace(tzinfo=UTC)
            if since < EPOCH:
                raise ConfigError(
                    f"--since {since.isoformat()} is before 1970-01-01T00:00:00Z, where "
                    "Kafka's timestamps start: give a time since then"
                )
            if since > datetime.now(UTC):
                raise ConfigError(
                    f"--since {since.isoformat()} is in the future: give a time before now"
                )


@dataclass(frozen=True)
class LostMessage:
    partition: int
    offset: int
    key: str | None
    why: str


@dataclass
class PartitionAudit:
    partition: int
    committed: int | None
    """The group's committed offset (the next message it would read); None: none."""
    start: int
    """The first offset audited (the partition's low watermark at the earliest)."""
    end: int
    """The partition's high watermark: the offset its next message will get."""
    counts: Counter[str] = field(default_factory=Counter)

    @property
    def audited(self) -> int:
        return sum(self.counts[c] for c in CLASSES)

    @property
    def pending(self) -> int:
        """Messages above the committed offset: not finished, or not committed yet."""
        return max(0, self.end - (self.start if self.committed is None else self.committed))


@dataclass(frozen=True)
class Doubt:
    """Why a report cannot be trusted: the audit's setup, not the group, is likely wrong."""

    cause: str
    """``key``: most messages have no usable key under ``--key``; ``store``: none of the
    audited keys has a record in the store."""
    hint: str


@dataclass
class AuditReport:
    topic: str
    group: str
    store: str
    partitions: list[PartitionAudit]
    lost: list[LostMessage] = field(default_factory=list)
    """The first LOST_SHOWN lost messages, by partition and offset."""
    dlq_checked: str | None = None
    """The dead-letter topic the dead-lettered messages were found in, if one was given."""
    seconds: float = 0.0
    key: str = DEFAULT_KEY_STRATEGY
    """The ``--key`` template the messages were keyed by."""
    unkeyed: int = 0
    """Messages audited that have no usable key under ``key``."""
    unkeyed_example: str | None = None
    """The first of them: where it is and why it has no key."""
    found: int = 0
    """Messages audited whose key has a record in the store."""
    absent: int = 0
    """Messages audited whose key has no record while younger than the store's retention."""

    @property
    def uncommitted(self) -> list[int]:
        """The partitions the group has no committed offset on (none of them audited)."""
        return [p.partition for p in self.partitions if p.committed is None]

    def doubts(self) -> list[Doubt]:
        """What makes this report untrustworthy, each with its likely cause: more than
        ``MOST_UNKEYED`` of the audited messages without a usable key (``--key`` is not the
        consumer's), or keys audited younger than the retention none of which has a record
        (another store or prefix, or ``--key``). Any doubt fails the audit."""
        out = []
        audited = self.audited
        if audited and self.unkeyed > MOST_UNKEYED * audited:
            example = f" (the first: {self.unkeyed_example})" if self.unkeyed_example else ""
            out.append(
                Doubt(
                    "key",
                    f"{self.unkeyed} of {audited} message(s) audited have no usable key under "
                    f"--key {self.key!r}{example}: give the --key template the group's "
                    "consumer runs with, else audit cannot judge them",
                )
            )
        if self.absent and not self.found:
            out.append(
                Doubt(
                    "store",
                    f"none of the {audited - self.unkeyed} message(s) audited with a key has a "
                    "record in this store: the store or its prefix is likely not the one the "
                    f"group's consumers use (or --key {self.key!r} is not theirs), rather than "
                    "all of them lost",
                )
            )
        return out

    def totals(self) -> Counter[str]:
        out: Counter[str] = Counter({c: 0 for c in CLASSES})
        for p in self.partitions:
            out.update(p.counts)
        out["pending"] = sum(p.pending for p in self.partitions)
        return out

    @property
    def audited(self) -> int:
        return sum(p.audited for p in self.partitions)

    def failing(self, fail_on: tuple[str, ...] = ("lost",)) -> list[str]:
        """The classes of ``fail_on`` that have messages."""
        totals = self.totals()
        return [c for c in fail_on if totals[c]]
