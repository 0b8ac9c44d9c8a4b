"""Dead letters, written from the loop's thread.

A lane only says which message is to go (``Item.letter``, the policy's verdict): its
partition stops there (``LETTER``), the round's other partitions go on. The round it
comes back with waits here while its letters are written, and goes back to the loop once
each is acknowledged (the message finished, and the rest of its partition handed out
again at once) or refused (its partition paused there, the back-off doubling with each
refusal in a row). A message whose partition was revoked
meanwhile is left to the partition's next owner, which dead-letters it (``failed
before``). The ``--dlq-breaker``-th dead letter in a row for one reason trips the breaker:
no more are written, and the consumer stops without storing the round's offsets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from idemctl.consume.item import LETTER, Item
from idemctl.consume.lanes import Partition, Round
from idemctl.kafka.acts import Acts, about, where

if TYPE_CHECKING:
    from idemctl.consume.deadletter import DeadLetters, Letter
    from idemctl.consume.hooks import Hooks


@dataclass(eq=False)
class _Mail:
    rnd: Round
    letters: dict[Partition, Item]
    """Each partition's message to dead-letter: the one it stopped at."""
    posted: dict[Partition, tuple[Letter, Any]] = field(default_factory=dict)
    """Each partition's letter on its way, and its hooks' span."""


class Mailroom:
    def __init__(self, acts: Acts, owns: Callable[[Item], bool], hooks: Hooks) -> None:
        self.dlq: DeadLetters | None = None
        """Set once the Kafka clients are open."""
        self.tripped: str | None = None
        """What stopping says once the breaker tripped."""
        self.held: set[Partition] = set()
        """Partitions of the rounds here: the loop hands them to no lane meanwhile."""
        self._acts, self._owns, self.hooks = acts, owns, hooks
        self._mail: list[_Mail] = []

    @property
    def busy(self) -> bool:
        return bool(self._mail)

    def rounds(self) -> list[Round]:
        return [mail.rnd for mail in self._mail]

    def take(self, rnd: Round) -> bool:
        """Whether ``rnd`` has letters to write; if so it stays here until they are
        answered (``poll`` writes them, and gives it back)."""
        letters = {
            tp: item for tp, (item, wait) in rnd.blocked.items() if wait is LETTER and item.letter
        }
        if not letters:
            return False
        self._mail.append(_Mail(rnd, letters))
        self.held |= rnd.partitions.keys()
        return True

    def poll(self) -> list[Round]:
        """Take the broker's answers in and write the letters not written yet: the rounds
        whose letters are all answered."""
        if not self._mail:
            return []
        assert self.dlq is not None
        self.dlq.poll()
        back = []
        for mail in list(self._mail):
            for tp in list(mail.letters):
                if self._step(mail, tp):
                    del mail.letters[tp]
            if not mail.letters:
                self._mail.remove(mail)
                self.held -= mail.rnd.partitions.keys()
                back.append(mail.rnd)
        return back

    def _step(self, mail: _Mail, tp: Partition) -> bool:
        """Post ``tp``'s letter, or take its answer in: whether it is done with."""
        rnd, item = mail.rnd, mail.letters[tp]
        letter = item.letter
        assert letter is not None
        assert self.dlq is not None
        if tp not in mail.posted:
            if self.tripped is not None:
                self.hooks.end(item, None)
                return True  # left unfinished: the consumer stops
            if not self._owns(item):
                self._revoked(rnd, item, letter.reason)
                return True
            span = self.hooks.lettering(item, letter.reason, self.dlq.topic(item.msg))
            posted = self.dlq.post(item.msg, letter.reason, letter.detail, letter.error, span)
            mail.posted[tp] = (posted, span)
        posted, span = mail.posted[tp]
        if not posted.answered:
            return False
        self.hooks.lettered(item, span)
        if posted.refusal is not None:
            paused = self._acts.refused(item, letter.reason, posted.refusal)
            self._acts.count(paused.why)
            rnd.blocked[tp] = (item, (paused.seconds, paused.why))
            self.hooks.end(item, paused.why)
            return True
        item.done, item.outcome = True, "dead_lettered"
        del rnd.blocked[tp]
        rnd.went_on.add(tp)  # the rest of its messages go on at once, without a seek
        storm = self._acts.dead_lettered(item, letter.reason, letter.detail, posted.topic)
        if letter.then:
            self._acts.count(letter.then)
        self.hooks.end(item, "dead_lettered")
        if storm is not None and self.tripped is None:
            self.tripped = (
                f"{storm}, and the offsets of this last batch were not committed. Fix the "
                "cause (often --key or the handler) and start again"
            )
        return True

    def _revoked(self, rnd: Round, item: Item, reason: str) -> None:
        """Revoked while its handler ran: the partition's next owner (maybe this consumer
        again) gets the message again and dead-letters it (``failed before``); a letter
        from here too would be a second one (CI: two for one key under --processes)."""
        self._acts.log.info(
            "%s (key %r) not dead-lettered here (%s): its partition was revoked while its "
            "handler ran, and its next owner dead-letters it",
            where(item),
            item.key,
            reason,
            extra=about(item, "revoked", reason=reason),
        )
        self._acts.count("revoked")
        rnd.blocked[item.tp] = (item, (0.0, "revoked"))
        self.hooks.end(item, "revoked")
