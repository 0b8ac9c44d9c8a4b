"""The CLI's log lines on stderr: every library's with -v, a long-running command's own
warnings without it, each through the command's console in its ``--log-format``
(``log_line``: logfmt, JSON or text), with the store URL's secrets hidden."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from idemctl.errors import ConfigError
from idemctl.urls import redact_text, secrets_in

if TYPE_CHECKING:
    from rich.console import Console

    from idemctl.cli.common import Settings


CLI_LOGGER = "idemctl.cli"
"""The ``logger`` of the lines the CLI writes itself (progress, steps, the store it uses)."""
CORE_FIELDS = ("ts", "level", "logger", "msg")


def log_line(
    log_format: str,
    level: str,
    msg: str,
    fields: Mapping[str, Any] | None = None,
    *,
    logger: str | None = None,
    at: float | None = None,
) -> str:
    """One log line, as ``log_format`` says: ``json`` (one object: ``ts``, ``level``,
    ``logger``, ``msg``, then ``fields``), ``logfmt`` (the same as ``key=value`` pairs) or
    ``text`` (``level msg``, then ``key=value`` pairs). ``ts`` is ``at`` (a ``time.time()``),
    else now, in UTC to the millisecond; None fields are left out, and no field takes the
    place of the four the line starts with."""
    extra = {k: v for k, v in (fields or {}).items() if v is not None and k not in CORE_FIELDS}
    if log_format == "text":
        pairs = " ".join(f"{k.replace(' ', '_')}={_logfmt_value(v)}" for k, v in extra.items())
        return f"{level} {msg}" + (f": {pairs}" if pairs else "")
    moment = datetime.now(UTC) if at is None else datetime.fromtimestamp(at, UTC)
    ts = moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if log_format == "json":
        head = {"ts": ts, "level": level, **({"logger": logger} if logger else {}), "msg": msg}
        return json.dumps({**head, **extra}, ensure_ascii=False, default=str)
    return _logfmt_line(ts, level, msg, {**({"logger": logger} if logger else {}), **extra})


def print_line(console: Any, line: str) -> None:
    """A finished log line on ``console`` as it is: no markup, highlighting, emoji codes or
    wrapping (above a live view when there is one)."""
    console.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True)


def _logfmt_line(ts: str, level: str, msg: str, fields: Mapping[str, Any]) -> str:
    """One logfmt line: ``ts=... level=... msg="..." key=value ...``, quoted where needed."""
    pairs = {"ts": ts, "level": level, "msg": msg, **fields}
    return " ".join(f"{k.replace(' ', '_')}={_logfmt_value(v)}" for k, v in pairs.items())


def _logfmt_value(value: Any) -> str:
    text = str(value)
    if text and not any(c in text for c in ' ="\\') and text.isprintable():
        return text
    return json.dumps(text, ensure_ascii=False)


def show_warnings(current: Settings, logger: str) -> None:
    """A long-running command's own warnings (``logger``: dead letters, an unreachable store,
    failed deliveries) go to stderr even without -v; the Kafka client's (``logger.kafka``)
    only with -v."""
    if current.verbose:
        return  # -v logs everything already
    own = logging.getLogger(logger)
    for old in [h for h in own.handlers if getattr(h, "idemctl_warnings", False)]:
        own.removeHandler(old)  # one per logger, on this run's stderr
    handler = ConsoleHandler(current.err, secrets_of(current), lambda: current.records_format)
    handler.idemctl_warnings = True  # type: ignore[attr-defined]
    handler.setLevel(logging.WARNING)
    own.addHandler(handler)
    own.setLevel(logging.WARNING)
    kafka_log = logging.getLogger(f"{logger}.kafka")
    kafka_log.propagate = False
    kafka_log.addHandler(logging.NullHandler())


class ConsoleHandler(logging.Handler):
    """Log lines through the command's rich console, so they land above a live view
    instead of through it, in the form ``log_format()`` names: ``text`` (a styled line on a
    terminal), ``logfmt`` (``ts= level= msg= logger=`` and the record's fields) or ``json``
    (an object a line, the same keys); ``auto``: text on a terminal, logfmt elsewhere.

    A record's fields are what the library passed as ``extra={"idemctl": {...}}`` (key,
    topic, partition, offset, outcome, reason...). ``secrets`` are hidden (``***``) in the
    message and in every field, whatever the form."""

    def __init__(
        self,
        console: Console,
        secrets: list[str] | None = None,
        log_format: Callable[[], str] = lambda: "auto",
    ) -> None:
        super().__init__()
        self.console, self.secrets, self.log_format = console, secrets or [], log_format

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = redact_text(record.getMessage(), self.secrets)
            level = record.levelname.lower()
            form = self.log_format()
            if form == "auto":
                form = "text" if self.console.is_terminal else "logfmt"
            if form == "text":
                style = {"warning": "yellow", "error": "bold red"}.get(level, "dim")
                source = f"[dim]{record.name}:[/] " if level in ("debug", "info") else ""
                self.console.print(
                    f"[{style}]{level}[/] {source}{escape(message)}",
                    soft_wrap=True,
                    highlight=False,
                )
                return
            fields = {k: self._redact(v) for k, v in record_fields(record).items()}
            line = log_line(form, level, message, fields, logger=record.name, at=record.created)
            print_line(self.console, line)
        except Exception:
            self.handleError(record)

    def _redact(self, value: Any) -> Any:
        return redact_text(value, self.secrets) if isinstance(value, str) else value


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a library log call passed as ``extra={"idemctl": {...}}``."""
    found = getattr(record, "idemctl", None)
    return dict(found) if isinstance(found, dict) else {}


def configure_logging(current: Settings) -> None:
    """With -v, every library's log lines on stderr (-vv: debug too), as ``current`` says."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "idemctl", False)]:
        root.removeHandler(handler)
    if not current.verbose:
        return
    handler = ConsoleHandler(current.err, secrets_of(current), lambda: current.records_format)
    handler.idemctl = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(logging.INFO if current.verbose == 1 else logging.DEBUG)


def secrets_of(current: Settings) -> list[str]:
    """What log lines must hide: the store URL's password and secret options."""
    try:
        return secrets_in(current.store_url()[0])
    except ConfigError:
        return []  # the command reports it
