"""The consume loop's acts on a message once the policy decided, by the shared act layer
(``idemctl.kafka.acts``, which the FastStream middleware drives too), in the lane's
thread: a message is finished, its partition paused at it, or it is to be dead-lettered
(``Item.letter``: the loop writes the letter, ``consume.mailroom``)."""

from __future__ import annotations

from idemctl.consume.event import Event
from idemctl.consume.item import LETTER, Item, Pause
from idemctl.consume.options import ConsumeOptions
from idemctl.kafka.acts import Acts, DeadLetter, Finished, Paused
from idemctl.runner import RunResult


class Acting:
    """What a message comes to once the policy has decided (``Rounds``' part)."""

    def __init__(self, options: ConsumeOptions, acts: Acts) -> None:
        self.options, self._acts = options, acts

    def _count(self, outcome: str, n: int = 1) -> None:
        self._acts.count(outcome, n)

    def act(self, item: Item, result: RunResult) -> Pause | None:
        """What a RunResult comes to in Kafka, for both modes: None when the message is
        finished (or its completion is on its way), else how long to pause its partition
        and why (``LETTER``: until its dead letter is written)."""
        return self._do(item, self._acts.after(item, result))

    def _unusable(self, item: Item) -> Pause | None:
        """A message that cannot be claimed: dead-lettered, or passed by (``skip``)."""
        return self._do(item, self._acts.unusable(item))

    def _do(self, item: Item, next_: Finished | Paused | DeadLetter | None) -> Pause | None:
        if isinstance(next_, DeadLetter):
            item.letter = next_  # the loop writes it; the partition stops here meanwhile
            return LETTER
        if isinstance(next_, Finished):
            item.done, item.outcome = True, next_.outcome
            return None
        if isinstance(next_, Paused):
            return next_.seconds, next_.why
        return None  # completed (or not) by the batch: its answer comes back here

    @staticmethod
    def _event(item: Item) -> Event:
        m = item.msg
        kind, timestamp = m.timestamp()
        headers = tuple(m.headers() or ())
        return Event(
            m.topic(),
            m.partition(),
            m.offset(),
            m.key(),
            m.value(),
            headers,
            timestamp if kind else None,
        )
