"""What every command shows on a terminal: its tables and lines (the ``--json`` documents
are ``idemctl.operate.documents``'). Command modules call these and print what they return."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from idemctl.cli.results import result_text
from idemctl.durations import format_duration
from idemctl.model import Entity, Finding, Record, Stats, Status

if TYPE_CHECKING:
    from rich.console import JustifyMethod, RenderableType

    from idemctl.harness.demo import DemoReport
    from idemctl.harness.verify import VerifyReport
    from idemctl.operate.doctor import DoctorReport
    from idemctl.outbox.table import OutboxRow, OutboxStatus

STYLE = {Status.IN_PROGRESS: "yellow", Status.COMPLETED: "green", Status.FAILED: "red"}


def now() -> datetime:
    return datetime.now(UTC)


def when(moment: datetime | None, at: datetime) -> str:
    """``2026-11-22 10:01:02Z (3m12s ago)``; ``-`` for none."""
    if moment is None:
        return "-"
    return f"{stamp(moment)} ({relative(moment, at)})"


def stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def relative(moment: datetime, at: datetime) -> str:
    seconds = (moment - at).total_seconds()
    return f"in {format_duration(seconds)}" if seconds > 0 else f"{format_duration(-seconds)} ago"


def status_text(record: Record, at: datetime) -> Text:
    label = record.status.value
    if record.stale(at):
        return Text(f"{label} (stale)", style="bold magenta")
    if record.released():
        return Text(f"{label} (released)", style=STYLE[record.status])
    if record.status is Status.FAILED:
        label += " (retriable)" if record.retriable else " (permanent)"
    return Text(label, style=STYLE[record.status])


def lease_text(record: Record, at: datetime) -> str:
    if record.status is not Status.IN_PROGRESS:
        return "-"
    if record.owner is None:
        return "released"
    assert record.lease_expires_at is not None
    return time_left(record.lease_expires_at, at)


def time_left(until: datetime, at: datetime) -> str:
    """``12s left``, or ``expired 3s ago``: a lease's or a hold's end seen from ``at``."""
    left = (until - at).total_seconds()
    return f"{format_duration(left)} left" if left > 0 else f"expired {format_duration(-left)} ago"


def retention_text(expires_at: datetime | None, at: datetime) -> str:
    if expires_at is None:
        return "-"
    left = max(0.0, (expires_at - at).total_seconds())
    return f"until {stamp(expires_at)} ({format_duration(left)} left)"


def detail_grid(rows: list[tuple[str, str | Text]]) -> RenderableType:
    """``inspect``'s view: a name and its value on each line."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for name, value in rows:
        grid.add_row(name, value)
    return grid


def record_detail(record: Record, at: datetime) -> RenderableType:
    lease = lease_text(record, at)
    if record.lease_expires_at is not None and record.owner is not None:
        lease += f" ({stamp(record.lease_expires_at)})"
    age = format_duration((at - record.created_at).total_seconds())
    result = result_text(record.result) if record.status is Status.COMPLETED else "-"
    rows: list[tuple[str, str | Text]] = [
        ("key", Text(record.key)),
        ("status", status_text(record, at)),
        ("owner", record.owner or "-"),
        ("fencing token", str(record.fencing_token)),
        ("attempts", str(record.attempts)),
        ("lease", lease),
        ("age", f"{age} (created {stamp(record.created_at)})"),
        ("updated", when(record.updated_at, at)),
        ("completed", when(record.completed_at, at)),
        ("retention", retention_text(record.expires_at, at)),
        ("fingerprint", record.fingerprint or "-"),
        ("error", Text(record.error) if record.error else "-"),
        ("result", result),
    ]
    return detail_grid(rows)


def records_table(records: list[Record], at: datetime) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("KEY", overflow="fold")
    table.add_column("STATUS", no_wrap=True)
    table.add_column("TOKEN", justify="right")
    table.add_column("ATTEMPTS", justify="right")
    table.add_column("LEASE", no_wrap=True)
    table.add_column("AGE", justify="right", no_wrap=True)
    for r in records:
        table.add_row(
            Text(r.key),
            status_text(r, at),
            str(r.fencing_token),
            str(r.attempts),
            lease_text(r, at),
            format_duration((at - r.created_at).total_seconds()),
        )
    return table


def hold_text(entity: Entity, at: datetime) -> str:
    """How long the attempt holding ``entity`` keeps it: ``12s left``, ``expired 3s ago``
    (a hold that expired still lets its holder settle until another key takes it)."""
    if entity.holder is None or entity.lock_expires_at is None:
        return "-"
    return time_left(entity.lock_expires_at, at)


def entity_detail(entity: Entity, at: datetime) -> RenderableType:
    hold = hold_text(entity, at)
    if entity.holder is not None and entity.lock_expires_at is not None:
        hold += f" ({stamp(entity.lock_expires_at)})"
    rows: list[tuple[str, str | Text]] = [
        ("entity", Text(entity.entity)),
        ("sequence", "-" if entity.sequence is None else str(entity.sequence)),
        ("applied", when(entity.applied_at, at)),
        ("applied by", "-" if entity.key is None else Text(entity.key)),
        ("holder", "-" if entity.holder is None else Text(entity.holder)),
        ("holder token", "-" if entity.holder_token is None else str(entity.holder_token)),
        ("hold", hold),
        ("updated", when(entity.updated_at, at)),
        ("retention", retention_text(entity.expires_at, at)),
    ]
    return detail_grid(rows)


def entities_table(entities: list[Entity], at: datetime) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("ENTITY", overflow="fold")
    table.add_column("SEQUENCE", justify="right")
    table.add_column("APPLIED AT", no_wrap=True)
    table.add_column("KEY", overflow="fold")
    table.add_column("HOLDER", overflow="fold")
    for e in entities:
        holder: str | Text = "-"
        if e.holder is not None:
            holder = Text(f"{e.holder} ({hold_text(e, at)})")
            holder.stylize("yellow" if e.locked(at) else "magenta")
        table.add_row(
            Text(e.entity),
            "-" if e.sequence is None else str(e.sequence),
            when(e.applied_at, at),
            "-" if e.key is None else Text(e.key),
            holder,
        )
    return table


def entity_summary(entity: Entity) -> str:
    """``at sequence 11, applied by key 'e11'; held by key 'e12'`` (plain text)."""
    if entity.sequence is None:
        text = "no sequence applied yet"
    else:
        text = f"at sequence {entity.sequence}, applied by key {entity.key!r}"
    if entity.holder is not None:
        text += f"; held by key {entity.holder!r}"
    return text


def stats_table(stats: Stats, at: datetime, entities: int | None) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(justify="right")
    grid.add_column()
    for status in Status:
        count = stats.by_status.get(status)
        grid.add_row(status.value, "-" if count is None else str(count), "", style=STYLE[status])
    grid.add_row("total", str(stats.total), "")
    stale = "expired, never freed (worker gone?): idemctl list --stale; idemctl unlock --stale"
    released = "freed, waiting for the next delivery to claim them: idemctl list --released"
    grid.add_row(
        "stale leases",
        str(stats.stale),
        stale if stats.stale else "",
        style="bold magenta" if stats.stale else None,
    )
    grid.add_row("released", str(stats.released), released if stats.released else "")
    oldest = stats.oldest_in_progress
    grid.add_row(
        "oldest in progress",
        "-" if oldest is None else format_duration((at - oldest).total_seconds()),
        "" if oldest is None else f"created {stamp(oldest)}",
    )
    if entities is None and stats.counted_by == "approximate":
        grid.add_row("entities", "-", "counted by a scan: idemctl stats --exact")
    elif entities is None:
        grid.add_row("entities", "-", "no sequence guard table yet: idemctl init")
    else:
        guarded = "last applied sequence per entity: idemctl list --entities"
        grid.add_row("entities", str(entities), guarded if entities else "")
    if stats.past_retention:
        grid.add_row(
            "past retention", str(stats.past_retention), "kept until purged: idemctl purge"
        )
    grid.add_row("counted by", stats.counted_by, COUNTED_BY.get(stats.counted_by, ""))
    return grid


COUNTED_BY = {
    "scan": "every record read",
    "query": "the database counted its rows",
    "index": "the store's counters (a record counts up to a second past its TTL): "
    "stats --exact reads every record",
    "approximate": "DynamoDB's item count, refreshed about every six hours; in progress "
    "exact: stats --exact scans the table",
}


def findings_table(findings: list[Finding]) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    marks = {
        "ok": Text("ok", style="green"),
        "warn": Text("WARN", style="bold yellow"),
        "fail": Text("FAIL", style="bold red"),
    }
    for f in findings:
        label = "fix" if f.level == "fail" else "note"
        detail = escape(f.detail) + (
            "" if f.level == "ok" or not f.fix else f"\n[yellow]{label}:[/] {escape(f.fix)}"
        )
        grid.add_row(marks[f.level], f.name, Text.from_markup(detail))
    return grid


def doctor_summary(report: DoctorReport) -> str:
    """The verdict line under the findings (markup)."""
    warned = report.warned
    warnings = f", {len(warned)} warning(s)" if warned else ""
    if report.failed:
        return f"[bold red]{len(report.failed)} problem(s) found[/]{warnings}"
    return f"[green]all checks passed[/]{warnings}"


# Kafka: consume, demo, the outbox ------------------------------------------------------


def demo_table(report: DemoReport) -> Table:
    table = Table(title="Each payment's charges", title_justify="left")
    table.add_column("payments", justify="right")
    table.add_column("messages delivered", justify="right")
    table.add_column("consumers killed", justify="right")
    table.add_column("stopped", justify="right")
    table.add_column("charged once", justify="right", style="green")
    table.add_column("charged twice", justify="right")
    table.add_column("never charged", justify="right")
    table.add_row(
        str(report.payments),
        str(report.messages),
        str(report.kills),
        str(report.stopped),
        str(report.once),
        str(len(report.twice)),
        str(len(report.never)),
    )
    return table


def verify_table(report: VerifyReport) -> Table:
    """The proof, a row a figure; what broke the guarantee in red."""
    ms = "-" if report.p50_ms is None else f"{report.p50_ms:,.0f} ms / {report.p99_ms:,.0f} ms"
    bad = "bold red"
    rows: list[tuple[str, str, str]] = [
        ("store", report.store, ""),
        ("topic", f"{report.topic} ({report.partitions} partitions)", ""),
        ("mode", report.mode, ""),
        ("guarantee", report.guarantee, ""),
        ("messages", f"{report.messages:,} ({report.keys:,} keys, {report.poison_planted} "
         "poison planted)", ""),
        ("consumers", f"{report.consumers}, {report.kills} SIGKILLed and restarted "
         f"({report.kills_mid_handler} mid-handler), {report.rebalances} joins and leaves, "
         f"{report.consumer_exits} exits of their own", ""),
    ]  # fmt: skip
    for fault in report.faults:
        rows.append(
            (
                "store fault",
                f"{fault.kind} for {fault.seconds:g}s: "
                + ("failed closed" if fault.failed_closed else "did NOT fail closed")
                + f"; {fault.effects_during} effect(s) recorded meanwhile (handlers claimed "
                f"before it), {fault.consumer_exits} consumer exit(s)",
                "green" if fault.failed_closed else bad,
            )
        )
    rows += [
        ("effects", f"{report.effects:,}", ""),
        ("lost keys", str(len(report.lost)), bad if report.lost else "green"),
        (
            "duplicate effects",
            f"{report.duplicate_effects} (the guarantee allows {report.duplicates_allowed})",
            bad if report.duplicate_effects > report.duplicates_allowed else "green",
        ),
    ]
    if report.fenced:
        mismatched = len(report.fence_mismatches)
        rows += [
            ("fenced writes", f"{report.effects_replaced} replaced by a takeover's, "
             f"{report.late_writes_refused} late one(s) refused by their token", ""),
            ("fence", "every effect is its completing attempt's" if not mismatched
             else f"{mismatched} effect(s) NOT their completing attempt's",
             bad if mismatched else "green"),
        ]  # fmt: skip
    rows += [
        (
            "dead letters",
            f"{report.dead_letters} for {report.poison_planted} poison key(s)"
            + (f", {len(report.poison_missing)} missing" if report.poison_missing else "")
            + (
                f", {len(report.dead_letters_unexpected)} good key(s)"
                if report.dead_letters_unexpected
                else ""
            ),
            bad if report.poison_missing or report.dead_letters_unexpected else "green",
        ),
        ("lag left", str(report.lag_left), bad if report.lag_left else ""),
        ("latency p50 / p99", ms, ""),
        ("throughput", f"{report.throughput:,.0f} msg/s over {report.seconds:.1f}s", ""),
    ]
    table = Table(title=f"idemctl verify {report.run_id}", title_justify="left", show_header=False)
    table.add_column(style="dim", no_wrap=True)
    table.add_column(max_width=90)
    for name, value, style in rows:
        table.add_row(name, Text(value, style=style))
    return table


OUTBOX_COLUMNS: tuple[tuple[str, JustifyMethod], ...] = (
    ("aggregate type", "left"),
    ("unpublished", "right"),
    ("oldest unpublished", "right"),
    ("failing", "right"),
    ("published", "right"),
    ("last published", "left"),
    ("last error", "left"),
)


def outbox_status_table(found: OutboxStatus) -> Table:
    table = Table(title="Outbox", title_justify="left")
    for name, justify in OUTBOX_COLUMNS:
        table.add_column(name, justify=justify)
    rows = [*found.types, found.total] if len(found.types) != 1 else found.types
    for t in rows:
        oldest = t.oldest_unpublished
        table.add_row(
            "all" if t.aggregatetype == "*" else Text(t.aggregatetype),
            str(t.unpublished),
            "-" if oldest is None else format_duration((found.now - oldest).total_seconds()),
            f"[red]{t.failing}[/]" if t.failing else "0",
            str(t.published),
            when(t.last_published, found.now),
            "-" if t.last_error is None else Text(t.last_error),
            style="bold" if t.aggregatetype == "*" else None,
        )
    return table


def outbox_rows_table(rows: list[OutboxRow], topic_of: Callable[[OutboxRow], str]) -> Table:
    table = Table(title_justify="left")
    for name in ("id", "created", "published", "aggregate type", "aggregate id", "type", "topic"):
        table.add_column(name, overflow="fold")
    for row in rows:
        table.add_row(
            str(row.id),
            stamp(row.created_at),
            "-" if row.published_at is None else stamp(row.published_at),
            *map(Text, (row.aggregatetype, row.aggregateid, row.type, topic_of(row))),
        )
    return table


# Text ---------------------------------------------------------------------------------


def key_list(keys: list[str], shown: int = 20) -> str:
    """Up to ``shown`` keys, then how many more."""
    head = ", ".join(keys[:shown])
    return head + (f" and {len(keys) - shown} more" if len(keys) > shown else "")
