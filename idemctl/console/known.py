"""The consumer groups and topics the brokers list, offered by the audit page's form.

Asked of the brokers (``operate.brokers.known``) at most once every ``ttl`` seconds, by one
request at a time and for at most ``timeout`` seconds: brokers that do not answer cost one
worker thread that long per ``ttl``, never one per viewer; a request that finds another
one asking shows what was known before (or nothing) and does not wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from idemctl.errors import IdemctlError


@dataclass(frozen=True)
class Listed:
    groups: list[str] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    error: str | None = None
    """Why the brokers gave no list (the page says so; the form still works)."""

    def to_json(self) -> dict[str, Any]:
        return {"groups": self.groups, "topics": self.topics, "error": self.error}


class KnownNames:
    def __init__(
        self,
        ttl: float = 30.0,
        timeout: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl, self.timeout, self.clock = ttl, timeout, clock
        self._asking = threading.Lock()
        self._last: dict[str, tuple[float, Listed]] = {}

    def get(self, brokers: str | None, kafka_config: Mapping[str, str]) -> Listed:
        """What the brokers at ``brokers`` list; nothing when none are configured."""
        if not brokers:
            return Listed(error="no Kafka brokers are configured (--brokers): an audit needs them")
        found = self._last.get(brokers)
        if found is not None and self.clock() - found[0] < self.ttl:
            return found[1]
        if not self._asking.acquire(blocking=False):
            return found[1] if found else Listed()
        try:
            from idemctl.operate.brokers import known

            try:
                names = known(brokers, kafka_config, self.timeout)
                listed = Listed(names.groups, names.topics)
            except IdemctlError as exc:
                listed = Listed(error=str(exc))
            except ImportError:
                listed = Listed(error="no confluent-kafka: pip install 'idemctl[kafka]'")
            self._last = {brokers: (self.clock(), listed)}
            return listed
        finally:
            self._asking.release()


KNOWN = KnownNames()
"""The console process's own."""
