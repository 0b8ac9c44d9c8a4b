"""The ``idemctl`` command: a thin typer layer over the library's calls."""

from __future__ import annotations

import sys

import typer

from idemctl.cli.exitcodes import exit_code_for, exit_code_table
from idemctl.errors import IdemctlError

app = typer.Typer(
    name="idemctl",
    help="Effectively-once processing for Kafka consumers, and the tools to operate its stores.",
    epilog="Exit codes:\n\n" + exit_code_table().replace("\n", "\n\n"),
    no_args_is_help=True,
    rich_markup_mode="rich",
    # Locals in a traceback could hold a store URL with its password.
    pretty_exceptions_show_locals=False,
)


@app.callback()
def _root() -> None:
    """Effectively-once processing for Kafka consumers, and the tools to operate its stores."""


@app.command()
def version() -> None:
    """Print idemctl's version."""
    from idemctl import __version__

    typer.echo(__version__)


def main() -> None:
    """Entry point: usage errors exit 2 (click's own); idemctl's errors print one line and
    exit with their code from ``idemctl.cli.exitcodes``."""
    try:
        app()
    except IdemctlError as exc:
        from rich.console import Console
        from rich.markup import escape

        Console(stderr=True, highlight=False).print(f"[bold red]error:[/] {escape(str(exc))}")
        sys.exit(exit_code_for(exc))
