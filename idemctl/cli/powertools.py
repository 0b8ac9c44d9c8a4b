"""How the operator's commands show a Powertools table (``--store URL?layout=powertools``;
``idemctl.operate`` does the work, with Powertools' states); and ``idemctl powertools key``,
the key of a payload."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from idemctl.cli import render
from idemctl.cli.common import (
    app,
    command,
    emit_json,
    settings,
    usage_error,
)
from idemctl.cli.help import QuietGroup
from idemctl.errors import ConfigError
from idemctl.powertools import PowertoolsRecord, State, powertools_key
from idemctl.powertools.model import PowertoolsStats

STYLE = {
    State.COMPLETED: "green",
    State.IN_PROGRESS: "yellow",
    State.STALE: "bold magenta",
    State.BLOCKED: "bold red",
    State.EXPIRED: "dim",
    State.INVALID: "red",
}


def report_one(
    ctx: typer.Context, action: str, record: PowertoolsRecord, at: datetime, dry_run: bool
) -> None:
    """What ``unlock KEY`` or ``forget KEY`` did to a Powertools record (or would do)."""
    current = settings(ctx)
    state = record.state(at).value
    then = "its next call would run the function" if dry_run else "its next call runs the function"
    verb = {"unlock": "deleted", "forget": "forgot"}[action]
    if dry_run:
        verb = f"would {action}"
    current.out.print(
        f"{verb} {record.key!r} (it {'is' if dry_run else 'was'} {state}): {then}", markup=False
    )
    if action == "forget" and not dry_run:
        current.err.print(
            "note: warm functions with use_local_cache keep replaying it from their cache "
            "until it expires there",
            markup=False,
        )


# Rendering -------------------------------------------------------------------------------


def state_text(record: PowertoolsRecord, at: datetime) -> Text:
    state = record.state(at)
    return Text(state.value, style=STYLE[state])


def record_detail(record: PowertoolsRecord, at: datetime) -> RenderableType:
    rows: list[tuple[str, str | Text]] = [("key", record.key)]
    if record.partition is not None:
        rows.append(("partition", record.partition))
    rows += [
        ("state", state_text(record, at)),
        ("status", record.status or "-"),
        ("in progress until", render.when(record.in_progress_expiration, at)),
        ("expiration", render.when(record.expiration, at)),
        ("validation", record.validation or "-"),
        ("data", "-" if record.data is None else json.dumps(record.data, default=str)),
    ]
    rows += [("problem", p) for p in record.problems]
    return render.detail_grid(rows)


def records_table(records: list[PowertoolsRecord], at: datetime) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("KEY", overflow="fold")
    table.add_column("STATE", no_wrap=True)
    table.add_column("IN PROGRESS UNTIL", no_wrap=True)
    table.add_column("EXPIRES", no_wrap=True)
    for r in records:
        table.add_row(
            Text(r.key),
            state_text(r, at),
            "-"
            if r.in_progress_expiration is None
            else render.relative(r.in_progress_expiration, at),
            "-" if r.expiration is None else render.relative(r.expiration, at),
        )
    return table


def stats_table(counts: PowertoolsStats) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("STATE")
    table.add_column("RECORDS", justify="right")
    for state, n in counts.by_state.items():
        table.add_row(Text(state.value, style=STYLE[state] if n else ""), str(n))
    table.add_row(Text("total", style="bold"), str(counts.total))
    if counts.skipped:
        table.add_row("other items", str(counts.skipped))
    return table


# idemctl powertools key ------------------------------------------------------------------

powertools_app = typer.Typer(
    name="powertools",
    cls=QuietGroup,
    help="Powertools for AWS Lambda: the key of a payload (operate its tables with "
    "--store URL?layout=powertools).",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(powertools_app, name="powertools")


@command("key", group=powertools_app)
def key(
    ctx: typer.Context,
    payload: Annotated[
        str,
        typer.Option(
            "--payload",
            metavar="JSON",
            help="The payload as JSON, @FILE, or - for stdin: the event (@idempotent) or "
            "the data keyword argument (@idempotent_function)",
        ),
    ],
    function: Annotated[
        str | None,
        typer.Option(
            "--function",
            metavar="MODULE.QUALNAME",
            help="The decorated function: app.lambda_handler, orders.process_order",
        ),
    ] = None,
    lambda_function: Annotated[
        str | None,
        typer.Option(
            "--lambda-function",
            metavar="NAME",
            help="The Lambda function's name (AWS_LAMBDA_FUNCTION_NAME; test-func outside Lambda)",
        ),
    ] = None,
    key_prefix: Annotated[
        str | None,
        typer.Option("--key-prefix", metavar="PREFIX", help="The decorator's key_prefix, if set"),
    ] = None,
    event_key_jmespath: Annotated[
        str | None,
        typer.Option(
            "--event-key-jmespath",
            metavar="EXPR",
            help="IdempotencyConfig's event_key_jmespath, e.g. 'powertools_json(body).order_id'",
        ),
    ] = None,
    hash_function: Annotated[
        str,
        typer.Option("--hash-function", metavar="NAME", help="IdempotencyConfig's hash_function"),
    ] = "md5",
) -> None:
    """Print the idempotency key Powertools (Python) stores a payload's record under.

    Give it to inspect, unlock or forget with --store URL?layout=powertools. Other
    languages' Powertools hash otherwise: use the raw key from their logs.
    """
    if function is None and key_prefix is None:
        raise usage_error(ctx, "--function", "give the decorated function, or --key-prefix")
    try:
        data = json.loads(_payload_text(payload))
    except ValueError as exc:
        raise ConfigError(f"--payload is not JSON: {exc}") from None
    found = powertools_key(
        data,
        function,
        lambda_function_name=lambda_function,
        key_prefix=key_prefix,
        event_key_jmespath=event_key_jmespath,
        hash_function=hash_function,
    )
    if settings(ctx).json:
        emit_json({"key": found})
    else:
        typer.echo(found)


def _payload_text(payload: str) -> str:
    if payload == "-":
        return sys.stdin.read()
    if payload.startswith("@"):
        try:
            return Path(payload[1:]).read_text()
        except OSError as exc:
            raise ConfigError(f"--payload {payload}: {exc.strerror}") from None
    return payload
