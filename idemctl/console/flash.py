"""The message an action leaves for the page its operator lands on: what was done, on what,
and what came of it, with a link back to what it acted on.

Kept in the console process for ``KEEP`` seconds under a random id, which the redirect
after the action names (``/log?flash=ID``): the page shows only what the console itself
said, so a link someone else made cannot put words on it. At most ``SIZE`` are kept.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

KEEP = 600.0
SIZE = 1000
LANDING = "/log"
"""Where an action's operator lands (the log, its new line on top), the message above."""


class Flashes:
    def __init__(
        self, keep: float = KEEP, size: int = SIZE, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.keep, self.size, self.clock = keep, size, clock
        self._lock = threading.Lock()
        self._kept: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()

    def put(self, message: dict[str, Any]) -> str:
        """Keep ``message``; its id."""
        found = secrets.token_urlsafe(12)
        with self._lock:
            self._kept[found] = (self.clock(), message)
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
        return found

    def get(self, found: str | None) -> dict[str, Any] | None:
        """The message kept under ``found``, while it is kept."""
        if not found:
            return None
        with self._lock:
            now = self.clock()
            while self._kept:  # the oldest first: drop those past their time
                oldest, (at, _) = next(iter(self._kept.items()))
                if now - at < self.keep:
                    break
                del self._kept[oldest]
            kept = self._kept.get(found)
        return None if kept is None else kept[1]


FLASHES = Flashes()
"""The console process's own."""


def after(act: Any, params: Mapping[str, str], result: str, user: str = "") -> str:
    """Where an operator lands after ``act`` (an ``actions.Repair``) on ``params`` came to
    ``result`` (the operator log's words): the log, with the message."""
    message = {
        "action": act.name,
        "title": getattr(act, "title", act.name),
        "subject": act.subject(params),
        "result": result,
        "user": user,
        "ok": not result.startswith(("refused", "error", "failed")),
        "link": link_of(act, params),
    }
    return f"{LANDING}?flash={FLASHES.put(message)}"


def link_of(act: Any, params: Mapping[str, str]) -> str | None:
    """The page of what ``act`` acted on: the key's, the entity's, the outbox, the keys."""
    if params.get("entity"):
        return "/entities/" + quote(params["entity"], safe="")
    if act.name == "replay":
        return "/outbox"
    if act.name.startswith("bulk-"):
        return "/keys"
    if getattr(act, "needs", None) == "key" and params.get("key"):
        return "/keys/" + quote(params["key"], safe="")
    if act.name == "unlock-stale":
        return "/keys?stale=1"
    return "/keys"
