"""Running a handler against Kafka: consume."""

from __future__ import annotations

import functools
import importlib
import math
import sys
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any, TypeVar, cast

import typer

from idemctl.cli import render
from idemctl.cli.common import (
    cli_store,
    command,
    duration,
    emit_json,
    note,
    settings,
    store_fields,
)
from idemctl.cli.keying import KeyOption, OnMissingKeyOption, OrderKeyOption, SequenceOption
from idemctl.cli.live import consume_status
from idemctl.cli.logs import show_warnings
from idemctl.cli.running import (
    METRICS_HOST,
    BrokersOption,
    KafkaConfigOption,
    LogFormat,
    LogFormatOption,
    MetricsHostOption,
    MetricsPortOption,
    kafka_settings,
    run_to_end,
    use_log_format,
)
from idemctl.cli.workers import processes_wanted, supervise
from idemctl.consume import protocol
from idemctl.errors import ConfigError
from idemctl.harness.demo import run_demo
from idemctl.operate.documents import consume as consume_document
from idemctl.operate.documents import demo as demo_document
from idemctl.processes import set_name


class TraceKeys(StrEnum):
    """``--trace-keys``: the idempotency key on spans."""

    HASH = "hash"
    RAW = "raw"
    NONE = "none"


F = TypeVar("F", bound=Callable[..., Any])
WRITER = "idemctl.worker"
"""Where a worker's line protocol writer is kept in the command's context (``ctx.meta``)."""


def said_to_supervisor(func: F) -> F:
    """A worker of --processes (``--worker-index``) says its progress, error and summary to
    its supervisor on stdout (``idemctl.consume.protocol``): an error that stops it there
    too, then handled as every command's."""

    @functools.wraps(func)
    def wrapper(ctx: typer.Context, **params: Any) -> Any:
        if params.get("worker_index") is None:
            return func(ctx, **params)
        from idemctl.operate.documents.consume import fields

        writer = ctx.meta[WRITER] = protocol.Writer(sys.stdout, fields)
        try:
            return func(ctx, **params)
        except typer.Exit as exc:
            if exc.exit_code:
                writer.error(f"exit {exc.exit_code}")
            raise
        except BaseException as exc:
            writer.error(str(exc) or type(exc).__name__)
            raise

    return cast(F, wrapper)


@command()
@said_to_supervisor
def consume(
    ctx: typer.Context,
    handler: Annotated[
        str,
        typer.Option("--handler", metavar="MODULE:FUNCTION", help="fn(event) or fn(event, ctx)"),
    ],
    topic: Annotated[
        list[str], typer.Option("--topic", metavar="TOPIC", help="Topic to read (repeatable)")
    ],
    group: Annotated[str, typer.Option("--group", metavar="GROUP", help="Consumer group id")],
    brokers: BrokersOption = None,
    key: KeyOption = "header:idempotency-key",
    on_missing_key: OnMissingKeyOption = "dlq",
    order_key: OrderKeyOption = None,
    sequence: SequenceOption = None,
    on_stale: Annotated[
        str,
        typer.Option(
            "--on-stale",
            metavar="ACTION",
            help="A stale event: skip (offset stored, logged at info) or dlq",
        ),
    ] = "skip",
    contiguous: Annotated[
        bool,
        typer.Option(
            "--contiguous",
            help="Hold an event whose predecessor (sequence - 1) is not applied yet, up to "
            "--gap-timeout, then apply it and count a gap",
        ),
    ] = False,
    gap_timeout: Annotated[
        str,
        typer.Option("--gap-timeout", metavar="DURATION", help="How long --contiguous waits"),
    ] = "30s",
    trace_keys: Annotated[
        TraceKeys,
        typer.Option(
            "--trace-keys",
            help="With OpenTelemetry (idemctl[otel] and a tracer provider): the idempotency "
            "key on spans as its SHA-256's first 16 hex digits, as it is, or not at all",
        ),
    ] = TraceKeys.HASH,
    dlq_breaker: Annotated[
        int,
        typer.Option(
            "--dlq-breaker",
            min=0,
            metavar="N",
            help="Stop (exit 8) when N messages in a row are dead-lettered for the same reason; "
            "0: never",
        ),
    ] = 20,
    dlq_oversize: Annotated[
        str,
        typer.Option(
            "--dlq-oversize",
            metavar="ACTION",
            help="A dead letter refused as too large: pause (its partition waits, with back-off, "
            "until the topic takes it) or truncate (write it with the payload cut to 64 KiB "
            "and a header saying so)",
        ),
    ] = "pause",
    dlq_timeout: Annotated[
        str,
        typer.Option(
            "--dlq-timeout",
            metavar="DURATION",
            help="How long the broker has to acknowledge a dead letter before the partition "
            "waits and it is tried again",
        ),
    ] = "30s",
    join_timeout: Annotated[
        str,
        typer.Option(
            "--join-timeout",
            metavar="DUR",
            help="Exit 7 when no partition comes within DUR of starting (under --exit-when-idle, "
            "also when the brokers stay lost that long); 0: wait for ever",
        ),
    ] = "60s",
    lease: Annotated[str, typer.Option("--lease", metavar="DUR", help="Lease per claim")] = "30s",
    max_attempts: Annotated[
        int, typer.Option("--max-attempts", metavar="N", min=1, help="Runs before dead-lettering")
    ] = 5,
    backoff: Annotated[
        str, typer.Option("--backoff", metavar="DUR", help="First retry delay, doubling")
    ] = "1s",
    dlq_topic: Annotated[
        str | None,
        typer.Option("--dlq-topic", metavar="TOPIC", help="Dead-letter topic [default: TOPIC.dlq]"),
    ] = None,
    batch_size: Annotated[
        int,
        typer.Option(
            "--batch-size",
            metavar="N",
            help="Messages per poll and store round trip (1 to 1000000)",
        ),
    ] = 100,
    complete_batch: Annotated[
        int,
        typer.Option(
            "--complete-batch",
            min=1,
            metavar="N",
            help="A finished key's completion leaves once N are waiting ...",
        ),
    ] = 20,
    complete_wait: Annotated[
        str,
        typer.Option(
            "--complete-wait",
            metavar="DUR",
            help="... or it has waited DUR, whichever comes first: a SIGKILL repeats the "
            "handlers it cuts off and the completions not sent yet",
        ),
    ] = "5ms",
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency",
            metavar="N",
            min=1,
            help="Handler threads: partitions handled side by side (for I/O-bound handlers)",
        ),
    ] = 1,
    max_messages: Annotated[
        int | None,
        typer.Option(
            "--max-messages",
            metavar="N",
            min=1,
            help="Stop after N messages are finished; never claims more than it will run",
        ),
    ] = None,
    exit_when_idle: Annotated[
        str | None,
        typer.Option(
            "--exit-when-idle",
            metavar="DUR",
            help="Stop once the assigned partitions gave nothing for DUR (time without "
            "partitions, held, behind their end or cut off from the brokers does not count; "
            "in a group, more than session.timeout.ms: a dead member's partitions come free "
            "only then)",
        ),
    ] = None,
    stall_timeout: Annotated[
        str,
        typer.Option(
            "--stall-timeout",
            metavar="DUR",
            help="A partition assigned, not held, behind its end and without progress for "
            "DUR is stalled: a warning, idemctl_stalled_partitions, /readyz 503, then "
            "resumed and sent back to its committed offset; 0: never",
        ),
    ] = "30s",
    handler_timeout: Annotated[
        str,
        typer.Option(
            "--handler-timeout",
            metavar="DUR",
            help="A handler running DUR gets HandlerTimeout raised in its thread (the attempt "
            "fails and is retried); 0: no limit",
        ),
    ] = "5m",
    handler_grace: Annotated[
        str,
        typer.Option(
            "--handler-grace",
            metavar="DUR",
            help="DUR past --handler-timeout (a blocking call that ignores it), its thread is "
            "abandoned: its key is failed as timed out and a fresh thread takes over",
        ),
    ] = "30s",
    max_abandoned: Annotated[
        int,
        typer.Option(
            "--max-abandoned",
            metavar="N",
            help="Exit 9 when more than N threads were abandoned, for a fresh process "
            "(under --processes, a worker exits at the first and is replaced)",
        ),
    ] = 3,
    drain_timeout: Annotated[
        str,
        typer.Option(
            "--drain-timeout",
            metavar="DUR",
            help="SIGTERM or Ctrl-C waits DUR at most for the handlers in hand, then exits 9 "
            "naming those left (uncommitted); a second signal exits at once",
        ),
    ] = "30s",
    kafka_config: KafkaConfigOption = None,
    metrics_port: MetricsPortOption = None,
    metrics_host: MetricsHostOption = METRICS_HOST,
    log_format: LogFormatOption = LogFormat.AUTO,
    transactional: Annotated[
        bool,
        typer.Option(
            "--transactional",
            help="PostgreSQL: the handler's SQL on ctx.connection commits with its key",
        ),
    ] = False,
    permanent_errors: Annotated[
        list[str] | None,
        typer.Option("--permanent-errors", metavar="MODULE.CLASS", help="Exceptions never retried"),
    ] = None,
    processes: Annotated[
        str,
        typer.Option(
            "--processes",
            metavar="N",
            help="Worker processes in the group, each with the same options (auto: one a "
            "core); a worker that dies is replaced, a crash loop stops them all",
        ),
    ] = "1",
    worker_index: Annotated[int | None, typer.Option("--worker-index", hidden=True)] = None,
) -> None:
    """Run a handler for each message of the topics, effectively once per key.

    Offsets are stored only after a message is completed, replayed, stale or dead-lettered.
    Handlers run in threads beside the poll loop; one running past --stall-timeout is
    reported (/readyz 503, its stack in a warning), past --handler-timeout interrupted.
    SIGTERM or Ctrl-C drains: the running handlers finish (within --drain-timeout, else
    exit 9) and are completed, the other claims are released, offsets are committed, exit 0;
    a second signal exits 130 at once. Before anything is claimed it checks the handler's
    signature and the Kafka settings (exit 2).
    """
    # asyncio, and http.server with ssl: loaded for a consume run, not at every start-up
    from idemctl.consume import ConsumeOptions, Consumer, load_handler
    from idemctl.consume.loop import check_kafka
    from idemctl.consume.metrics import register as consume_metrics

    current = use_log_format(ctx, log_format, metrics_port)
    brokers, kafka = kafka_settings(ctx, brokers, kafka_config)
    if worker_index is not None and "group.instance.id" in kafka:
        # Static membership: each worker slot a member of its own, the same across restarts.
        kafka["group.instance.id"] += f"-w{worker_index}"
    workers = processes_wanted(processes)
    if workers > 1 and max_messages is not None:
        raise ConfigError(
            "--max-messages counts one process's messages: use it without --processes"
        )
    options = ConsumeOptions(
        brokers=brokers,
        topics=topic,
        group=group,
        key=key,
        on_missing_key=on_missing_key,
        order_key=order_key,
        sequence=sequence,
        on_stale=on_stale,
        contiguous=contiguous,
        gap_timeout=duration(gap_timeout, "--gap-timeout"),
        lease=duration(lease, "--lease"),
        max_attempts=max_attempts,
        backoff=duration(backoff, "--backoff"),
        dlq_topic=dlq_topic,
        batch_size=batch_size,
        complete_batch=complete_batch,
        complete_wait=duration(complete_wait, "--complete-wait"),
        concurrency=concurrency,
        max_messages=max_messages,
        exit_when_idle=duration(exit_when_idle, "--exit-when-idle") if exit_when_idle else None,
        join_timeout=duration(join_timeout, "--join-timeout"),
        stall_timeout=duration(stall_timeout, "--stall-timeout"),
        handler_timeout=duration(handler_timeout, "--handler-timeout"),
        handler_grace=duration(handler_grace, "--handler-grace"),
        # A worker of --processes exits at the first: its supervisor starts a fresh one.
        max_abandoned=0 if worker_index is not None else max_abandoned,
        drain_timeout=duration(drain_timeout, "--drain-timeout"),
        dlq_breaker=dlq_breaker,
        trace_keys=trace_keys.value,
        dlq_oversize=dlq_oversize,
        dlq_timeout=duration(dlq_timeout, "--dlq-timeout"),
        kafka_config=kafka,
        permanent_errors=tuple(_exception(name) for name in permanent_errors or ()),
        transactional=transactional,
    )
    sys.path.insert(0, ".")  # handlers next to where idemctl runs, as `python -m` finds them
    show_warnings(current, "idemctl.consume")
    run = load_handler(handler)
    if workers > 1:  # every setting checked before the store or any worker is touched
        check_kafka(options)
    if worker_index is not None:
        set_name(f"idemctl-w{worker_index}")
    with cli_store(ctx, auto_provision=True) as store:
        if workers > 1:  # the handler loads and the store answers: the workers may start
            store.get("idemctl:probe")
            supervise(
                ctx, current, workers, current.store_url()[0], store.url, brokers, kafka, topic,
                metrics_host, metrics_port,
            )  # fmt: skip
            return
        header = {"topics": ", ".join(topic), "group": group, "store": store.url}
        writer: protocol.Writer | None = ctx.meta.get(WRITER)  # a worker of --processes
        # A worker's progress goes to its supervisor, in the line protocol, not to a log.
        status = consume_status(current, header, every=math.inf if writer else 10.0)
        progress = status.update if writer is None else writer.progress
        consumer = Consumer(store, run, options, on_progress=progress)
        consumer.open()  # a Kafka setting librdkafka refuses fails here, before the store
        store.get("idemctl:probe")  # an unreachable or unprovisioned store fails fast, here
        summary = run_to_end(current, consumer, status, consume_metrics, metrics_host, metrics_port)
    if writer is not None:
        writer.summary(summary)
    elif current.json:
        emit_json(consume_document.document(store_fields(ctx, store.url), topic, group, summary))
    else:
        counts = sorted(summary.counts.items())
        shown = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in counts) or "nothing"
        note(
            current,
            f"consumed {summary.finished} message(s): {shown}",
            fields={"finished": summary.finished, **dict(counts)},
        )


def _exception(path: str) -> type[BaseException]:
    module, _, name = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module or "builtins"), name)
    except (ImportError, AttributeError):
        raise ConfigError(f"--permanent-errors {path!r}: no such exception class") from None
    if not (isinstance(found, type) and issubclass(found, BaseException)):
        raise ConfigError(f"--permanent-errors {path!r} is not an exception class")
    return found


@command()
def demo(
    ctx: typer.Context,
    brokers: Annotated[
        str | None,
        typer.Option(
            "--brokers",
            metavar="HOST:PORT",
            help="A real broker [default: start a local one (tansu)]",
        ),
    ] = None,
    payments: Annotated[
        int, typer.Option("--payments", metavar="N", min=10, help="Payments to send")
    ] = 1000,
) -> None:
    """See effectively-once happen: duplicates, two consumers, one killed mid-run.

    Sends payments with 30% duplicates (some to other partitions), runs two `consume`
    processes with examples/payments.py, SIGKILLs one and restarts it, then shows how often
    each payment was charged. Without --store it uses a fresh SQLite file; without
    --brokers a local broker (pip install 'idemctl[demo]').
    """
    current = settings(ctx)
    url, source = current.store_url()
    err = current.err
    report = run_demo(
        "" if source == "the default" else url,
        brokers,
        payments,
        on_step=lambda step: err.print(f"[dim]-[/] {step}"),
    )
    if current.json:
        emit_json(demo_document.document(report))
    else:
        current.out.print(render.demo_table(report))
        if report.twice:
            err.print(
                f"charged twice: {', '.join(report.twice)}: the killed consumer had charged "
                "them and died before recording it; their leases ran out and they ran again"
            )
        if not report.ok:
            err.print("[bold red]FAILED:[/] a payment was lost, or charged twice too often")
        elif report.twice:
            err.print("[green]ok:[/] no payment lost; a charge repeats only where a kill cut in")
        else:
            err.print("[green]ok:[/] every payment charged exactly once")
    if not report.ok:
        raise typer.Exit(1)
