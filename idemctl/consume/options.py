"""What ``idemctl consume`` is asked to do: ``ConsumeOptions``, the Kafka ``Handling``
(``idemctl.kafka.options``) on a Kafka consumer of idemctl's own. Each field the command
line takes carries its flag, help and command-line default (``idemctl.kafka.flags``); the
CLI's parameters are built from them.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field

from idemctl.errors import ConfigError
from idemctl.kafka.flags import option
from idemctl.kafka.options import Handling
from idemctl.tracing import KEY_FORMS

MAX_BATCH = 1_000_000
"""Messages one poll may ask librdkafka for."""
MAX_CONCURRENCY = 1024
"""Handler threads one consumer may run."""
COMPLETE_BATCH = 100
"""``--complete-batch``'s default. Handlers slower than the store's round trip send a few
completions a batch whatever it is; quicker ones fill it, and then it sets their throughput
(completions waiting and on their way over the round trip's time) and what a kill repeats
(``repeats_per_kill``). At 20 consume kept about half of what the store alone does on Redis
and PostgreSQL; at 100, 0.7-0.9x (benchmarks/README.md, issue 60)."""


def repeats_per_kill(concurrency: int = 1, complete_batch: int = COMPLETE_BATCH) -> int:
    """The most effects a SIGKILL of one ``idemctl consume`` process can repeat, out of
    transactional mode: the handlers running (``concurrency``) and the completions not
    acknowledged yet (a full batch waiting behind one on its way: ``2 x complete_batch``;
    see ``runner.batch``'s completer). ``verify`` and ``demo`` judge their kills by it."""
    return concurrency + 2 * complete_batch


@dataclass
class ConsumeOptions(Handling):
    """``Handling`` on a Kafka consumer of idemctl's own: ``brokers``, ``topics`` and
    ``group``, then (by keyword) how it polls, completes, dead-letters, times handlers and
    stops."""

    brokers: str
    topics: list[str] = option(  # noqa: RUF009 - a field with its flag
        name="--topic", metavar="TOPIC", help="Topic to read (repeatable)"
    )
    group: str = option(metavar="GROUP", help="Consumer group id")
    _: KW_ONLY
    contiguous: bool = option(
        False,
        help="Pause the partition at an event whose predecessor (sequence - 1) is not applied "
        "yet, up to --gap-timeout, then apply it and count a gap",
    )
    """Pause the partition at an event whose predecessor (sequence - 1) is not applied yet, up to
    ``gap_timeout`` seconds, then apply it and count a gap."""
    gap_timeout: float = option(
        30.0, kind="duration", given="30s", metavar="DURATION", help="How long --contiguous waits"
    )
    trace_keys: str = option(
        "hash", choices=KEY_FORMS,
        help="With OpenTelemetry (idemctl[otel] and a tracer provider): the idempotency "
        "key on spans as its SHA-256's first 16 hex digits, as it is, or not at all",
    )  # fmt: skip
    """With tracing (the ``otel`` extra): ``idemctl.key`` on the spans as its SHA-256's
    first 16 hex digits (hash), as it is (raw), or not at all (none)."""
    dlq_oversize: str = option(
        "pause", metavar="ACTION",
        help="A dead letter refused as too large: pause (its partition waits, with back-off, "
        "until the topic takes it) or truncate (write it with the payload cut to 64 KiB "
        "and a header saying so)",
    )  # fmt: skip
    """A dead letter the broker refuses as too large: pause (its partition waits, with
    back-off, until the topic takes it) or truncate (write it with the payload cut and
    headers saying so and where the original sits)."""
    join_timeout: float = option(
        60.0, kind="duration", given="60s", metavar="DUR",
        help="Exit 7 when no partition comes within DUR of starting (under --exit-when-idle, "
        "also when the brokers stay lost that long); 0: wait for ever",
    )  # fmt: skip
    """Seconds from the start to the first partition, else KafkaUnavailable (0: wait for
    ever). Under ``exit_when_idle`` also how long lost brokers are waited for, and how long
    a member left without partitions waits for some before it exits."""
    batch_size: int = option(
        100, metavar="N", help="Messages per poll and store round trip (1 to 1000000)"
    )
    complete_batch: int = option(
        COMPLETE_BATCH,
        least=1,
        metavar="N",
        help="A finished key's completion leaves once N are waiting ...",
    )
    """Completions the completer sends in one round trip at most before it stops waiting."""
    complete_wait: float = option(
        0.005, kind="duration", given="5ms", metavar="DUR",
        help="... or it has waited DUR, whichever comes first: a SIGKILL repeats the "
        "handlers it cuts off and the completions not sent yet",
    )  # fmt: skip
    """Seconds a finished key's completion waits for others to go with it, at most: with
    ``complete_batch``, what a SIGKILL can cost beyond the handlers it cuts off."""
    concurrency: int = option(
        1, least=1, metavar="N",
        help="Handler threads: partitions handled side by side (for I/O-bound handlers)",
    )  # fmt: skip
    """Partitions whose handlers run side by side (each partition's in order), for
    handlers that wait on I/O."""
    max_messages: int | None = option(
        None, least=1, metavar="N",
        help="Stop after N messages are finished; never claims more than it will run",
    )  # fmt: skip
    exit_when_idle: float | None = option(
        None, kind="duration", metavar="DUR",
        help="Stop once the assigned partitions gave nothing for DUR (time without "
        "partitions, paused, behind their end or cut off from the brokers does not count; "
        "in a group, more than session.timeout.ms: a dead member's partitions come free "
        "only then)",
    )  # fmt: skip
    stall_timeout: float = option(
        10.0, kind="duration", given="10s", metavar="DUR",
        help="A handler running DUR is overdue: a warning with its stack, /readyz 503, and "
        "the other partitions of its lane go on in another (a spare lane if need be); a "
        "partition assigned, not paused, behind its end and without progress for DUR is "
        "stalled: reported, resumed and sent back to its committed offset; 0: never",
    )  # fmt: skip
    """Seconds a handler may run before it is overdue (reported; its lane's other
    partitions move to another lane, a spare one while every lane is overdue), and a
    partition may be assigned, not paused, behind its end and without progress before it
    counts as stalled (reported and recovered: resumed, sent back to its committed offset).
    0: never."""
    handler_timeout: float = option(
        300.0, kind="duration", given="5m", metavar="DUR",
        help="A handler running DUR gets HandlerTimeout raised in its thread (the attempt "
        "fails and is retried); 0: no limit",
    )  # fmt: skip
    """Seconds a handler may run before ``HandlerTimeout`` is raised in its thread (the
    soft limit), as ``max.poll.interval.ms`` judges a consumer dead after 5 minutes.
    0: no limit."""
    handler_grace: float = option(
        30.0, kind="duration", given="30s", metavar="DUR",
        help="DUR past --handler-timeout (a blocking call that ignores it), its thread is "
        "abandoned: its key is failed as timed out and a fresh thread takes over",
    )  # fmt: skip
    """Seconds past the soft limit before the handler's thread is abandoned (the hard
    limit): its key is failed as timed out and a fresh thread takes its lane."""
    max_abandoned: int = option(
        3, metavar="N",
        help="Exit 9 when more than N threads were abandoned, for a fresh process "
        "(under --processes, a worker exits at the first and is replaced)",
    )  # fmt: skip
    """Threads abandoned past the hard limit before the consumer stops (StuckHandlers), so
    that its supervisor starts a fresh process; 0: stop at the first."""
    drain_timeout: float = option(
        30.0, kind="duration", given="30s", metavar="DUR",
        help="SIGTERM or Ctrl-C waits DUR at most for the handlers in hand, then exits 9 "
        "naming those left (uncommitted); a second signal exits at once",
    )  # fmt: skip
    """Seconds ``stop()`` waits for the handlers in hand (Kubernetes' default grace
    period); those still running then are left uncommitted (StuckHandlers)."""
    kafka_config: dict[str, str] = field(default_factory=dict)
    poll_timeout: float = 0.5
    replacement: bool = False
    """A worker of ``--processes`` started in place of one that died: the run's brokers
    and group were proven, so it waits for its partitions however long its group takes to
    rebalance (``join_timeout`` does not apply to its first partition; the run's other
    workers still judge the brokers by it)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if min(self.batch_size, self.concurrency, self.complete_batch) < 1:
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
        if self.dlq_oversize not in ("pause", "truncate"):
            raise ConfigError(f"--dlq-oversize {self.dlq_oversize!r}: use pause or truncate")
        if self.complete_wait < 0:
            raise ConfigError("--complete-wait cannot be negative")
        if self.join_timeout < 0:
            raise ConfigError("--dlq-breaker and --join-timeout cannot be negative")
        if self.contiguous and self.order_key is None:
            raise ConfigError("--contiguous needs --order-key and --sequence")
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
