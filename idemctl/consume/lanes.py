"""Where handlers run: lanes, each a thread of its own beside the poll loop.

The loop hands a free lane a *round*: the next messages of some partitions (each partition
in one lane at a time, so its order holds). The lane claims, runs and completes them as
``consume.rounds`` says, and hands the round back. The handlers' watchdog
(``consume.overdue``) looks at what each lane runs now; past the hard time limit it marks
the lane *abandoned*, and the loop settles the round without the stuck thread and puts a
fresh lane in its place.

Past ``--stall-timeout`` the lane is *overdue*: the loop moves the round's other partitions
to another lane (``Round.hand_over``), a spare one if every lane is overdue, so a stuck
handler holds up only its own partition.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from idemctl.consume.item import Item, Pause, while_done
from idemctl.runner import Batch, RunResult
from idemctl.runner.limits import Abandoned, cancel_interrupt

Partition = tuple[str, int]


@dataclass(eq=False)
class Round:
    """Messages handed to one lane: some partitions' next messages, each in order."""

    partitions: dict[Partition, list[Item]]
    blocked: dict[Partition, tuple[Item, Pause]] = field(default_factory=dict)
    """Where each partition stopped (its earliest message that must wait), and for how long."""
    claimed: dict[str, RunResult] = field(default_factory=dict)
    """The claims of the keys being run now (the round's current distinct keys)."""
    current: list[Item] = field(default_factory=list)
    """Those keys' messages."""
    started: set[str] = field(default_factory=set)
    """Keys of ``current`` whose handlers were started."""
    error: BaseException | None = None
    """What the lane raised while running it (a store error, a bug): raised in the loop."""
    moved: set[Partition] = field(default_factory=set)
    """Partitions taken out of the round while its lane's handler was overdue (the loop
    handed them to another lane): the lane does nothing more with their messages."""
    went_on: set[Partition] = field(default_factory=set)
    """Partitions whose stop was a dead letter now written: their messages after it are
    handed out again as they are, not fetched again."""

    def first_unfinished(self, tp: Partition | None = None) -> Item | None:
        """The first message not finished, of ``tp`` or of any partition."""
        parts = self.partitions.values() if tp is None else [self.partitions[tp]]
        return next((item for items in parts for item in items if not item.done), None)

    def usable(self, item: Item) -> bool:
        """Not behind the message its partition stopped at, nor moved to another lane."""
        if not self.blocked and not self.moved:
            return True
        if item.tp in self.moved:
            return False
        at = self.blocked.get(item.tp)
        return at is None or item.offset < at[0].offset

    def block(self, item: Item, wait: Pause) -> None:
        """``item``'s partition stops at it (or at an earlier message that stopped it)."""
        item.blocked = True
        at = self.blocked.get(item.tp)
        if at is None or item.offset < at[0].offset:
            self.blocked[item.tp] = (item, wait)

    def hand_over(self, keep: Partition) -> Round:
        """Take every partition but ``keep`` out of the round (its lane's handler is
        overdue), with where each stopped; the caller gives back their claims not started
        (``Batch.hand_over``). Called with the lane's lock held, while the handler runs."""
        out = Round({tp: items for tp, items in self.partitions.items() if tp != keep})
        for tp in out.partitions:
            del self.partitions[tp]
            if tp in self.blocked:
                out.blocked[tp] = self.blocked.pop(tp)
        self.moved |= out.partitions.keys()
        return out

    def not_started(self) -> set[str]:
        """The keys of its messages not finished, whose handlers the current pass did not
        start (their claims, if any, can be given back)."""
        return {
            item.key
            for items in self.partitions.values()
            for item in items
            if item.key is not None and not item.done and item.key not in self.started
        }

    def unfinished(self) -> int:
        return sum(len(items) - len(while_done(items)) for items in self.partitions.values())


@dataclass(eq=False, slots=True)
class Running:
    """A handler running now: its message, since when, in which thread."""

    item: Item
    started: float
    thread: int
    reported: bool = False
    """Said to be overdue (past --stall-timeout)."""
    interrupted: bool = False
    """HandlerTimeout was raised in its thread (the soft limit)."""
    spared: bool = False
    """The round's other partitions were moved to another lane (it was overdue)."""

    def seconds(self, now: float) -> float:
        return now - self.started


class Lane:
    """One handler thread, with a ``Batch`` of its own, and the round in hand."""

    def __init__(
        self,
        index: int,
        batch: Batch,
        work: Callable[[Lane, Round], None],
        done: Callable[[Lane, Round], None],
    ) -> None:
        self.index, self.batch = index, batch
        self.round: Round | None = None
        """In hand: given by the loop, taken back by the loop when done or abandoned."""
        self.running: Running | None = None
        self.abandoned: Running | None = None
        """The handler run past its hard limit that this lane was abandoned in."""
        self.lock = threading.Lock()
        """Taken to end a handler's run and to interrupt or abandon it: never both."""
        self._work, self._done = work, done
        self._inbox: queue.SimpleQueue[Round | None] = queue.SimpleQueue()
        self._ident = 0
        """The thread's identity, once it runs (HandlerTimeout is raised in it by it)."""
        self.thread = threading.Thread(
            target=self._serve, name=f"idemctl-handler-{index}", daemon=True
        )
        """Started with the lane's first round: a consumer that never ran (its metrics
        port taken, say) leaves no thread behind for the interpreter's exit."""

    @property
    def busy(self) -> bool:
        return self.round is not None

    @property
    def overdue(self) -> bool:
        """Its handler ran past --stall-timeout and still runs (not abandoned yet): the
        lane does not count among the --concurrency lanes that serve the others."""
        running = self.running
        return running is not None and running.spared and self.abandoned is None

    def give(self, rnd: Round) -> None:
        self.round = rnd
        self._inbox.put(rnd)
        if self.thread.ident is None:
            self.thread.start()

    def close(self) -> None:
        """No more rounds: the thread ends (an abandoned one, whenever its handler returns)."""
        self._inbox.put(None)

    def started(self, item: Item) -> Running:
        """The lane's thread starts ``item``'s handler."""
        running = Running(item, time.monotonic(), self._ident)
        self.running = running
        return running

    def returned(self, running: Running) -> bool:
        """The handler of ``running`` returned or raised: True when the lane was abandoned
        meanwhile (the caller must record nothing more). A soft limit's HandlerTimeout not
        delivered yet is taken back."""
        with self.lock:
            self.running = None
            if running.interrupted:
                cancel_interrupt(running.thread)
            return self.abandoned is not None

    def _serve(self) -> None:
        self._ident = threading.get_ident()
        while (rnd := self._inbox.get()) is not None:
            try:
                self._work(self, rnd)
            except Abandoned:
                return
            except BaseException as exc:  # raised again in the loop
                rnd.error = exc
            self._done(self, rnd)
