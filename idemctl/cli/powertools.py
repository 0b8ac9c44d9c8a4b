"""The operator's commands on a Powertools table (``--store URL?layout=powertools``): what
inspect, list, stats, doctor, unlock, forget and purge do there, with Powertools' states
(``idemctl.powertools``); and ``idemctl powertools key``, the key of a payload."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from idemctl.cli import render
from idemctl.cli.common import (
    app,
    cli_store,
    command,
    emit_json,
    note,
    settings,
    store_fields,
    usage_error,
)
from idemctl.cli.help import QuietGroup
from idemctl.errors import ConfigError, KeyNotFound
from idemctl.powertools import PowertoolsRecord, State, is_powertools, open_table, powertools_key
from idemctl.powertools.model import PowertoolsStats
from idemctl.powertools.table import PowertoolsTable, holds, rule_of, why_not
from idemctl.stores.base import Store

STYLE = {
    State.COMPLETED: "green",
    State.IN_PROGRESS: "yellow",
    State.STALE: "bold magenta",
    State.BLOCKED: "bold red",
    State.EXPIRED: "dim",
    State.INVALID: "red",
}
PAGE = 500


def wanted(ctx: typer.Context) -> bool:
    """Whether the command's store URL asks for Powertools' layout."""
    return is_powertools(settings(ctx).store_url()[0])


def refuse(ctx: typer.Context, **used: Any) -> None:
    """A usage error for the first of ``used`` (option -> value) that was given: options of
    idemctl's own layout that mean nothing on Powertools' records."""
    for option, value in used.items():
        if value:
            flag = "--" + option.replace("_", "-")
            raise usage_error(ctx, flag, "does not apply to a Powertools table (layout=powertools)")


@contextmanager
def opened(ctx: typer.Context) -> Iterator[PowertoolsTable]:
    """The Powertools table, as ``cli_store`` opens a store: named on stderr, closed after."""
    current = settings(ctx)
    url, source = current.store_url()
    table = open_table(url)
    current.used_source = source
    note(
        current,
        f"store: {table.url} (from {source})",
        fields={"store": table.url, "store_source": source},
    )
    with table:
        yield table


def swept(ctx: typer.Context) -> AbstractContextManager[Store | PowertoolsTable]:
    """What doctor checks and unlock --stale and purge sweep: the store, or the Powertools
    table where the URL says layout=powertools (both have those calls)."""
    return opened(ctx) if wanted(ctx) else cli_store(ctx)


def skipped(store: Store | PowertoolsTable) -> int | None:
    """The items a Powertools table's last sweep passed over as none of Powertools'; None
    for idemctl's own stores."""
    return store.skipped if isinstance(store, PowertoolsTable) else None


# Looking ---------------------------------------------------------------------------------


def inspect(ctx: typer.Context, key: str) -> None:
    current = settings(ctx)
    with opened(ctx) as table:
        record = table.get(key)
    if record is None:
        raise KeyNotFound(key)
    at = render.now()
    if current.json:
        emit_json(record.to_json(at))
    else:
        current.out.print(record_detail(record, at))


def states_of(status: str | None, stale: bool, blocked: bool) -> set[State] | None:
    """``list``'s filters as Powertools states: --status in_progress is every in-progress
    state (live, stale, blocked), as it is every in-progress key on idemctl's stores."""
    if stale or blocked:
        return {s for s, on in ((State.STALE, stale), (State.BLOCKED, blocked)) if on}
    if status == "in_progress":
        return {State.IN_PROGRESS, State.STALE, State.BLOCKED}
    if status == "completed":
        return {State.COMPLETED}
    if status == "failed":  # Powertools deletes the record of a failed call
        return set()
    return None


def stats(ctx: typer.Context) -> None:
    current = settings(ctx)
    with opened(ctx) as table:
        counts = table.stats()
        url = table.url
    if current.json:
        emit_json(stats_json(store_fields(ctx, url), counts))
    else:
        current.out.print(stats_table(counts))


# Repairing -------------------------------------------------------------------------------


def delete_one(ctx: typer.Context, action: str, key: str, force: bool, dry_run: bool) -> None:
    """``unlock KEY`` or ``forget KEY``: one conditional delete (with ``dry_run``, its
    condition judged on the record as it is now)."""
    with opened(ctx) as table:
        if dry_run:
            record = _existing(table, key)
            at = render.now()
            if not holds(rule_of(action, force), record, at, at):
                raise why_not(key, record, at, action, force)
        elif action == "unlock":
            record = table.unlock(key, force=force)
        else:
            record = table.forget(key, force=force)
        url = table.url
    _done(ctx, action, url, record, dry_run)


def _existing(table: PowertoolsTable, key: str) -> PowertoolsRecord:
    record = table.get(key)
    if record is None:
        raise KeyNotFound(key)
    return record


def _done(
    ctx: typer.Context, action: str, url: str, record: PowertoolsRecord, dry_run: bool
) -> None:
    current = settings(ctx)
    at = render.now()
    if current.json:
        emit_json(
            {
                "action": action,
                **store_fields(ctx, url),
                "dry_run": dry_run,
                "count": 1,
                "keys": [record.key],
                "record": record.to_json(at),
                "entity": None,
            }
        )
        return
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
    if dry_run:
        current.err.print(f"dry run: nothing changed on {url}", markup=False)


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


def _relative(moment: datetime | None, at: datetime) -> str:
    return "-" if moment is None else render.relative(moment, at)


def stats_json(where: dict[str, str], counts: PowertoolsStats) -> dict[str, Any]:
    """``schemas/powertools-stats.schema.json``."""
    return {
        **where,
        "layout": "powertools",
        "total": counts.total,
        "by_state": {s.value: n for s, n in counts.by_state.items()},
        "skipped": counts.skipped,
        "counted_by": counts.counted_by,
    }


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
