"""Running a handler against Kafka: consume."""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypeVar, cast

import typer

from idemctl.cli import render
from idemctl.cli.common import (
    cli_open,
    command,
    emit_json,
    note,
    settings,
    store_fields,
    store_opener,
)
from idemctl.cli.declared import Given, declared
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
from idemctl.consume.options import ConsumeOptions
from idemctl.errors import ConfigError
from idemctl.harness.demo import run_demo
from idemctl.operate.documents import consume as consume_document
from idemctl.operate.documents import demo as demo_document
from idemctl.processes import set_name

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


HELP_ORDER = (
    "handler", "topics", "group", "brokers", "key", "on_missing_key", "order_key", "sequence",
    "on_stale", "contiguous", "gap_timeout", "trace_keys", "dlq_breaker", "dlq_oversize",
    "dlq_timeout", "join_timeout", "lease", "max_attempts", "backoff", "dlq_topic",
    "batch_size", "complete_batch", "complete_wait", "concurrency", "max_messages",
    "exit_when_idle", "stall_timeout", "handler_timeout", "handler_grace", "max_abandoned",
    "drain_timeout", "kafka_config", "metrics_port", "metrics_host", "log_format",
    "transactional", "permanent_errors", "processes", "worker_index",
)  # fmt: skip
"""``consume --help``'s order: the command's own options and those ``ConsumeOptions``
declares (its fields' flags, help and defaults), which the command takes as ``declared``."""


@command()
@said_to_supervisor
@declared(ConsumeOptions, HELP_ORDER)
def consume(
    ctx: typer.Context,
    handler: Annotated[
        str,
        typer.Option("--handler", metavar="MODULE:FUNCTION", help="fn(event) or fn(event, ctx)"),
    ],
    declared: Given,
    brokers: BrokersOption = None,
    kafka_config: KafkaConfigOption = None,
    metrics_port: MetricsPortOption = None,
    metrics_host: MetricsHostOption = METRICS_HOST,
    log_format: LogFormatOption = LogFormat.AUTO,
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
    reported (/readyz 503, its stack in a warning) and holds up only its own partition
    (the others go on in another lane, a spare one if need be), past --handler-timeout
    it is interrupted.
    SIGTERM or Ctrl-C drains: the running handlers finish (within --drain-timeout, else
    exit 9) and are completed, the other claims are released, offsets are committed, exit 0;
    a second signal exits 130 at once. Before anything is claimed it checks the handler's
    signature and the Kafka settings (exit 2).
    """
    # asyncio, and http.server with ssl: loaded for a consume run, not at every start-up
    from idemctl.consume import Consumer, load_handler
    from idemctl.consume.loop import check_kafka
    from idemctl.consume.metrics import register as consume_metrics
    from idemctl.consume.supervisor import REPLACEMENT

    current = use_log_format(ctx, log_format, metrics_port)
    brokers, kafka = kafka_settings(ctx, brokers, kafka_config)
    if worker_index is not None and "group.instance.id" in kafka:
        # Static membership: each worker slot a member of its own, the same across restarts.
        kafka["group.instance.id"] += f"-w{worker_index}"
    workers = processes_wanted(processes)
    if workers > 1 and declared.raw["max_messages"] is not None:
        raise ConfigError(
            "--max-messages counts one process's messages: use it without --processes"
        )
    values = declared.values()
    if worker_index is not None:  # a worker of --processes exits at the first: its
        values["max_abandoned"] = 0  # supervisor starts a fresh one
        values["replacement"] = os.environ.get(REPLACEMENT, "0") != "0"
    options = ConsumeOptions(brokers=brokers, kafka_config=kafka, **values)
    sys.path.insert(0, ".")  # handlers next to where idemctl runs, as `python -m` finds them
    show_warnings(current, "idemctl.consume")
    run = load_handler(handler)
    if workers > 1:  # every setting checked before the store or any worker is touched
        check_kafka(options)
    if worker_index is not None:
        set_name(f"idemctl-w{worker_index}")
    with cli_open(ctx, store_opener(auto_provision=True)) as store:
        if workers > 1:  # the handler loads and the store answers: the workers may start
            store.get("idemctl:probe")
            supervise(
                ctx, current, workers, current.store_url()[0], store.url, brokers, kafka,
                options.topics,
                metrics_host, metrics_port,
            )  # fmt: skip
            return
        header = {"topics": ", ".join(options.topics), "group": options.group, "store": store.url}
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
        fields = store_fields(ctx, store.url)
        emit_json(consume_document.document(fields, options.topics, options.group, summary))
    else:
        counts = sorted(summary.counts.items())
        shown = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in counts) or "nothing"
        note(
            current,
            f"consumed {summary.finished} message(s): {shown}",
            fields={"finished": summary.finished, **dict(counts)},
        )


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
    unfenced: Annotated[
        bool,
        typer.Option(
            "--unfenced",
            help="Charge without the fence (lines of a file), to see a kill repeat a charge",
        ),
    ] = False,
) -> None:
    """See effectively-once happen: duplicates, two consumers, one killed mid-run.

    Sends payments with 30% duplicates (some to other partitions), runs two `consume`
    processes with examples/payments.py, SIGKILLs one and restarts it, SIGSTOPs the other
    mid-charge past its lease until a takeover charged that payment, then shows how often
    each payment was charged. The charges go to a ledger through the fence
    (idemctl.fence): a takeover's charge replaces a killed one's, and the stopped
    consumer's late charge is refused by its token; --unfenced shows what repeats
    otherwise. Without --store it uses a fresh SQLite
    file; without --brokers a local broker (pip install 'idemctl[demo]').
    """
    current = settings(ctx)
    url, source = current.store_url()
    err = current.err
    report = run_demo(
        "" if source == "the default" else url,
        brokers,
        payments,
        on_step=lambda step: err.print(f"[dim]-[/] {step}"),
        fenced=not unfenced,
    )
    if current.json:
        emit_json(demo_document.document(report))
    else:
        current.out.print(render.demo_table(report))
        if report.fenced and report.retaken:
            err.print(
                f"charged again by a takeover: {', '.join(report.retaken)}: the killed consumer "
                "had charged them and died before recording it; the fenced ledger kept one "
                "charge each, the takeover's"
            )
        if report.refused:
            err.print(
                f"{report.refused} late charge(s) of the stopped consumer, whose payment a "
                "takeover had charged, refused by its fencing token"
            )
        if report.twice:
            err.print(
                f"charged twice: {', '.join(report.twice)}: a consumer charged them and was "
                "killed, or stopped past its lease, before recording it; a takeover charged "
                "them again (and the stopped one, resumed, charged late)"
            )
        if not report.ok:
            err.print("[bold red]FAILED:[/] a payment was lost, or charged twice too often")
        elif report.twice:
            err.print(
                "[green]ok:[/] no payment lost; a charge repeats only where a kill or the stop "
                "cut in"
            )
        else:
            err.print("[green]ok:[/] every payment charged exactly once")
    if not report.ok:
        raise typer.Exit(1)
