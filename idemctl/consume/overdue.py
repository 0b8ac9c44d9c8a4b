"""The handlers' watchdog: a thread beside the poll loop that looks at what each lane runs.

- past ``--stall-timeout`` a handler is *overdue*: one warning names its key and where its
  thread is stuck (its stack), ``/readyz`` answers 503 naming it, and
  ``idemctl_handlers_overdue`` counts it (``idemctl_stalled_partitions`` its partition),
  and the loop moves the lane's other partitions to another lane (``consume.spares``);
- past ``--handler-timeout`` (the soft limit) ``HandlerTimeout`` is raised in its thread;
- past the hard limit (the soft one plus ``--handler-grace``) its lane is abandoned, and
  the loop is woken to settle it (``Consumer._abandon``).

``check(now)`` does one look; the thread calls it a few times a second.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from idemctl.consume.item import about
from idemctl.consume.lanes import Lane, Running
from idemctl.durations import format_duration
from idemctl.runner.limits import interrupt, stack_of

log = logging.getLogger("idemctl.consume")


class Overdue:
    """What the handlers' watchdog found: handlers overdue now, and lanes to abandon."""

    def __init__(
        self,
        lanes: Callable[[], list[Lane]],
        stall: float,
        soft: float,
        hard: float,
        wake: Callable[[], None],
    ) -> None:
        """``stall``, ``soft``, ``hard``: seconds (0: never)."""
        self._lanes, self._wake = lanes, wake
        self.stall, self.soft, self.hard = stall, soft, hard
        self.overdue: dict[int, str] = {}
        """Lane index -> the handler overdue in it now, said for ``/readyz``."""
        self.partitions: set[tuple[str, int]] = set()
        """The partitions of the overdue handlers' messages."""
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="idemctl-watchdog", daemon=True)

    @property
    def every(self) -> float:
        limits = [s for s in (self.stall, self.soft, self.hard) if s]
        return min(max(min(limits, default=1.0) / 10, 0.05), 0.5)

    def start(self) -> None:
        if any((self.stall, self.soft, self.hard)) and not self._thread.is_alive():
            self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        while not self._stopped.wait(self.every):
            self.check(time.monotonic())

    def check(self, now: float) -> None:
        overdue: dict[int, str] = {}
        partitions = set()
        for lane in self._lanes():
            running = lane.running
            if running is None or lane.abandoned is not None:
                continue
            ran = running.seconds(now)
            if self.stall and ran >= self.stall:
                overdue[lane.index] = self._said(running, ran)
                partitions.add(running.item.tp)
                if not running.reported:
                    running.reported = True
                    self._report(running, ran)
                    self._wake()  # the loop moves the lane's other partitions (spares)
            if self.soft and ran >= self.soft and not running.interrupted:
                self._interrupt(lane, running, ran)
            if self.hard and ran >= self.hard:
                with lane.lock:
                    if lane.running is running:
                        lane.abandoned = running
                if lane.abandoned is running:
                    self._wake()
        self.overdue, self.partitions = overdue, partitions

    def _said(self, running: Running, ran: float) -> str:
        item = running.item
        return (
            f"handler of key {item.key!r} ({item.tp[0]}[{item.tp[1]}]@{item.offset}) running "
            f"for {ran:.0f}s, past --stall-timeout {format_duration(self.stall)}"
        )

    def _report(self, running: Running, ran: float) -> None:
        item = running.item
        log.warning(
            "%s; its thread is at:\n%s",
            self._said(running, ran),
            stack_of(running.thread) or "(gone)",
            extra=about(item, "overdue", seconds=round(ran, 1)),
        )

    def _interrupt(self, lane: Lane, running: Running, ran: float) -> None:
        with lane.lock:
            if lane.running is not running:
                return  # returned meanwhile
            interrupt(running.thread)
            running.interrupted = True
        item = running.item
        log.warning(
            "handler of key %r (%s[%d]@%d) ran past --handler-timeout %s: HandlerTimeout "
            "raised in its thread (a blocking call sees it when it returns)",
            item.key,
            item.tp[0],
            item.tp[1],
            item.offset,
            format_duration(self.soft),
            extra=about(item, "handler_timeout", seconds=round(ran, 1)),
        )
