"""Provisioning the store: init."""

from __future__ import annotations

from typing import Annotated

import typer

from idemctl import operate
from idemctl.cli.common import (
    cli_open,
    command,
    emit_json,
    settings,
    store_fields,
    store_opener,
)
from idemctl.operate.documents import init as init_document


@command()
def init(
    ctx: typer.Context,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Print what would run (DDL, table spec, scripts) and change nothing"
        ),
    ] = False,
) -> None:
    """Provision the store; safe to run twice.

    PostgreSQL and SQLite: schema, tables, indexes and types. DynamoDB: the table and its
    TTL. Redis: the Lua scripts. --dry-run prints what would run and changes nothing.
    """
    current = settings(ctx)
    with cli_open(ctx, store_opener()) as store:
        plan = operate.init(store, dry_run=dry_run)
        url = store.url
    if current.json:
        emit_json(init_document.document(store_fields(ctx, url), plan, dry_run))
        return
    out, err = current.out, current.err
    if dry_run:
        for statement in plan.statements:
            out.print(statement.rstrip(";") + ";", markup=False, highlight=False, soft_wrap=True)
        err.print(
            f"-- dry run: {len(plan.statements)} statement(s) would run on {url}"
            if plan.statements
            else f"-- dry run: nothing to do on {url}",
            markup=False,
        )
    elif plan.changed:
        err.print(f"provisioned {url}: {len(plan.statements)} statement(s) applied", markup=False)
    else:
        err.print(f"{url} is up to date; nothing changed ({'; '.join(plan.notes)})", markup=False)
