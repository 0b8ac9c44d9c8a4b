"""``idemctl verify --http URL``: the options of the HTTP mode, and its table.

``verify`` hands over here when ``--http`` is given; the checks themselves are the
library's (``idemctl.harness.httpcheck``), this module reads the options and renders."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table
from rich.text import Text

from idemctl.cli.common import emit_json, note, option_of, settings

if TYPE_CHECKING:
    from idemctl.harness.httpcheck import HttpReport, Point

STYLES = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
KAFKA_ONLY = (
    "brokers",
    "kafka_config",
    "messages",
    "duplicates",
    "poison",
    "partitions",
    "consumers",
    "kill_every",
    "rebalance",
    "store_pause",
    "store_fault_cmd",
    "transactional",
    "batch_size",
    "lease",
    "rate",
    "keep",
    "run_id",
    "sabotage",
)
"""verify's parameters that only its Kafka mode takes."""
HTTP_ONLY = (
    "method",
    "data",
    "data_file",
    "header",
    "second_caller_header",
    "key_header",
    "bare_key",
    "fault_path",
    "fault_data",
    "concurrency",
)
"""verify's parameters that only ``--http`` takes."""
DEFAULT_TIMEOUT = "30s"
"""--timeout under --http: each connection's and answer's limit."""


@dataclass(frozen=True)
class HttpOptions:
    """What the command line gave the HTTP mode, as typed."""

    url: str
    method: str
    data: str | None
    data_file: str | None
    header: list[str]
    second_caller_header: list[str]
    key_header: str
    bare_key: bool
    fault_path: str | None
    fault_data: str | None
    concurrency: int
    timeout: str | None
    """None: not given (DEFAULT_TIMEOUT)."""


def given(ctx: typer.Context, name: str) -> bool:
    """Whether the command line gave ``name`` (not its default nor the environment)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def refuse_mixed(ctx: typer.Context, http: bool) -> None:
    """A usage error for an option of the other mode."""
    from idemctl.cli.common import usage_error

    names = KAFKA_ONLY if http else HTTP_ONLY
    for name in names:
        if given(ctx, name):
            option = option_of(ctx, name)
            if http:
                raise usage_error(ctx, option, "is for verify on Kafka, not with --http")
            raise usage_error(ctx, option, "needs --http URL")


def body_of(data: str | None, data_file: str | None) -> bytes:
    from idemctl.errors import OptionError

    if data is not None and data_file is not None:
        raise OptionError("data_file", "give --data or --data-file, not both")
    if data_file is None:
        return (data or "").encode()
    if data_file == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(data_file).read_bytes()
    except OSError as exc:
        raise OptionError("data_file", f"{data_file}: {exc.strerror or exc}") from None


def run_http(ctx: typer.Context, given_options: HttpOptions) -> None:
    """Check the API, print its points (a table, or --json), exit 1 if one failed."""
    from idemctl.cli.common import duration
    from idemctl.harness.httpcheck import HttpTarget, check_api, header_pair
    from idemctl.operate.documents import verify_http as verify_http_document

    opts = given_options
    current = settings(ctx)
    target = HttpTarget(
        url=opts.url,
        method=opts.method.upper(),
        body=body_of(opts.data, opts.data_file),
        headers=tuple(header_pair(h, "header") for h in opts.header),
        second_caller=tuple(
            header_pair(h, "second_caller_header") for h in opts.second_caller_header
        ),
        key_header=opts.key_header,
        bare_key=opts.bare_key,
        fault_path=opts.fault_path,
        fault_body=None if opts.fault_data is None else opts.fault_data.encode(),
        concurrency=opts.concurrency,
        timeout=duration(opts.timeout or DEFAULT_TIMEOUT, "--timeout", positive=True),
    )
    err = current.err
    showing = err.is_terminal and not current.json

    def heard(point: Point) -> None:
        if showing:
            err.print(
                Text.assemble(
                    "- ", (point.title, "dim"), ": ", (point.verdict, STYLES[point.verdict])
                )
            )

    report = check_api(target, on_point=heard)
    if current.json:
        emit_json(verify_http_document.document(report))
    else:
        current.out.print(table(report))
        summary(ctx, report)
    if not report.ok:
        raise typer.Exit(1)


def table(report: HttpReport) -> Table:
    """A row a point: its verdict in colour and why."""
    title = f"idemctl verify --http {report.method} {report.url}"
    caption = [
        f"keys: {report.key_header}, "
        + ("bare" if report.key_form == "bare" else 'as "..." strings')
    ]
    if report.headers:
        caption.append("headers: " + ", ".join(f"{n}: {v}" for n, v in report.headers))
    if report.second_caller:
        shown = ", ".join(f"{n}: {v}" for n, v in report.second_caller)
        caption.append(f"second caller: {shown}")
    table = Table(
        title=Text(title),
        title_justify="left",
        caption=Text("; ".join(caption)),
        caption_justify="left",
    )
    table.add_column("point", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("why", max_width=100)
    for point in report.points:
        table.add_row(
            point.title, Text(point.verdict, style=STYLES[point.verdict]), Text(point.reason)
        )
    return table


def summary(ctx: typer.Context, report: HttpReport) -> None:
    current = settings(ctx)
    counts = ", ".join(
        f"{report.count(verdict)} {word}"
        for verdict, word in (("pass", "passed"), ("warn", "warned"), ("skip", "skipped"))
        if report.count(verdict)
    )
    if report.failed:
        names = ", ".join(point.title for point in report.failed)
        text = f"{len(report.failed)} failed ({names}); {counts}"
        note(current, f"FAILED: {text}", level="error", markup=f"[bold red]FAILED:[/] {text}")
    else:
        note(current, f"ok: {counts}", markup=f"[green]ok:[/] {counts}")
