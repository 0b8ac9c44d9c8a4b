"""What ``verify --http`` found: a verdict for each point, and the report of them all
(its ``to_json`` is ``schemas/verify-http.schema.json``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
VERDICTS = (PASS, WARN, FAIL, SKIP)
"""A point's verdict: only ``fail`` fails the check (exit 1)."""
SEVERITY = {FAIL: 3, WARN: 2, PASS: 1, SKIP: 0}

TITLES = {
    "missing-key": "missing key",
    "replay": "replay",
    "other-payload": "another payload",
    "concurrent": "concurrent duplicates",
    "server-error": "a 5xx",
    "two-callers": "two callers",
    "invalid-key": "malformed key",
}
"""Every point, in the order they run, and its name in a table."""


@dataclass(frozen=True)
class Point:
    """One case's verdict, why, and the statuses it saw (None: no answer), in order."""

    id: str
    verdict: str
    reason: str
    statuses: tuple[int | None, ...] = ()

    @property
    def title(self) -> str:
        return TITLES[self.id]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "verdict": self.verdict,
            "reason": self.reason,
            "statuses": list(self.statuses),
        }


@dataclass(frozen=True)
class HttpReport:
    url: str
    """Redacted."""
    method: str
    key_header: str
    key_form: str
    """``string`` (the draft's ``"..."``) or ``bare``."""
    headers: tuple[tuple[str, str], ...]
    """The caller's headers, masked."""
    second_caller: tuple[tuple[str, str], ...]
    points: tuple[Point, ...]
    marks_replays: bool | None
    """Whether the API marks a replay with ``Idempotent-Replayed`` (None: no replay seen)."""
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def failed(self) -> list[Point]:
        return [point for point in self.points if point.verdict == FAIL]

    def count(self, verdict: str) -> int:
        return sum(point.verdict == verdict for point in self.points)

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "method": self.method,
            "key_header": self.key_header,
            "key_form": self.key_form,
            "headers": [{"name": n, "value": v} for n, v in self.headers],
            "second_caller": [{"name": n, "value": v} for n, v in self.second_caller],
            "points": [point.to_json() for point in self.points],
            "marks_replays": self.marks_replays,
            "passed": self.count(PASS),
            "warned": self.count(WARN),
            "failed": self.count(FAIL),
            "skipped": self.count(SKIP),
            "seconds": round(self.seconds, 3),
            "ok": self.ok,
        }
