"""The transactional outbox: relay, status, replay, purge (``idemctl outbox ...``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Annotated

import typer
from rich.markup import escape

from idemctl import operate
from idemctl.cli import render
from idemctl.cli.common import (
    app,
    cli_open,
    command,
    duration,
    emit_json,
    moment,
    note,
    settings,
    store_fields,
    store_opener,
    usage_error,
)
from idemctl.cli.help import QuietGroup
from idemctl.cli.live import LiveStatus
from idemctl.cli.logs import show_warnings
from idemctl.cli.repair import DryRunOption, YesOption, changing
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
from idemctl.operate.documents import action as action_document
from idemctl.operate.documents import outbox as outbox_documents
from idemctl.operate.documents import outbox_status
from idemctl.outbox.table import OutboxRow, Selection

outbox_app = typer.Typer(
    name="outbox",
    cls=QuietGroup,
    help="The transactional outbox: publish its rows to Kafka, replay them, look, purge.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(outbox_app, name="outbox")

TEMPLATE_DEFAULT = "outbox.event.{aggregatetype}"
TemplateOption = Annotated[
    str,
    typer.Option(
        "--topic-template",
        metavar="TEMPLATE",
        help="Topic per row, from {aggregatetype}, {aggregateid} and {type}",
    ),
]
BatchOption = Annotated[
    int,
    typer.Option(
        "--batch-size",
        metavar="N",
        help="Rows per transaction and acknowledgement wait (1 to 100000)",
    ),
]
DeliveryTimeoutOption = Annotated[
    str,
    typer.Option(
        "--delivery-timeout",
        metavar="DUR",
        help="Time the broker has to acknowledge a message before its delivery counts as failed",
    ),
]


@command(group=outbox_app)
def relay(
    ctx: typer.Context,
    brokers: BrokersOption = None,
    topic_template: TemplateOption = TEMPLATE_DEFAULT,
    batch_size: BatchOption = 100,
    poll_interval: Annotated[
        str,
        typer.Option("--poll-interval", metavar="DUR", help="Wait between looks at an idle table"),
    ] = "1s",
    listen: Annotated[
        bool,
        typer.Option(
            "--listen/--no-listen",
            help="Wake as soon as rows are committed (LISTEN/NOTIFY); --no-listen: poll only",
        ),
    ] = True,
    backoff: Annotated[
        str,
        typer.Option(
            "--backoff", metavar="DUR", help="Retry delay after a failed delivery, doubling"
        ),
    ] = "1s",
    delivery_timeout: DeliveryTimeoutOption = "30s",
    exit_when_idle: Annotated[
        str | None,
        typer.Option("--exit-when-idle", metavar="DUR", help="Stop after DUR with no row due"),
    ] = None,
    kafka_config: KafkaConfigOption = None,
    metrics_port: MetricsPortOption = None,
    metrics_host: MetricsHostOption = METRICS_HOST,
    log_format: LogFormatOption = LogFormat.AUTO,
) -> None:
    """Publish committed outbox rows to Kafka, marking each published once acknowledged.

    Rows are taken with FOR UPDATE SKIP LOCKED, so several relays may run side by side,
    each aggregate's events in the order they were written. An idle relay wakes as soon as
    new rows commit (LISTEN/NOTIFY), and polls every --poll-interval besides. Each
    message is keyed by aggregateid and carries the row's id and type as headers.
    A failed delivery is counted on its row and retried after a back-off. SIGTERM or
    Ctrl-C finishes the batch in hand and exits. Exits 0 when every row it took was
    delivered, 1 (naming the brokers) when it ends with rows it could not deliver.
    """
    # The relay serves metrics: http.server and ssl, loaded for a relay or replay run only.
    from idemctl.outbox.relay import Relay, RelayOptions
    from idemctl.outbox.relay import register_metrics as relay_metrics

    current = use_log_format(ctx, log_format, metrics_port)
    brokers, kafka = kafka_settings(ctx, brokers, kafka_config)
    options = RelayOptions(
        brokers=brokers,
        topic_template=topic_template,
        batch_size=batch_size,
        poll_interval=duration(poll_interval, "--poll-interval"),
        backoff=duration(backoff, "--backoff"),
        delivery_timeout=duration(delivery_timeout, "--delivery-timeout", positive=True),
        exit_when_idle=duration(exit_when_idle, "--exit-when-idle") if exit_when_idle else None,
        listen=listen,
        kafka_config=kafka,
    )
    show_warnings(current, "idemctl.outbox")
    status = LiveStatus(
        current.err,
        "outbox relay",
        outbox_documents.relay_fields,
        lambda summary: summary.published,
        live=current.live,
        log_format=current.progress_format,
    )
    with cli_open(ctx, store_opener()) as store:
        the_relay = Relay(store, options, on_progress=status.update)
        the_relay.table.check()
        summary = run_to_end(current, the_relay, status, relay_metrics, metrics_host, metrics_port)
    if current.json:
        emit_json(outbox_documents.relay(store_fields(ctx, store.url), brokers, summary))
    else:
        note(
            current,
            f"relayed {summary.published} event(s) in {summary.batches} batch(es); "
            f"{summary.failed} delivery failure(s)",
            fields={**outbox_documents.relay_fields(summary), "batches": summary.batches},
        )
    if summary.undelivered:
        problem = (
            f"{summary.undelivered} outbox row(s) not delivered to the brokers at "
            f"{brokers}: {summary.delivery_error}; they stay unpublished and are retried by the "
            "next relay run ('idemctl outbox status' shows them)"
        )
        note(current, problem, level="error", markup=f"error: {escape(problem)}")
        raise typer.Exit(1)


@command(group=outbox_app)
def status(ctx: typer.Context) -> None:
    """Unpublished rows, the oldest one's age and rows failing, per aggregate type."""
    current = settings(ctx)
    from idemctl.operate import outbox_status as status_of

    with cli_open(ctx, store_opener()) as store:
        found = status_of(store)
    if current.json:
        emit_json(outbox_status.document(store_fields(ctx, store.url), found))
        return
    current.out.print(render.outbox_status_table(found))


@command(group=outbox_app)
def replay(
    ctx: typer.Context,
    ids: Annotated[
        list[str] | None, typer.Option("--id", metavar="ID", help="A row's id (repeatable)")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since", metavar="TIME", help="Rows written at or after TIME (ISO 8601, or DUR ago)"
        ),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(
            "--until", metavar="TIME", help="Rows written before TIME (ISO 8601, or DUR ago)"
        ),
    ] = None,
    aggregate_type: Annotated[
        str | None, typer.Option("--aggregate-type", metavar="T", help="Rows of this type")
    ] = None,
    aggregate_id: Annotated[
        str | None, typer.Option("--aggregate-id", metavar="A", help="Rows of this aggregate")
    ] = None,
    to_topic: Annotated[
        str | None,
        typer.Option(
            "--to-topic", metavar="TOPIC", help="Send every row here instead of its own topic"
        ),
    ] = None,
    brokers: BrokersOption = None,
    topic_template: TemplateOption = TEMPLATE_DEFAULT,
    batch_size: BatchOption = 100,
    delivery_timeout: DeliveryTimeoutOption = "30s",
    kafka_config: KafkaConfigOption = None,
    dry_run: DryRunOption = False,
    yes: YesOption = False,
) -> None:
    """Publish chosen rows again, published or not, with their original ids.

    Choose rows by --id, a --since/--until window on when they were written, --aggregate-type
    and --aggregate-id (all given must hold). Consumers that deduplicate on the id header
    see each event once. Rows replayed to their own topics that were still unpublished are
    marked published. Times without a zone are UTC.
    """
    current = settings(ctx)
    selection = Selection(
        ids=tuple(_row_id(i) for i in ids or ()),
        since=None if since is None else moment(since, "--since"),
        until=None if until is None else moment(until, "--until"),
        aggregatetype=aggregate_type,
        aggregateid=aggregate_id,
    )
    if not selection:
        raise usage_error(
            ctx, "--id", "choose rows: --id, --since, --until, --aggregate-type or --aggregate-id"
        )
    brokers, kafka = kafka_settings(ctx, brokers, kafka_config)
    timeout = duration(delivery_timeout, "--delivery-timeout", positive=True)
    show_warnings(current, "idemctl.outbox")
    with cli_open(ctx, store_opener()) as store:
        chosen = operate.outbox_replay(
            store,
            selection,
            topic_template=topic_template,
            to_topic=to_topic,
            batch_size=batch_size,
        )
        if dry_run:
            _list_rows(ctx, chosen.rows(), chosen.topic_of)
            return
        total = chosen.count()
        if total == 0:
            _replay_report(ctx, store.url, 0, 0, [], 0)
            return
        where = to_topic or f"their topics ({topic_template})"
        question = f"Publish {total} outbox row(s) again to {where}?"
        with changing(ctx, question, yes, "replaying", total, "row(s)") as advance:
            report = chosen.send(brokers, kafka, delivery_timeout=timeout, progress=advance)
    _replay_report(ctx, store.url, total, report.sent, report.failed, report.marked)
    if report.failed:
        raise typer.Exit(1)


def _replay_report(
    ctx: typer.Context,
    url: str,
    selected: int,
    sent: int,
    failed: list[tuple[uuid.UUID, str]],
    marked: int,
) -> None:
    current = settings(ctx)
    if current.json:
        emit_json(outbox_documents.replay(store_fields(ctx, url), selected, sent, failed, marked))
        return
    current.out.print(
        f"replayed {sent} of {selected} row(s) with their original ids"
        + (f"; {marked} were unpublished and are marked published now" if marked else ""),
        markup=False,
    )
    for row_id, error in failed[:20]:
        current.err.print(f"not delivered: {row_id}: {error}", markup=False)
    if len(failed) > 20:
        current.err.print(f"... and {len(failed) - 20} more not delivered", markup=False)


def _list_rows(
    ctx: typer.Context, rows: list[OutboxRow], topic_of: Callable[[OutboxRow], str]
) -> None:
    """What a dry run would send: a table, or NDJSON with each row's topic."""
    current = settings(ctx)
    if current.json:
        for row in rows:
            emit_json(outbox_documents.row(row, topic_of(row)))
        return
    current.out.print(render.outbox_rows_table(rows, topic_of))
    current.err.print(f"dry run: {len(rows)} row(s) would be published again", markup=False)


@command(group=outbox_app)
def purge(
    ctx: typer.Context,
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than", metavar="DUR", help="Rows published at least DUR ago (0s: all)"
        ),
    ],
    dry_run: DryRunOption = False,
    yes: YesOption = False,
) -> None:
    """Delete published rows past retention; unpublished rows are never touched."""
    current = settings(ctx)
    age = duration(older_than, "--older-than")
    with cli_open(ctx, store_opener()) as store:
        found = operate.outbox_purge(store, age, dry_run=True)
        if not dry_run and found:
            question = f"Delete {found} published outbox row(s) on {store.url}?"
            with changing(ctx, question, yes, "purging", found, "row(s)") as advance:
                found = operate.outbox_purge(store, age, progress=advance)
    if current.json:
        where = store_fields(ctx, store.url)
        emit_json(action_document.document("outbox purge", where, dry_run=dry_run, count=found))
    elif dry_run:
        current.err.print(f"dry run: {found} published row(s) would be purged", markup=False)
    else:
        current.out.print(f"purged {found} published outbox row(s) on {store.url}", markup=False)


def _row_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a row id (a UUID)", param_hint="--id") from None
