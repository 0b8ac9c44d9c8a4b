"""The live view of a long-running command (consume, verify, outbox relay): a table on a
terminal, else a progress log line every few seconds."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from rich.table import Table
from rich.text import Text

from idemctl.cli.logs import CLI_LOGGER, log_line, print_line
from idemctl.durations import format_duration


class LiveStatus:
    """Progress of a long-running command: a live table on a terminal; otherwise a log line
    on stderr every ``every`` seconds, for log collectors, in ``log_format`` (``logfmt``,
    ``json`` or ``text``: ``log_line``). ``header`` names what it works on (topic, group,
    store); ``fields`` gives what to show from the summary it is updated with (counts, a
    state), ``done`` what the rate counts. The rate is over the last ``window`` seconds, not
    the run's average."""

    def __init__(
        self,
        err: Any,
        name: str,
        fields: Callable[[Any], dict[str, Any]],
        done: Callable[[Any], int],
        *,
        live: bool,
        every: float = 10.0,
        header: dict[str, str] | None = None,
        window: float = 10.0,
        log_format: str = "logfmt",
        rows: Callable[[], Any] | None = None,
    ) -> None:
        self.err, self.name, self.fields, self.done = err, name, fields, done
        self.rows = rows
        """A renderable shown under the live table (``consume --processes``: a row per
        worker)."""
        self.live, self.every, self.header, self.window = live, every, header or {}, window
        self.log_format = log_format
        self.started = self.last = time.monotonic()
        self._seen: deque[tuple[float, int]] = deque([(self.started, 0)])
        self._live: Any = None

    def __enter__(self) -> LiveStatus:
        if self.live:
            from rich.live import Live

            self._live = Live(console=self.err, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def rate(self, now: float, done: int) -> float:
        """Per second over the last ``window`` seconds."""
        self._seen.append((now, done))
        while len(self._seen) > 2 and self._seen[0][0] < now - self.window:
            self._seen.popleft()
        then, before = self._seen[0]
        return (done - before) / max(now - then, 1e-9)

    def update(self, summary: Any) -> None:
        now = time.monotonic()
        done = self.done(summary)
        rate = self.rate(now, done)
        fields = {k: v for k, v in self.fields(summary).items() if v is not None}
        elapsed = format_duration(now - self.started)
        if self._live is not None:
            table = Table.grid(padding=(0, 2))
            for name, value in self.header.items():
                table.add_row(Text(name, style="dim"), Text(value))
            for name, value in fields.items():
                table.add_row(name.replace("_", " "), Text(str(value)))
            table.add_row("elapsed", elapsed)
            table.add_row(f"rate ({self.window:.0f}s)", f"{rate:,.0f}/s")
            if self.rows is not None:
                from rich.console import Group

                self._live.update(Group(table, "", self.rows()))
            else:
                self._live.update(table)
        elif now - self.last >= self.every:
            self.last = now
            # JSON keeps numbers numbers: the rate a second, the elapsed time in seconds.
            timing = (
                {"done": done, "rate": round(rate, 1), "elapsed": round(now - self.started, 1)}
                if self.log_format == "json"
                else {"done": done, "rate": f"{rate:.0f}/s", "elapsed": elapsed}
            )
            print_line(
                self.err,
                log_line(
                    self.log_format,
                    "info",
                    f"{self.name} progress",
                    {**self.header, **timing, **fields},
                    logger=CLI_LOGGER,
                ),
            )


def consume_status(
    current: Any, header: dict[str, str], *, every: float = 10.0, rows: Any = None
) -> LiveStatus:
    """``consume``'s live view for the ``Settings`` given: one process's, a worker's (a
    progress line every second, for its supervisor), or a supervisor's with a row per
    worker (``rows``)."""
    from idemctl.operate.documents.consume import fields as consume_fields

    return LiveStatus(
        current.err,
        "consume",
        consume_fields,
        lambda summary: summary.finished,
        live=current.live,
        header=header,
        log_format=current.progress_format,
        every=every,
        rows=rows,
    )
