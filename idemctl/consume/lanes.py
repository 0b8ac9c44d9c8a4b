"""Where handlers run: lanes, each a thread of its own beside the poll loop.

The loop hands a free lane a *round*: the next messages of some partitions (each partition
in one lane at a time, so its order holds). The lane claims, runs and completes them as
``consume.rounds`` says, and hands the round back. The handlers' watchdog
(``consume.overdue``) looks at what each lane runs now; past the hard time limit it marks
the lane *abandoned*, and the loop settles the round without the stuck thread and puts a
fresh lane in its place.
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

    def first_unfinished(self, tp: Partition | None = None) -> Item | None:
        """The first message not finished, of ``tp`` or of any partition."""
        parts = self.partitions.values() if tp is None else [self.partitions[tp]]
        return next((item for items in parts for item in items if not item.done), None)

    def usable(self, item: Item) -> bool:
        """Not behind the message its partition stopped at."""
        at = self.blocked.get(item.tp)
        return at is None or item.offset < at[0].offset

    def block(self, item: Item, wait: Pause) -> None:
        """``item``'s partition stops at it (or at an earlier message that stopped it)."""
        item.blocked = True
        at = self.blocked.get(item.tp)
        if at is None or item.offset < at[0].offset:
            self.blocked[item.tp] = (item, wait)

    def unfinished(self) -> int:
        return sum(len(items) - len(while_done(items)) for items in self.partitions.values())


@dataclass(eq=False)
class Running:
    """A handler running now: its message, since when, in which thread."""

    item: Item
    started: float
    thread: int
    reported: bool = False
    """Said to be overdue (past --stall-timeout)."""
    interrupted: bool = False
    """HandlerTimeout was raised in its thread (the soft limit)."""

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
        self.thread = threading.Thread(
            target=self._serve, name=f"idemctl-handler-{index}", daemon=True
        )
        self.thread.start()

    @property
    def busy(self) -> bool:
        return self.round is not None

    def give(self, rnd: Round) -> None:
        self.round = rnd
        self._inbox.put(rnd)

    def close(self) -> None:
        """No more rounds: the thread ends (an abandoned one, whenever its handler returns)."""
        self._inbox.put(None)

    def started(self, item: Item) -> Running:
        """The lane's thread starts ``item``'s handler."""
        running = Running(item, time.monotonic(), threading.get_ident())
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
        while (rnd := self._inbox.get()) is not None:
            try:
                self._work(self, rnd)
            except Abandoned:
                return
            except BaseException as exc:  # raised again in the loop
                rnd.error = exc
            self._done(self, rnd)
