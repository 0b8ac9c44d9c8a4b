"""How idemctl's commands read in ``--help`` and in a usage error, the same on every typer
version allowed.

The help is click's own text layout (typer's rich panels cost more to import and draw than
the rest of the CLI's start: about 0.1 s of every ``--help``), in sections by the options'
panels (the command's own, then ``Global options``), commands listed with their whole
summary, and on a terminal headings in bold and options in cyan.

typer 0.28 and later print a type tag beside every option that has no metavar: ``<str>``,
``<int>``, and ``<bool>`` beside flags (typer's own ``--help`` included), which take no
value at all. idemctl names what every value option takes (``--store URL``, ``--lease
DUR``); the classes here give flags and counters an empty metavar, so nothing stands beside
them, whichever typer renders the help.

A bad value (out of its range, not a number, a check of idemctl's own) is one line,
``error: --OPTION: what is wrong``, exit 2, as every other bad setting: click's usage box
is kept for the errors it helps with (an unknown option, a missing one).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperCommand, TyperGroup

if TYPE_CHECKING:
    from rich.console import Console

USAGE = 2
"""``ExitCode.USAGE`` (the table lives in ``exitcodes``, which this module does not need)."""


def report_error(message: str, err: Console | None = None) -> None:
    """One line on stderr: ``error: message`` (stores named by their redacted URLs)."""
    if err is None:
        from rich.console import Console

        err = Console(stderr=True, highlight=False)
    from rich.markup import escape

    err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)


def bad_value(exc: typer.BadParameter) -> str:
    """A bad value's one line: ``--option: message``."""
    hint = exc.param_hint
    if hint is None and exc.param is not None:
        hint = exc.param.opts or [str(exc.param.name).upper()]
    if not isinstance(hint, str) and hint is not None:
        hint = " / ".join(hint)
    message = exc.message.rstrip(".")
    return message if hint is None else f"{hint}: {message}"


@contextmanager
def one_line_errors() -> Iterator[None]:
    try:
        yield
    except typer.BadParameter as exc:  # click's own, or the one typer 0.29+ bundles
        report_error(bad_value(exc))
        raise typer.Exit(USAGE) from None


HEADING = re.compile(r"^(Usage:|[A-Z][A-Za-z ]*:$)", re.M)
OPTION = re.compile(r"^(  (?:-\w, )?--?[\w-]+(?: [A-Z][\w:.,\[\]|-]*)?)", re.M)


def styled(text: str) -> str:
    """``text`` with ANSI styles: click's echo drops them where the output is no terminal."""
    text = HEADING.sub(lambda m: f"\x1b[1m{m.group(1)}\x1b[0m", text)
    return OPTION.sub(lambda m: f"\x1b[36m{m.group(1)}\x1b[0m", text)


def option_sections(command: Any, ctx: Any, formatter: Any) -> None:
    """The options in one section per panel: the command's own first."""
    panels: dict[str, list[tuple[str, str]]] = {}
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is not None:
            panel = getattr(param, "rich_help_panel", None) or "Options"
            panels.setdefault(panel, []).append(record)
    for panel, records in sorted(panels.items(), key=lambda item: item[0] != "Options"):
        with formatter.section(panel):
            formatter.write_dl(records)


def _quiet(params: list[Any]) -> list[Any]:
    for param in params:
        if getattr(param, "is_flag", False) or getattr(param, "count", False):
            param.metavar = ""
    return params


class _Quiet:
    """What idemctl's commands and groups share: flags and counters show no metavar, a bad
    value is one line, the help is click's layout in sections, styled."""

    def get_params(self, ctx: Any) -> Any:
        return _quiet(super().get_params(ctx))  # type: ignore[misc]

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        with one_line_errors():
            return super().make_context(*args, **kwargs)  # type: ignore[misc]

    def format_options(self, ctx: Any, formatter: Any) -> None:
        option_sections(self, ctx, formatter)

    def get_help(self, ctx: Any) -> str:
        return styled(super().get_help(ctx))  # type: ignore[misc]


class QuietCommand(_Quiet, TyperCommand):
    """A command: its bad values are one line at parsing and in its callback too."""

    def invoke(self, ctx: Any) -> Any:
        with one_line_errors():
            return super().invoke(ctx)


class QuietGroup(_Quiet, TyperGroup):
    """A command group (the root, ``outbox``): its commands listed after its options."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        super().format_options(ctx, formatter)
        self.format_commands(ctx, formatter)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """Each command with its whole summary (click cuts it to one line)."""
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, " ".join((command.help or "").split("\n\n")[0].split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
