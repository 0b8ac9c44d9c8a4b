"""``idemctl consume``: run a handler against Kafka topics, effectively once per key."""

from idemctl.consume.event import Event, Handler, adapt, load_handler
from idemctl.consume.loop import Consumer
from idemctl.consume.options import ConsumeOptions, Summary
from idemctl.errors import ConsumeAborted

__all__ = [
    "ConsumeAborted",
    "ConsumeOptions",
    "Consumer",
    "Event",
    "Handler",
    "Summary",
    "adapt",
    "load_handler",
]
