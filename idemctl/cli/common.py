"""What every command shares: the app, the global options, the store, output and prompts.

The global options (``--store``, ``--config``, ``--profile``, ``--json``, ``-v``,
``--no-color``) are declared here: the root takes them, and every command that ``command()``
registers takes them too (``GlobalOptionsCommand``), so ``idemctl --json list`` and
``idemctl list --json`` both work.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
import typer.main

from idemctl import __version__
from idemctl.cli.exitcodes import ExitCode, exit_code_for, exit_code_table
from idemctl.cli.help import QuietCommand
from idemctl.cli.help import report_error as report_line
from idemctl.cli.lazy import LazyGroup
from idemctl.cli.logs import CLI_LOGGER, configure_logging, log_line, print_line
from idemctl.durations import parse_duration
from idemctl.errors import ConfigError, IdemctlError, OptionError, Refused

if TYPE_CHECKING:
    from rich.console import Console

    from idemctl.config import Config
    from idemctl.operate import Target
    from idemctl.stores.base import Store

    Opened = TypeVar("Opened", Store, Target)

app = typer.Typer(
    name="idemctl",
    cls=LazyGroup,
    help="Effectively-once processing for Kafka consumers, and the tools to operate its stores.",
    epilog="Exit codes:\n\n\b\n" + exit_code_table(width=76),
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
    # Locals in a traceback could hold a store URL with its password.
    pretty_exceptions_show_locals=False,
)
LazyGroup.app = app

GLOBAL_PANEL = "Global options"
STORE_HELP = (
    "Store URL: sqlite:///path, memory://, redis://, rediss://, redis+cluster://, "
    "postgresql://, dynamodb://TABLE  [default: sqlite:///./idemctl.db]"
)
CONFIG_HELP = "Config file [default: ./idemctl.yaml if present]"
PROFILE_HELP = "Named profile of the config file"
JSON_HELP = "Print one JSON document (NDJSON for lists) on stdout"
VERBOSE_HELP = "Log to stderr (-vv for debug)"
NO_COLOR_HELP = "Plain text output"


@dataclass
class Settings:
    """The global options as the root and the command gave them."""

    store: str | None = None
    config: str | None = None
    profile: str | None = None
    json: bool = False
    verbose: int = 0
    no_color: bool = False
    store_source: str = "--store"
    """Who gave ``store``: the flag, or IDEMCTL_STORE."""
    profile_source: str = "--profile"
    """Who gave ``profile``: the flag, or IDEMCTL_PROFILE."""
    used_source: str | None = None
    """Where the store a command opened came from (``cli_open`` sets it)."""
    log_format: str = "auto"
    """``--log-format`` of consume, outbox relay and verify: auto, json, logfmt or text."""
    _config: Config | None = field(default=None, repr=False)
    _consoles: dict[bool, Console] = field(default_factory=dict, repr=False)

    def merge(self, **given: Any) -> None:
        """A command's own options win over the root's."""
        for name, value in given.items():
            if value:
                setattr(self, name, max(value, self.verbose) if name == "verbose" else value)
                if name == "store":
                    self.store_source = "--store"
                if name == "profile":
                    self.profile_source = "--profile"
                if name == "config":
                    self._config = None

    def loaded_config(self) -> Config:
        """The config file the options name (or ./idemctl.yaml), read and checked once."""
        if self._config is None:
            from idemctl.config import find_config, load_config

            self._config = load_config(find_config(self.config))
        return self._config

    def store_url(self) -> tuple[str, str]:
        """The store URL and where it came from. Flags beat the environment: ``--store``,
        then ``--profile``'s store, then IDEMCTL_STORE, then the store of IDEMCTL_PROFILE's
        profile or the config file's, then the default."""
        config = self.loaded_config()
        if self.store and self.store_source == "--store":
            return self.store, self.store_source
        chosen_by = f"{self.profile_source}{' ' if self.profile_source == '--profile' else '='}"
        if self.profile and self.profile_source == "--profile":
            url, source = config.store_for(self.profile, chosen_by + self.profile)
            if url is not None:
                return url, source
        if self.store:
            return self.store, self.store_source
        url, source = config.store_for(
            self.profile, None if self.profile is None else chosen_by + self.profile
        )
        if url is not None:
            return url, source
        from idemctl.stores import DEFAULT_URL

        return DEFAULT_URL, "the default"

    def console(self, stderr: bool = False) -> Console:
        if stderr not in self._consoles:
            from rich.console import Console

            console = Console(
                stderr=stderr, highlight=False, no_color=self.no_color or None, soft_wrap=True
            )
            if not console.is_terminal:
                console.width = 250  # a pipe or a file gets whole lines, not 80 columns
            self._consoles[stderr] = console
        return self._consoles[stderr]

    @property
    def out(self) -> Console:
        return self.console()

    @property
    def err(self) -> Console:
        return self.console(stderr=True)

    @property
    def live(self) -> bool:
        """A live view on stderr: on a terminal, without --json, and with text log lines."""
        return self.err.is_terminal and not self.json and self.log_format in ("auto", "text")

    @property
    def progress_format(self) -> str:
        """How progress and step lines look without a live view: logfmt unless
        ``--log-format`` says otherwise."""
        return "logfmt" if self.log_format == "auto" else self.log_format

    @property
    def records_format(self) -> str:
        """How log records look on stderr: ``--log-format``; auto is text on a terminal,
        logfmt elsewhere."""
        if self.log_format != "auto":
            return self.log_format
        return "text" if self.err.is_terminal else "logfmt"


def settings(ctx: typer.Context) -> Settings:
    return ctx.ensure_object(Settings)


def _show_version(value: bool) -> None:
    if value:
        print(f"idemctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    store: Annotated[
        str | None,
        typer.Option(
            "--store", metavar="URL", help=STORE_HELP, envvar="IDEMCTL_STORE", show_default=False
        ),
    ] = None,
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            metavar="FILE",
            help=CONFIG_HELP,
            envvar="IDEMCTL_CONFIG",
            show_default=False,
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            metavar="NAME",
            help=PROFILE_HELP,
            envvar="IDEMCTL_PROFILE",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP, show_default=False)] = False,
    verbose: Annotated[
        int, typer.Option("--verbose", "-v", help=VERBOSE_HELP, count=True, show_default=False)
    ] = 0,
    no_color: Annotated[
        bool, typer.Option("--no-color", help=NO_COLOR_HELP, show_default=False)
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_show_version,
            expose_value=False,
            help="Show the version and exit",
        ),
    ] = False,
) -> None:
    """Effectively-once processing for Kafka consumers, and the tools to operate its stores.

    The store comes from --store, else --profile's store in idemctl.yaml, else
    IDEMCTL_STORE, else 'store:' in idemctl.yaml (--config, IDEMCTL_CONFIG; IDEMCTL_PROFILE
    picks a named profile), else sqlite:///./idemctl.db: flags beat the environment. Every
    command that opens a store names it, and where it came from, on stderr.
    """

    def from_env(name: str) -> bool:
        source = ctx.get_parameter_source(name)
        return source is not None and source.name == "ENVIRONMENT"

    ctx.obj = Settings(
        store=store,
        config=config,
        profile=profile,
        json=as_json,
        verbose=verbose,
        no_color=no_color,
        store_source="IDEMCTL_STORE" if from_env("store") else "--store",
        profile_source="IDEMCTL_PROFILE" if from_env("profile") else "--profile",
    )


# The global options again, for every command: `idemctl list --json` as `idemctl --json
# list`. Every command takes them last, in a help panel of their own, without environment
# variables (the root reads those). Their values never reach the command: each is recorded
# in the Settings as it is parsed, over the root's.


def _given(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> None:
    assert param.name is not None
    settings(ctx).merge(**{_SETTING.get(param.name, param.name): value})


def _global(*decls: str, help_text: str, metavar: str | None = None, count: bool = False) -> Any:
    return typer.Option(
        *decls,
        help=help_text,
        metavar=metavar,
        count=count,
        show_default=False,
        rich_help_panel=GLOBAL_PANEL,
        callback=_given,
        expose_value=False,
    )


def _global_options(
    store_url: Annotated[
        str | None, _global("--store", metavar="URL", help_text=STORE_HELP)
    ] = None,
    config: Annotated[
        str | None, _global("--config", metavar="FILE", help_text=CONFIG_HELP)
    ] = None,
    profile: Annotated[
        str | None, _global("--profile", metavar="NAME", help_text=PROFILE_HELP)
    ] = None,
    as_json: Annotated[bool, _global("--json", help_text=JSON_HELP)] = False,
    verbose: Annotated[int, _global("--verbose", "-v", help_text=VERBOSE_HELP, count=True)] = 0,
    no_color: Annotated[bool, _global("--no-color", help_text=NO_COLOR_HELP)] = False,
) -> None:
    """Never called: typer makes the global options of every command from its parameters."""


_SETTING = {"store_url": "store", "as_json": "json"}
"""Parameter name -> Settings field, where they differ."""
_options_only = typer.Typer(add_completion=False)
_options_only.command()(_global_options)
GLOBAL_OPTIONS = tuple(typer.main.get_command(_options_only).params)
"""The global options as click parameters, made once and added to every command."""


class GlobalOptionsCommand(QuietCommand):
    """A command that takes the global options after its own (``command()`` uses it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.extend(GLOBAL_OPTIONS)


F = TypeVar("F", bound=Callable[..., Any])


def command(
    name: str | None = None, *, group: typer.Typer = app, **kwargs: Any
) -> Callable[[F], F]:
    """Register a command (on ``group``, the root by default) that takes
    ``ctx: typer.Context`` first; it takes the global options too (``settings(ctx)`` has
    their values). An idemctl error in it prints one line and exits with its code, and
    Ctrl-C exits 130."""

    def register(func: F) -> F:
        @functools.wraps(func)
        def wrapper(ctx: typer.Context, **params: Any) -> Any:
            current = settings(ctx)
            configure_logging(current)
            try:
                return func(ctx, **params)
            except (KeyboardInterrupt, typer.Abort):
                note(current, "interrupted", level="error", markup="[bold red]interrupted[/]")
                raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
            except OptionError as exc:  # shown with the command's usage, as typer's own
                raise usage_error(ctx, option_of(ctx, exc.option), exc.message) from None
            except IdemctlError as exc:
                if current.log_format in ("json", "logfmt"):
                    note(current, str(exc), level="error")
                else:
                    report_error(exc, current.err)
                raise typer.Exit(int(exit_code_for(exc))) from None

        group.command(name, cls=GlobalOptionsCommand, **kwargs)(wrapper)
        return func

    return register


def report_error(exc: IdemctlError, err: Console) -> None:
    """One line on stderr; messages name stores by their redacted URLs."""
    report_line(str(exc), err)


def note(
    current: Settings,
    text: str,
    *,
    level: str = "info",
    markup: str | None = None,
    fields: Mapping[str, Any] | None = None,
) -> None:
    """A line of the command's own on stderr (the store it uses, a summary, a signal
    heard): with ``--log-format json`` or ``logfmt`` a log line of that form, ``fields``
    beside the message, so that every line on stderr is one; otherwise the line as it
    always was: ``markup`` (rich markup) when given, else ``text`` as it is."""
    if current.log_format in ("json", "logfmt"):
        line = log_line(current.log_format, level, text, fields, logger=CLI_LOGGER)
        print_line(current.err, line)
    elif markup is not None:
        current.err.print(markup, highlight=False, soft_wrap=True)
    else:
        current.err.print(text, markup=False, highlight=False, soft_wrap=True)


# Store -------------------------------------------------------------------------------


@contextmanager
def cli_open(ctx: typer.Context, opener: Callable[[str], Opened]) -> Iterator[Opened]:
    """What ``opener`` opens at the command's store URL, named on stderr and closed after
    the command: the store itself (``store_opener()``), or the store as the operator's
    actions see it, of any layout (``target_opener()``)."""
    with _noted(ctx, opener) as opened:
        yield opened


def store_opener(*, auto_provision: bool = False) -> Callable[[str], Store]:
    """``open_store`` as the CLI uses it. The CLI never creates a SQLite database as a side
    effect of looking at it: only ``init`` provisions, and ``consume`` (with
    ``auto_provision``), which uses the store as the library does."""
    from idemctl.stores import open_store
    from idemctl.stores.base import SelfProvisioning

    def opener(url: str) -> Store:
        store = open_store(url)
        if isinstance(store, SelfProvisioning):
            store.auto_provision = auto_provision
        return store

    return opener


def target_opener() -> Callable[[str], Target]:
    """``idemctl.operate.open_target``, imported when a command opens its store."""
    from idemctl.operate import open_target

    return open_target


def _noted(ctx: typer.Context, opener: Callable[[str], Opened]) -> Opened:
    """What ``opener`` opens at the command's store URL, named on stderr."""
    current = settings(ctx)
    url, source = current.store_url()
    opened = opener(url)
    current.used_source = source
    # Always, also with --json (stdout stays one document): which store, and why that one.
    shown = f"store: {opened.url} (from {source})"
    note(current, shown, fields={"store": opened.url, "store_source": source})
    return opened


def store_fields(ctx: typer.Context, url: str) -> dict[str, str]:
    """``store`` (the redacted URL) and ``store_source`` (where it came from, as on the
    ``store:`` line) for a command's JSON document."""
    current = settings(ctx)
    source = current.used_source or current.store_url()[1]
    return {"store": url, "store_source": source}


# Output ------------------------------------------------------------------------------


def emit_json(document: Any) -> None:
    """One JSON document (or NDJSON line) on stdout, never wrapped to the terminal."""
    sys.stdout.write(json.dumps(document, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def confirm(ctx: typer.Context, question: str, yes: bool) -> None:
    """Go on if ``yes`` or the operator says so; otherwise Refused (exit 6)."""
    if yes:
        return
    from rich.prompt import Confirm

    err = settings(ctx).err
    try:
        agreed = Confirm.ask(question, console=err, default=False)
    except EOFError:
        err.print()
        agreed = False
    if not agreed:
        raise Refused("nothing changed: not confirmed (pass --yes to skip the question)")


def option_of(ctx: typer.Context, name: str) -> str:
    """The command's flag for its parameter ``name`` (``key_header`` -> ``--key-header``):
    the library's OptionError names what an option means, the CLI how it is spelled."""
    for param in ctx.command.params:
        if param.name == name and getattr(param, "opts", None):
            return str(param.opts[0])
    return "--" + name.replace("_", "-")


def usage_error(ctx: typer.Context, option: str, message: str) -> typer.BadParameter:
    """A usage error (exit 2) about ``option``, shown with the command's usage line."""
    return typer.BadParameter(message, ctx=ctx, param_hint=option)


def duration(value: str | None, option: str, *, positive: bool = False) -> float:
    """A ``--older-than``-style option's seconds, or ConfigError naming the option (exit 2,
    one line); ``positive``: 0 is refused too."""
    if value is None:
        return 0.0
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise ConfigError(f"{option}: {exc}") from None
    if positive and seconds == 0:
        raise ConfigError(f"{option} {value}: must be more than 0")
    return seconds


def moment(text: str, option: str) -> datetime:
    """A ``--since``-style option's time: ISO 8601 (UTC without a zone), or a duration
    meaning that long ago; else a usage error naming the option (exit 2)."""
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        try:
            return datetime.now(UTC) - timedelta(seconds=parse_duration(text))
        except ValueError:
            raise typer.BadParameter(
                f"{text!r} is neither a time (2026-11-22T10:00:00Z) nor a duration ago (2h)",
                param_hint=option,
            ) from None
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at


def one_of(ctx: typer.Context, key: str | None, entity: str | None) -> None:
    """A KEY or --entity ENTITY, exactly one: else a usage error."""
    if key is None and entity is None:
        raise usage_error(ctx, "KEY", "give a KEY, or --entity ENTITY")
    if key is not None and entity is not None:
        raise usage_error(ctx, "--entity", "give a KEY or --entity ENTITY, not both")
