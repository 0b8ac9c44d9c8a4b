"""The operator log: who did what, when, and what came of it, one JSON object a line in a
file of the console's own. The console appends each action (and each result revealed) and
shows the newest first."""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Entry:
    at: str
    user: str
    action: str
    target: str
    result: str

    def to_json(self) -> dict[str, str]:
        return asdict(self)


class OperatorLog:
    """An append-only JSON-lines file; ``recent`` reads its last entries."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def write(self, user: str, action: str, target: str, result: str) -> Entry:
        entry = Entry(datetime.now(UTC).isoformat(timespec="seconds"), user, action, target, result)
        line = json.dumps(entry.to_json(), ensure_ascii=False)
        with self._lock, self.path.open("a", encoding="utf-8") as out:
            out.write(line + "\n")
        return entry

    def recent(self, n: int = 200) -> list[Entry]:
        """The last ``n`` entries, newest first."""
        if not self.path.exists():
            return []
        with self._lock, self.path.open(encoding="utf-8") as lines:
            last: deque[str] = deque(lines, maxlen=n)
        entries = []
        for line in reversed(last):
            try:
                data: dict[str, Any] = json.loads(line)
                entries.append(Entry(**data))
            except (ValueError, TypeError):
                continue  # a line cut short by a crash
        return entries
