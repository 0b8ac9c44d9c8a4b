"""``idemctl consume``: run a handler against Kafka topics, effectively once per key.

The names below load on first use, so that ``import idemctl.consume`` stays light. The
Kafka rules consume shares with FastStream and ``audit`` (keys, options, the outcome policy,
dead letters) live in ``idemctl.kafka``; ``Handling``, ``Keyed`` and ``Summary`` are
exported here too.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from idemctl.consume.event import Event, Handler, adapt, load_handler
    from idemctl.consume.loop import Consumer
    from idemctl.consume.options import ConsumeOptions
    from idemctl.errors import ConsumeAborted
    from idemctl.kafka.options import Handling, Keyed, Summary

_EXPORTS = {
    "ConsumeAborted": "idemctl.errors",
    "ConsumeOptions": "idemctl.consume.options",
    "Consumer": "idemctl.consume.loop",
    "Event": "idemctl.consume.event",
    "Handler": "idemctl.consume.event",
    "Handling": "idemctl.kafka.options",
    "Keyed": "idemctl.kafka.options",
    "Summary": "idemctl.kafka.options",
    "adapt": "idemctl.consume.event",
    "load_handler": "idemctl.consume.event",
}

__all__ = [
    "ConsumeAborted",
    "ConsumeOptions",
    "Consumer",
    "Event",
    "Handler",
    "Handling",
    "Keyed",
    "Summary",
    "adapt",
    "load_handler",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'idemctl.consume' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
