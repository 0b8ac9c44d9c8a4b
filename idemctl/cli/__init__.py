"""The ``idemctl`` command: a thin typer layer over the library's calls."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Annotated

import typer

from idemctl.cli.exitcodes import exit_code_for, exit_code_table
from idemctl.errors import IdemctlError
from idemctl.stores import DEFAULT_URL, open_store
from idemctl.stores.base import Store

app = typer.Typer(
    name="idemctl",
    help="Effectively-once processing for Kafka consumers, and the tools to operate its stores.",
    epilog="Exit codes:\n\n" + exit_code_table().replace("\n", "\n\n"),
    no_args_is_help=True,
    rich_markup_mode="rich",
    # Locals in a traceback could hold a store URL with its password.
    pretty_exceptions_show_locals=False,
)


@dataclass
class Settings:
    store_url: str


@app.callback()
def _root(
    ctx: typer.Context,
    store: Annotated[
        str,
        typer.Option(
            "--store",
            envvar="IDEMCTL_STORE",
            show_default=True,
            help="Store URL: sqlite:///path, memory://, redis://, redis+cluster://, postgresql://",
        ),
    ] = DEFAULT_URL,
) -> None:
    """Effectively-once processing for Kafka consumers, and the tools to operate its stores."""
    ctx.obj = Settings(store)


def open_cli_store(ctx: typer.Context) -> Store:
    """The store named by --store. The CLI never creates a SQLite database as a side effect
    of looking at it: only `init` provisions."""
    store = open_store(ctx.ensure_object(Settings).store_url)
    if hasattr(store, "auto_provision"):
        store.auto_provision = False
    return store


@app.command()
def init(
    ctx: typer.Context,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Print what would run (DDL, scripts) and change nothing."),
    ] = False,
) -> None:
    """Provision the store: tables, indexes and types, or Lua scripts. Safe to run twice."""
    from rich.console import Console

    with open_cli_store(ctx) as store:
        plan = store.provision(dry_run=dry_run)
    out, err = Console(highlight=False), Console(stderr=True, highlight=False)
    if dry_run:
        for statement in plan.statements:
            out.print(statement.rstrip(";") + ";", markup=False)
        err.print(
            f"-- dry run: {len(plan.statements)} statement(s) would run on {store.url}"
            if plan.statements else f"-- dry run: nothing to do on {store.url}",
            markup=False,
        )  # fmt: skip
        return
    if plan.changed:
        err.print(
            f"provisioned {store.url}: {len(plan.statements)} statement(s) applied", markup=False
        )
    else:
        err.print(
            f"{store.url} is up to date; nothing changed ({'; '.join(plan.notes)})", markup=False
        )


@app.command()
def version() -> None:
    """Print idemctl's version."""
    from idemctl import __version__

    typer.echo(__version__)


def main() -> None:
    """Entry point: usage errors exit 2 (click's own); idemctl's errors print one line and
    exit with their code from ``idemctl.cli.exitcodes``."""
    import logging

    # Drivers log their own reconnect attempts; the CLI reports the outcome itself.
    logging.getLogger().addHandler(logging.NullHandler())
    try:
        app()
    except IdemctlError as exc:
        from rich.console import Console
        from rich.markup import escape

        Console(stderr=True, highlight=False).print(f"[bold red]error:[/] {escape(str(exc))}")
        sys.exit(exit_code_for(exc))
