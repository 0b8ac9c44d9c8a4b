"""A message on its way through the consume loop, and what the loop's parts say of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from idemctl.kafka.acts import DeadLetter, about
from idemctl.model import Order

Pause = tuple[float, str]
"""Pause a partition at a message: seconds to wait, and why (the summary's count)."""
LETTER: Pause = (0.0, "dead_letter")
"""A partition stops at a message to dead-letter (``Item.letter``) until the loop wrote it
(``consume.mailroom``): not a pause, and not counted."""


@dataclass(slots=True)
class Item:
    msg: Any  # confluent_kafka.Message
    tp: tuple[str, int]
    offset: int
    key: str | None = None
    fingerprint: str | None = None
    bad: tuple[str, str] | None = None
    """Why the message cannot be claimed (reason, detail): it goes to the dead-letter topic,
    or is skipped."""
    done: bool = False
    blocked: bool = False
    order: Order | None = None
    """With --order-key: the entity and sequence the guard orders this event by."""
    outcome: str | None = None
    """What it came to, once done (the summary's count it went to)."""
    letter: DeadLetter | None = None
    """The lane's verdict that it goes to the dead-letter topic: written by the loop
    (``consume.mailroom``), which finishes it once the broker took it."""
    claim_ns: tuple[int, int] | None = None
    span: Any = None
    """With tracing: its claim's time, and its process span while it is open."""
    ran_ns: int = 0
    assignment: int = 0
    """Its partition's assignment when it was fetched (``KafkaState._owns``)."""

    @property
    def topic(self) -> str:
        return self.tp[0]

    @property
    def partition(self) -> int:
        return self.tp[1]


Stop = tuple[Item, Pause] | None
"""Where a partition's run stopped, and why: None when it went through."""


__all__ = ["LETTER", "Item", "Pause", "Stop", "about", "chunks", "fields", "while_done"]


def fields(**fields: Any) -> dict[str, Any]:
    """A log call's ``extra``: structured fields, under one attribute of the record."""
    return {"idemctl": fields}


def chunks(items: list[Item], sizes: list[int]) -> list[list[Item]]:
    """``items`` in order, cut where the keys reach each of ``sizes`` in turn (a message
    with no key stays in the chunk at hand)."""
    chunks: list[list[Item]] = [[]]
    keys = 0
    for item in items:
        if item.key is not None:
            if keys == sizes[len(chunks) - 1]:
                chunks.append([])
                keys = 0
            keys += 1
        chunks[-1].append(item)
    chunks += [[] for _ in sizes[len(chunks) :]]
    return chunks


def while_done(items: list[Item]) -> list[Item]:
    out = []
    for item in items:
        if not item.done:
            break
        out.append(item)
    return out
