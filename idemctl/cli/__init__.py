"""The ``idemctl`` command: a thin typer layer over the library's calls.

One module per command group (provision, look, repair, consume, outbox, ...), each imported
only when one of its commands runs (``lazy``); what they share is in ``common``.
"""

from __future__ import annotations

import logging
import sys

import typer

from idemctl import __version__
from idemctl.cli.common import (
    app,
    command,
    emit_json,
    report_error,
    settings,
)
from idemctl.cli.exitcodes import exit_code_for
from idemctl.errors import IdemctlError

__all__ = ["app", "main"]


@command()
def version(ctx: typer.Context) -> None:
    """Print idemctl's version."""
    if settings(ctx).json:
        emit_json({"version": __version__})
    else:
        typer.echo(__version__)


def main() -> None:
    """Entry point. Usage errors exit 2 (typer's own); idemctl's errors print one line and
    exit with their code from ``idemctl.cli.exitcodes`` (commands do that themselves; this
    catches any raised outside them)."""

    # Drivers log their own reconnect attempts; the CLI reports the outcome itself (-v shows them).
    logging.getLogger().addHandler(logging.NullHandler())
    try:
        # The name completion scripts and usage lines use, also under `python -m idemctl`.
        app(prog_name="idemctl")
    except IdemctlError as exc:
        from rich.console import Console

        report_error(exc, Console(stderr=True, highlight=False))
        sys.exit(exit_code_for(exc))
