"""Checking a live consumer group for work it passed and never finished: audit."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from idemctl.cli.common import (
    cli_open,
    command,
    emit_json,
    moment,
    note,
    settings,
    store_fields,
    store_opener,
)
from idemctl.cli.declared import Given, declared
from idemctl.cli.running import (
    BrokersOption,
    KafkaConfigOption,
    kafka_settings,
)
from idemctl.errors import ConfigError
from idemctl.kafka.options import Keyed

if TYPE_CHECKING:
    from rich.console import Console

    from idemctl.audit import AuditReport

HEADINGS = {
    "done": "done",
    "dead_lettered": "dead-lettered",
    "stale": "stale",
    "skipped": "skipped",
    "in_flight": "in flight",
    "beyond_retention": "beyond retention",
    "lost": "lost",
}
LOST_PRINTED = 20
"""Lost messages the text output names (--json: the first 100)."""


@command()
@declared(
    Keyed,  # --key, --on-missing-key, --order-key, --sequence: as consume derives keys
    ("topic", "group", "brokers", "kafka_config", "key", "on_missing_key", "order_key",
     "sequence", "last", "since", "dlq_topic", "rate", "batch", "fail_on"),
)  # fmt: skip
def audit(
    ctx: typer.Context,
    topic: Annotated[str, typer.Option("--topic", metavar="TOPIC", help="The group's topic")],
    group: Annotated[str, typer.Option("--group", metavar="GROUP", help="Consumer group id")],
    declared: Given,
    brokers: BrokersOption = None,
    kafka_config: KafkaConfigOption = None,
    last: Annotated[
        int,
        typer.Option(
            "--last", metavar="N", min=1, help="Messages per partition below the committed offset"
        ),
    ] = 10_000,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            metavar="TIME",
            help="Instead of --last: messages from TIME on (ISO 8601, UTC unless it says, or a "
            "duration ago such as 6h)",
        ),
    ] = None,
    dlq_topic: Annotated[
        str | None,
        typer.Option(
            "--dlq-topic",
            metavar="TOPIC",
            help="Cross-check: a message counted dead-lettered must be in TOPIC, else it is lost",
        ),
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option("--rate", metavar="N", help="Messages a second at most (brokers and store)"),
    ] = None,
    batch: Annotated[
        int,
        typer.Option("--batch", metavar="N", help="Messages per store round trip (1 to 10000)"),
    ] = 500,
    fail_on: Annotated[
        str,
        typer.Option(
            "--fail-on",
            metavar="CLASSES",
            help="Exit 1 when any of these has messages: lost, in-flight, beyond-retention, "
            "dead-lettered, stale, pending (comma-separated)",
        ),
    ] = "lost",
) -> None:
    """Check a consumer group for messages it committed past and never finished.

    Reads the last N messages below the group's committed offset in each partition (with
    assign: it never joins the group or commits) and looks up each key as consume derives
    it. A message whose key is in progress with an expired lease, released, or absent
    while younger than the store's retention is lost: the group will not read it again.
    Exit 1 when anything is lost (or of a --fail-on class), or when the setup looks wrong:
    more than half the messages without a usable key under --key, or none of the keys in
    the store; 0 otherwise. A group that committed nothing on the topic, or a --since
    before 1970 or after now, is exit 2.
    """
    from idemctl import operate
    from idemctl.audit import FAIL_ON, AuditOptions
    from idemctl.operate.documents import audit as audit_document

    current = settings(ctx)
    failing_on = _classes(fail_on, FAIL_ON)
    brokers, kafka = kafka_settings(ctx, brokers, kafka_config)
    options = AuditOptions(
        brokers=brokers,
        topic=topic,
        group=group,
        **declared.values(),
        last=last,
        since=None if since is None else moment(since, "--since"),
        dlq_topic=dlq_topic,
        rate=rate,
        batch=batch,
        kafka_config=kafka,
    )
    with cli_open(ctx, store_opener()) as store, _progress(ctx) as on_progress:
        report = operate.audit(store, options, on_progress)
    failing = report.failing(failing_on)
    doubts = report.doubts()
    if current.json:
        emit_json(audit_document.document(report, store_fields(ctx, report.store), failing))
    else:
        current.out.print(_table(report))
        _print_lost(current.out, report)
        totals = report.totals()
        if report.uncommitted:
            where = ", ".join(f"{report.topic}[{p}]" for p in report.uncommitted)
            note(
                current,
                f"no commit on {where} by group {report.group}: not audited (counted pending)",
                level="warning",
                fields={"uncommitted": ",".join(map(str, report.uncommitted))},
            )
        for doubt in doubts:
            note(
                current,
                f"FAILED: {doubt.hint}",
                level="error",
                markup=f"[bold red]FAILED:[/] {escape(doubt.hint)}",
                fields={"doubt": doubt.cause, "audited": report.audited},
            )
        if failing and not any(d.cause == "store" for d in doubts):  # else: not the group's
            shown = ", ".join(f"{totals[c]} {HEADINGS.get(c, c)}" for c in failing)
            note(
                current,
                f"FAILED: {shown} of {report.audited} message(s) audited",
                level="error",
                markup=f"[bold red]FAILED:[/] {escape(shown)} of {report.audited} message(s) "
                "audited",
                fields={"failing": ",".join(failing), "audited": report.audited},
            )
        elif not doubts:
            note(
                current,
                f"ok: nothing lost among {report.audited} message(s) audited",
                markup=f"[green]ok:[/] nothing lost among {report.audited} message(s) audited",
                fields={"audited": report.audited},
            )
    if failing or doubts:
        raise typer.Exit(1)


def _classes(text: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    chosen = tuple(c.strip().replace("-", "_") for c in text.split(",") if c.strip())
    wrong = [c for c in chosen if c not in allowed]
    if wrong or not chosen:
        names = ", ".join(a.replace("_", "-") for a in allowed)
        raise ConfigError(f"--fail-on {text!r}: use one or more of {names}")
    return chosen


@contextmanager
def _progress(ctx: typer.Context) -> Iterator[Any]:
    """A progress bar on stderr (a terminal only) that audit's progress moves."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    current = settings(ctx)
    with Progress(
        TextColumn("auditing"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[lost]} lost"),
        TimeElapsedColumn(),
        console=current.err,
        transient=True,
        disable=current.json or not current.err.is_terminal,
    ) as bar:
        task = bar.add_task("audit", total=None, lost=0)
        yield lambda p: bar.update(task, total=p.total, completed=p.done, lost=p.lost)


def _table(report: AuditReport) -> Table:
    table = Table(title=f"{report.topic} · group {report.group}", title_justify="left")
    table.add_column("partition", justify="right")
    table.add_column("audited", justify="right")
    table.add_column("committed", justify="right")
    for heading in HEADINGS.values():
        style = "red" if heading == "lost" else None
        table.add_column(heading, justify="right", style=style)
    table.add_column("pending", justify="right")
    for p in report.partitions:
        committed = "-" if p.committed is None else str(p.committed)
        span = f"{p.start}..{p.start + p.audited}" if p.audited else "-"
        counts = [str(p.counts[c]) for c in HEADINGS]
        table.add_row(str(p.partition), span, committed, *counts, str(p.pending))
    totals = report.totals()
    table.add_section()
    row = [str(totals[c]) for c in HEADINGS]
    table.add_row("all", str(report.audited), "", *row, str(totals["pending"]), style="bold")
    return table


def _print_lost(out: Console, report: AuditReport) -> None:
    if not report.lost:
        return
    total = report.totals()["lost"]
    shown = report.lost[:LOST_PRINTED]
    more = f" (the first {len(shown)})" if total > len(shown) else ""
    out.print(f"lost{more}:", highlight=False)
    for m in shown:
        key = "-" if m.key is None else escape(m.key)
        out.print(f"  {report.topic}[{m.partition}]@{m.offset}  {key}: {escape(m.why)}")
