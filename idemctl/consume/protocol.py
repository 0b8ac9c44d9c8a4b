"""The line protocol between ``consume --processes``' supervisor and its workers, version 1
(``schemas/worker-line.schema.json``). A worker (``consume --worker-index I``) writes one
JSON object a line on its stdout, each with ``"idemctl_worker": 1`` and a ``type``:

- ``progress``, about once a second: ``fields`` (what the live view shows: state,
  partitions, lag, paused and stalled partitions) and ``counts`` (every outcome so far);
- ``error``, once, when the worker stops on an error: ``message``, one line;
- ``summary``, once, when it ends of its own accord: ``counts`` and ``dead_letters``.

Its stderr carries its log lines, for people; the supervisor relays them and reads nothing
from them. A line of another version, or none of this protocol's, is not read."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

VERSION = 1
MARK = "idemctl_worker"
TYPES = ("progress", "error", "summary")


@dataclass(frozen=True)
class Line:
    """One protocol line, as read."""

    type: str
    fields: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    dead_letters: dict[str, int] = field(default_factory=dict)
    message: str | None = None


def encode(line: Line) -> str:
    document: dict[str, Any] = {MARK: VERSION, "type": line.type}
    if line.type == "progress":
        document |= {"fields": line.fields, "counts": line.counts}
    elif line.type == "summary":
        document |= {"counts": line.counts, "dead_letters": line.dead_letters}
    else:
        document["message"] = line.message
    return json.dumps(document, separators=(",", ":"), default=str)


def decode(text: str) -> Line | None:
    """The line ``text`` holds; None where it is none of this version's."""
    try:
        document = json.loads(text)
    except ValueError:
        return None
    if not isinstance(document, dict) or document.get(MARK) != VERSION:
        return None
    kind = document.get("type")
    if kind not in TYPES:
        return None
    return Line(
        kind,
        fields=_mapping(document.get("fields")),
        counts={k: int(v) for k, v in _mapping(document.get("counts")).items()},
        dead_letters={k: int(v) for k, v in _mapping(document.get("dead_letters")).items()},
        message=None if document.get("message") is None else str(document["message"]),
    )


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


class Writer:
    """A worker's side: writes its lines on ``out`` (stdout), progress at most every
    ``every`` seconds."""

    def __init__(
        self,
        out: IO[str],
        fields: Callable[[Any], dict[str, Any]],
        every: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.out, self.fields, self.every, self.clock = out, fields, every, clock
        self._last: float | None = None

    def progress(self, summary: Any) -> None:
        """The run's ``Summary`` now, if ``every`` seconds passed since the last."""
        now = self.clock()
        if self._last is not None and now - self._last < self.every:
            return
        self._last = now
        self._write(Line("progress", fields=self.fields(summary), counts=dict(summary.counts)))

    def summary(self, summary: Any) -> None:
        counts, dead = dict(summary.counts), dict(summary.dead_letters)
        self._write(Line("summary", counts=counts, dead_letters=dead))

    def error(self, message: str) -> None:
        self._write(Line("error", message=" ".join(message.split())))

    def _write(self, line: Line) -> None:
        self.out.write(encode(line) + "\n")
        self.out.flush()
