"""How records, counts and findings look on a terminal. JSON output is the library's own
``to_json`` shapes, described in ``schemas/``."""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from idemctl.durations import format_duration
from idemctl.model import Finding, Record, Stats, Status, iso_time

if TYPE_CHECKING:
    from rich.console import RenderableType

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
    left = (record.lease_expires_at - at).total_seconds()
    return f"{format_duration(left)} left" if left > 0 else f"expired {format_duration(-left)} ago"


def record_detail(record: Record, at: datetime) -> RenderableType:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    retention = "-"
    if record.expires_at is not None:
        left = max(0.0, (record.expires_at - at).total_seconds())
        retention = f"until {stamp(record.expires_at)} ({format_duration(left)} left)"
    lease = lease_text(record, at)
    if record.lease_expires_at is not None and record.owner is not None:
        lease += f" ({stamp(record.lease_expires_at)})"
    age = format_duration((at - record.created_at).total_seconds())
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
        ("retention", retention),
        ("fingerprint", record.fingerprint or "-"),
        ("error", Text(record.error) if record.error else "-"),
        ("result", Text(json.dumps(record.result, ensure_ascii=False, indent=2))
         if record.status is Status.COMPLETED else "-"),
    ]  # fmt: skip
    for name, value in rows:
        grid.add_row(name, value)
    return grid


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


def stats_json(stats: Stats, url: str, at: datetime) -> dict[str, Any]:
    oldest = stats.oldest_in_progress
    return {
        "store": url,
        "total": stats.total,
        "by_status": {s.value: stats.by_status.get(s, 0) for s in Status},
        "stale": stats.stale,
        "released": stats.released,
        "oldest_in_progress_at": iso_time(oldest),
        "oldest_in_progress_age_seconds": (
            None if oldest is None else round((at - oldest).total_seconds(), 3)
        ),
        "past_retention": stats.past_retention,
    }


def stats_table(stats: Stats, at: datetime) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(justify="right")
    grid.add_column()
    for status in Status:
        grid.add_row(status.value, str(stats.by_status.get(status, 0)), "", style=STYLE[status])
    grid.add_row("total", str(stats.total), "")
    grid.add_row(
        "stale leases", str(stats.stale),
        "expired, never freed (worker gone?): idemctl list --stale; idemctl unlock --stale"
        if stats.stale else "",
        style="bold magenta" if stats.stale else None,
    )  # fmt: skip
    grid.add_row(
        "released", str(stats.released),
        "freed, waiting for the next delivery to claim them: idemctl list --released"
        if stats.released else "",
    )  # fmt: skip
    oldest = stats.oldest_in_progress
    grid.add_row(
        "oldest in progress",
        "-" if oldest is None else format_duration((at - oldest).total_seconds()),
        "" if oldest is None else f"created {stamp(oldest)}",
    )
    if stats.past_retention:
        grid.add_row(
            "past retention", str(stats.past_retention), "kept until purged: idemctl purge"
        )
    return grid


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


def finding_json(finding: Finding) -> dict[str, Any]:
    return {
        "name": finding.name, "ok": finding.ok, "level": finding.level,
        "detail": finding.detail, "fix": finding.fix,
    }  # fmt: skip


def key_list(keys: list[str], shown: int = 20) -> str:
    """Up to ``shown`` keys, then how many more."""
    head = ", ".join(keys[:shown])
    return head + (f" and {len(keys) - shown} more" if len(keys) > shown else "")


class LiveStatus:
    """Progress of a long-running command: a live table on a terminal; otherwise a logfmt
    line on stderr every ``every`` seconds, for log collectors. ``header`` names what it
    works on (topic, group, store); ``fields`` gives what to show from the summary it is
    updated with (counts, a state), ``done`` what the rate counts. The rate is over the last
    ``window`` seconds, not the run's average."""

    def __init__(
        self,
        err: Any,
        name: str,
        fields: Callable[[Any], dict[str, Any]],
        done: Callable[[Any], int],
        *,
        live: bool,
        every: float = 10.0,
        header: dict[str, str] | None = None,
        window: float = 10.0,
    ) -> None:
        self.err, self.name, self.fields, self.done = err, name, fields, done
        self.live, self.every, self.header, self.window = live, every, header or {}, window
        self.started = self.last = time.monotonic()
        self._seen: deque[tuple[float, int]] = deque([(self.started, 0)])
        self._live: Any = None

    def __enter__(self) -> LiveStatus:
        if self.live:
            from rich.live import Live

            self._live = Live(console=self.err, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def rate(self, now: float, done: int) -> float:
        """Per second over the last ``window`` seconds."""
        self._seen.append((now, done))
        while len(self._seen) > 2 and self._seen[0][0] < now - self.window:
            self._seen.popleft()
        then, before = self._seen[0]
        return (done - before) / max(now - then, 1e-9)

    def update(self, summary: Any) -> None:
        now = time.monotonic()
        done = self.done(summary)
        rate = self.rate(now, done)
        fields = {k: v for k, v in self.fields(summary).items() if v is not None}
        elapsed = format_duration(now - self.started)
        if self._live is not None:
            table = Table.grid(padding=(0, 2))
            for name, value in self.header.items():
                table.add_row(Text(name, style="dim"), Text(value))
            for name, value in fields.items():
                table.add_row(name.replace("_", " "), Text(str(value)))
            table.add_row("elapsed", elapsed)
            table.add_row(f"rate ({self.window:.0f}s)", f"{rate:,.0f}/s")
            self._live.update(table)
        elif now - self.last >= self.every:
            self.last = now
            self.err.print(
                logfmt(
                    "info", f"{self.name} progress", **self.header, done=done,
                    rate=f"{rate:.0f}/s", elapsed=elapsed, **fields,
                ),
                markup=False, highlight=False, soft_wrap=True,
            )  # fmt: skip


def logfmt(level: str, msg: str, **fields: Any) -> str:
    """One logfmt line: ``ts=... level=... msg="..." key=value ...``, quoted where needed."""
    ts = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    pairs = {"ts": ts, "level": level, "msg": msg, **fields}
    return " ".join(f"{k.replace(' ', '_')}={_logfmt_value(v)}" for k, v in pairs.items())


def _logfmt_value(value: Any) -> str:
    text = str(value)
    if text and not any(c in text for c in ' ="\\') and text.isprintable():
        return text
    return json.dumps(text, ensure_ascii=False)
