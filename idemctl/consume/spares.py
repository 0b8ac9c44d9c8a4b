"""Spare lanes: a stuck handler holds up only its own partition.

Once a lane's handler is overdue (past ``--stall-timeout``, ``consume.overdue``), the loop
takes the round's other partitions out of it (``Round.hand_over``: the claims not started
given back, offsets stored for what finished, each partition sought back to its first
unfinished message) and hands them to another lane. The overdue lane no longer counts
among the ``--concurrency`` lanes that serve the partitions: while fewer than that are
free of an overdue handler, a spare lane is started, at most ``--max-abandoned`` + 1 of
them (past that many stuck handlers the process stops anyway). A lane is given back
once its handler returns (the round settled) or is abandoned, while the others are
enough.

The stuck key's own partition keeps its order: it is *parked* (paused where it stands)
until the overdue round comes back, when the handler returns or the hard limit passes
the key by (``Consumer._abandon``).
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, Any

from idemctl.consume.deadletter import kafka_text
from idemctl.consume.item import about
from idemctl.consume.lanes import Lane, Partition, Round, Running
from idemctl.consume.pausing import Pausing
from idemctl.consume.watch import log

if TYPE_CHECKING:
    from idemctl.consume.item import Item
    from idemctl.consume.options import ConsumeOptions


class Spares(Pausing):
    """A part of Consumer: moving an overdue lane's other partitions, and the lanes'
    number, in the loop's thread."""

    options: ConsumeOptions
    _lanes: list[Lane]
    _in_lane: dict[Partition, Lane]
    _waiting: dict[Partition, list[Item]]
    _parked: set[Partition]
    _lane_numbers: itertools.count[int]

    def _lane(self, index: int) -> Lane:
        raise NotImplementedError

    def _put_back(self, rnd: Round) -> None:
        raise NotImplementedError

    @property
    def spare_lanes(self) -> int:
        """Lanes beyond --concurrency now (each beside an overdue handler)."""
        return max(len(self._lanes) - self.options.concurrency, 0)

    @property
    def _most_spares(self) -> int:
        return self.options.max_abandoned + 1

    def _spare(self) -> None:
        """Move the other partitions of each lane whose handler just became overdue, and
        start the spare lanes the others need."""
        for lane in list(self._lanes):
            running = lane.running
            if running is not None and running.reported and not running.spared:
                moved = self._move_others(lane, running)
                if moved is not None:
                    self._said(running, moved, self._staff())
        self._staff()

    def _move_others(self, lane: Lane, running: Running) -> list[Partition] | None:
        """Take the other partitions out of ``lane``'s round (None: its handler returned
        or was abandoned meanwhile) and park the stuck key's partition."""
        rnd = lane.round
        keep = running.item.tp
        with lane.lock:  # the handler cannot return meanwhile, nor the lane go on
            if lane.running is not running or lane.abandoned is not None or rnd is None:
                return None
            running.spared = True
            kept = {item.key for item in rnd.partitions.get(keep, ())}
            moved = rnd.hand_over(keep)
            # Not a key the lane still runs: one started, or one of the stuck partition's.
            lane.batch.hand_over(moved.not_started() - rnd.started - kept)
        for tp in moved.partitions:
            if self._in_lane.get(tp) is lane:
                del self._in_lane[tp]
        self._put_back(moved)
        self._park(keep)
        return sorted(moved.partitions)

    def _said(self, running: Running, moved: list[Partition], spares: list[Lane]) -> None:
        o, item = self.options, running.item
        where = ", ".join(f"{t}[{p}]" for t, p in moved) or "none in its round"
        spare = (
            f"; spare lane {spares[0].thread.name} started ({self.spare_lanes} beyond "
            f"--concurrency {o.concurrency}, at most --max-abandoned + 1 = {self._most_spares})"
            if spares
            else ""
        )
        log.warning(
            "the handler of key %r (%s[%d]@%d) is overdue: its partition waits for it, the "
            "other partitions go on in other lanes (moved from its round: %s)%s",
            item.key,
            item.tp[0],
            item.tp[1],
            item.offset,
            where,
            spare,
            extra=about(item, "spared", moved=len(moved), lanes=len(self._lanes)),
        )

    def _staff(self) -> list[Lane]:
        """Start spare lanes while fewer than --concurrency lanes are free of an overdue
        handler (at most ``_most_spares`` beyond it); the lanes started."""
        o = self.options
        serving = sum(not lane.overdue for lane in self._lanes)
        started = []
        while serving < o.concurrency and len(self._lanes) < o.concurrency + self._most_spares:
            lane = self._lane(next(self._lane_numbers))
            self._lanes.append(lane)
            started.append(lane)
            serving += 1
        if started and self._pressed:
            self._unpress()
        return started

    def _retire(self, lane: Lane) -> None:
        """``lane``'s round is back (its handler returned): give it back if the lanes free
        of an overdue handler are more than --concurrency without it."""
        serving = sum(not other.overdue for other in self._lanes)
        if lane.busy or lane.overdue or serving <= self.options.concurrency:
            return
        self._lanes.remove(lane)
        lane.close()
        lane.batch.close()
        log.info(
            "lane %s given back (%d lanes)",
            lane.thread.name,
            len(self._lanes),
            extra={"idemctl": {"outcome": "lane_given_back", "lanes": len(self._lanes)}},
        )

    def _park(self, tp: Partition) -> None:
        """Pause ``tp`` where it stands while its lane's handler is overdue: what is fetched
        of it waits in Kafka, not in this process (nor in the next round's budget)."""
        from confluent_kafka import KafkaException, TopicPartition

        waiting = self._waiting.pop(tp, None)
        if waiting:
            self._pause(waiting[0], 0.0)
        else:
            try:
                (at,) = self._kafka.position([TopicPartition(*tp)])
                self._kafka.pause([at])
                if at.offset >= 0:
                    self._kafka.seek(at)
                    self._resume_at[tp] = at.offset
            except KafkaException as exc:  # revoked meanwhile
                log.debug("park %s[%d]: %s", tp[0], tp[1], kafka_text(exc))
                return
            self._pressed.discard(tp)
        self._paused[tp] = math.inf
        self._parked.add(tp)

    def _unpark(self, rnd: Round) -> None:
        """The round is back: its parked partitions are resumed (unless it stops them)."""
        for tp in rnd.partitions:
            if tp in self._parked:
                self._parked.discard(tp)
                if self._paused.get(tp) == math.inf:
                    self._paused[tp] = 0.0  # due now

    def _forget_parked(self, partitions: list[Any]) -> None:
        for p in partitions:
            self._parked.discard((p.topic, p.partition))
