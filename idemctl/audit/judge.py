"""Which class a message below the committed offset falls in, from its key's record.

A message is judged as ``consume`` handled it: the same key strategy and sequence guard,
the same ``--on-missing-key``. Its key's record says what became of it:

- completed: **done**; but a different payload fingerprint was a mismatch, dead-lettered,
  and an event of the sequence guard completed without a result at or below a sequence its
  entity had applied before it here was **stale** (the guard completes a stale event's key
  with a null result); a later message of a key already judged is a replayed duplicate:
  done;
- failed for good: **dead-lettered** (consume dead-letters it); failed and retriable:
  **lost** (a retry waits for a delivery that will not come);
- in progress with a live lease: **in flight**; with an expired lease, or released with no
  owner: **lost**, the group passed it and will not run it again;
- absent: **lost** while the message is younger than the store's retention (its record
  would still be there), **beyond retention** once older (cannot be judged).

With a dead-letter topic to cross-check, a message counted dead-lettered that is not in it
is lost.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import NamedTuple

from idemctl.model import Order, Record, Status


class Seen(NamedTuple):
    """One message as audit read it, keyed as consume keyed it."""

    partition: int
    offset: int
    timestamp: datetime | None
    key: str | None
    fingerprint: str | None = None
    order: Order | None = None
    unusable: str | None = None
    """Why it has no usable key (None when ``key`` is set)."""
    detail: str | None = None
    """What the key strategy said of it when it has no usable key."""


class Judgement(NamedTuple):
    kind: str
    why: str | None = None
    """For a lost message: why it counts as lost."""


class Judge:
    """Judges messages in the order they were read (by partition, then offset): the
    sequence guard's verdict depends on the events of the same entity before it."""

    def __init__(
        self,
        now: datetime,
        retention: float,
        on_missing_key: str = "dlq",
        dead_letters: set[tuple[int, int]] | None = None,
    ) -> None:
        self.now = now
        self.retention = timedelta(seconds=retention)
        self.on_missing_key = on_missing_key
        self.dead_letters = dead_letters
        """(partition, offset) of each dead letter of the topic; None: not cross-checked."""
        self._applied: dict[str, int] = {}
        """Entity -> the highest sequence of its events judged done so far."""
        self._completed: set[str] = set()
        """Completed keys judged so far: a later message of one is a replayed duplicate."""

    def __call__(self, seen: Seen, record: Record | None) -> Judgement:
        if seen.key is None:
            return self._unusable(seen)
        if record is None:
            if seen.timestamp is not None and self.now - seen.timestamp > self.retention:
                return Judgement("beyond_retention")
            return Judgement("lost", "its key has no record: never claimed, or forgotten")
        if record.status is Status.FAILED:
            if record.retriable:  # consume dead-letters a key only once it failed for good
                return Judgement("lost", "its key failed and awaits a retry no delivery will bring")
            return self._dead_lettered(seen, f"its key failed: {record.error or 'an error'}")
        if record.status is Status.IN_PROGRESS:
            if record.lease_live(self.now):
                return Judgement("in_flight")
            if record.owner is None:
                return Judgement("lost", "its key was released and never claimed again")
            return Judgement("lost", "its key is in progress with an expired lease")
        if seen.fingerprint and record.fingerprint and seen.fingerprint != record.fingerprint:
            return self._dead_lettered(seen, "its key was completed for another payload")
        if seen.key in self._completed:  # a duplicate: consume replayed it
            return Judgement("done")
        self._completed.add(seen.key)
        if seen.order is not None:
            entity, sequence = seen.order.entity, seen.order.sequence
            last = self._applied.get(entity)
            if last is not None and sequence <= last and record.result is None:
                return Judgement("stale")
            self._applied[entity] = sequence if last is None else max(last, sequence)
        return Judgement("done")

    def _unusable(self, seen: Seen) -> Judgement:
        if self.on_missing_key == "skip":
            return Judgement("skipped")
        if self.on_missing_key in ("stop", "fail"):
            return Judgement("lost", f"{seen.unusable}; consume stops before such a message")
        return self._dead_lettered(seen, seen.unusable or "no usable key")

    def _dead_lettered(self, seen: Seen, why: str) -> Judgement:
        if self.dead_letters is None or (seen.partition, seen.offset) in self.dead_letters:
            return Judgement("dead_lettered")
        return Judgement("lost", f"{why}, and it is not in the dead-letter topic")
