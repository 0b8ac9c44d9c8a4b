"""The consumer's view of Kafka: is there a group, are there partitions, are the brokers
there, how far behind is it, is a partition stalled; what the live view, ``/readyz`` and
``exit_when_idle`` go by.

librdkafka keeps a partition paused across a revoke and a new assignment: what idemctl
paused (idemctl's pause) is resumed when the partition is revoked or lost, and every partition
assigned is resumed once the assignment is in place, so that idemctl's pauses and the
client's never disagree (a pause is made again, deliberately, when its message comes
round again)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Container
from typing import TYPE_CHECKING, Any

from idemctl.consume.options import ConsumeOptions
from idemctl.consume.overdue import Overdue
from idemctl.consume.stalls import Stalls
from idemctl.errors import KafkaUnavailable
from idemctl.kafka.options import Summary

if TYPE_CHECKING:
    from idemctl.consume.item import Item

log = logging.getLogger("idemctl.consume")
kafka_log = logging.getLogger("idemctl.consume.kafka")
"""librdkafka's own log lines (connection retries and the like)."""

PROGRESS_EVERY = 0.25
"""Seconds between two progress reports (the live view, the benchmark's marks)."""
DOWN_LOG_EVERY = 60.0
"""Seconds between two warnings while the brokers stay unreachable."""
PROBE_EVERY = 5.0
"""Seconds between two metadata requests that tell whether lost brokers are back."""
CLOSE_TIMEOUT = 10.0
"""Seconds the final commit and the client's close may take before the consumer stops
without them: what they did not commit is delivered again, and found done in the store."""


def within(call: Callable[[], None], seconds: float, what: str) -> bool:
    """Run ``call`` in a thread of its own and wait for it ``seconds`` at most: whether it
    finished (if not, a warning naming ``what``, and it is left running, as a daemon)."""
    failed: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # raised here, in the caller's thread
            failed.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name="idemctl-close", daemon=True).start()
    if not done.wait(seconds):
        log.warning(
            "%s did not finish within %gs: stopping without it; messages finished since the "
            "last commit are delivered again and found done in the store",
            what,
            seconds,
        )
        return False
    if failed:
        raise failed[0]
    return True


class KafkaState:
    """What the Consumer knows of Kafka's state, kept from librdkafka's callbacks (error,
    assign, revoke, lost) and from what each poll returns."""

    options: ConsumeOptions
    summary: Summary
    _kafka: Any
    _paused: dict[tuple[str, int], float]
    _resume_at: dict[tuple[str, int], int]
    _overdue: Overdue

    def __init__(self, on_progress: Callable[[Summary], None] | None, stall_timeout: float) -> None:
        self._on_progress = on_progress
        self._partitions: set[tuple[str, int]] = set()
        """Assigned now: idle time counts only while there are some (item of a drain)."""
        self._assigned: list[Any] = []
        """Assigned by the last rebalance, to resume once the assignment is in place."""
        self._assignments: dict[tuple[str, int], int] = {}
        """Each partition's assignment: a message fetched under an earlier one comes again
        from the committed offset (``Item.assignment``)."""
        self._stalls = Stalls(stall_timeout)
        self._polls = 0
        self._joined = self._ever_assigned = False
        self._unassigned_since = self._idle_since = time.monotonic()
        self._down_since: float | None = None
        """When librdkafka said every broker was down; None while they answer."""
        self._kafka_error = ""
        """librdkafka's last error, for the line that says why the consumer stops."""
        self._fatal: Any = None
        self._warned_down = self._probed = self._progressed = 0.0

    def _watch(self, started: float) -> bool:
        """Raise when Kafka gave no partitions in time or stayed lost too long; True when
        the consumer has drained its partitions (``exit_when_idle``)."""
        o = self.options
        now = time.monotonic()
        if self._fatal is not None:
            raise KafkaUnavailable(f"Kafka client failed for good: {self._fatal}")
        if self._down_since is not None:
            self._while_down(now)
        if not self._ever_assigned:
            if o.join_timeout and not o.replacement and now - started >= o.join_timeout:
                raise KafkaUnavailable(self._no_partitions(now - started))
            return False
        if self._down_since is None:
            self._stalls.check(self._kafka, self._partitions, self._not_stalled(), self._polls, now)
        if o.exit_when_idle is None:
            return False
        if not self._partitions:
            # Between a revoke and the next assignment, or left without partitions: idling
            # does not count; a member left out for join_timeout has nothing to drain.
            self._idle_since = now
            if o.join_timeout and now - self._unassigned_since >= o.join_timeout:
                log.warning(
                    "no partitions assigned for %.0fs: the other members of group %s hold "
                    "them all; exiting (--exit-when-idle)",
                    now - self._unassigned_since,
                    o.group,
                )
                return True
            return False
        if self._paused or self._down_since is not None or self._stalls.lagging():
            self._idle_since = now  # paused, cut off or behind is not drained
            return False
        return now - self._idle_since >= o.exit_when_idle

    def _while_down(self, now: float) -> None:
        """The brokers were lost: say so every minute, look every few seconds whether they
        are back, and give up under ``exit_when_idle`` after ``join_timeout``."""
        from confluent_kafka import KafkaException

        assert self._down_since is not None
        o = self.options
        down = now - self._down_since
        if self._ever_assigned and now - self._warned_down >= DOWN_LOG_EVERY:
            self._warned_down = now
            log.warning(
                "the brokers %s are unreachable (for %.0fs): %s; retrying, nothing is committed "
                "meanwhile",
                o.brokers,
                down,
                self._kafka_error or "no answer",
            )
        if now - self._probed >= PROBE_EVERY:
            self._probed = now
            try:
                self._kafka.list_topics(timeout=1.0)
            except KafkaException:
                pass
            else:
                if self._ever_assigned:
                    log.warning("the brokers %s answer again", o.brokers)
                self._down_since = None
                return
        if (
            self._ever_assigned
            and o.exit_when_idle is not None
            and o.join_timeout
            and down >= o.join_timeout
        ):
            raise KafkaUnavailable(
                f"the brokers {o.brokers} were unreachable for {down:.0f}s "
                f"(--join-timeout, under --exit-when-idle): {self._kafka_error or 'no answer'}; "
                "nothing past the finished messages was committed"
            )

    def _no_partitions(self, waited: float) -> str:
        o = self.options
        topics = ", ".join(o.topics)
        if not self._joined:
            why = self._kafka_error or "no answer"
            return (
                f"no partitions within {waited:.0f}s of starting: the brokers {o.brokers} "
                f"did not let the consumer join group {o.group} for topics {topics} ({why}); "
                "are the brokers right and reachable? (-v shows the Kafka client's log; "
                "--join-timeout 0 waits for ever)"
            )
        return (
            f"no partitions within {waited:.0f}s of starting: joined group {o.group} on "
            f"{o.brokers}, but it assigned none of topics {topics}; do they exist? (a group "
            "with more members than partitions leaves some without any; --join-timeout 0 "
            "waits for ever)"
        )

    def _on_kafka_error(self, error: Any) -> None:
        from confluent_kafka import KafkaError

        self._kafka_error = error.str()
        kafka_log.info("%s", error.str())
        if error.fatal():
            self._fatal = error.str()
        elif error.code() == KafkaError._ALL_BROKERS_DOWN and self._down_since is None:
            self._down_since = self._warned_down = time.monotonic()
            if self._ever_assigned:
                log.warning(
                    "lost every broker of %s: %s; retrying, nothing is committed meanwhile",
                    self.options.brokers,
                    self._kafka_error,
                )

    def _progress(self, force: bool = False, state: str | None = None) -> None:
        """Tell ``on_progress`` where the run stands, at most every PROGRESS_EVERY s."""
        now = time.monotonic()
        if self._on_progress is None or (not force and now - self._progressed < PROGRESS_EVERY):
            return
        self._progressed = now
        summary = self.gauges()
        if state is not None:
            summary.state = state
        elif self._down_since is not None and self._joined:
            summary.state = f"brokers unreachable for {now - self._down_since:.0f}s"
        elif not self._joined:
            summary.state = "joining group"
        elif not self._partitions:
            summary.state = "no partitions assigned"
        else:
            summary.state = "consuming"
        summary.lag = self._lag()
        self._on_progress(summary)

    def gauges(self) -> Summary:
        """The summary, its gauges (partitions assigned, paused, stalled, handlers overdue,
        stalls) as they are now: for a scrape, from any thread."""
        summary = self.summary
        summary.paused = len(self._paused)
        summary.partitions = len(self._partitions)
        summary.stalled = len({*self._stalls.stalled, *self._overdue.partitions})
        summary.overdue = len(self._overdue.overdue)
        summary.stalls = self._stalls.recovered
        return summary

    def _lag(self) -> int | None:
        """Messages between the fetch position and the end of each assigned partition, from
        what the last fetches reported (no round trip); None where the broker gave none."""
        from confluent_kafka import KafkaException, TopicPartition

        if not self._partitions or self._kafka is None:
            return None
        lag = 0
        try:
            positions = self._kafka.position([TopicPartition(t, p) for t, p in self._partitions])
            for tp in positions:
                high = self._kafka.get_watermark_offsets(tp, cached=True)
                if high is None or high[1] < 0 or tp.offset < 0:
                    return None
                lag += max(high[1] - tp.offset, 0)
        except (KafkaException, RuntimeError):
            return None
        return lag

    def _not_stalled(self) -> Container[tuple[str, int]]:
        """Partitions the stall watchdog leaves alone: those idemctl paused."""
        return self._paused

    def _error(self, msg: Any) -> bool:
        from confluent_kafka import KafkaError, KafkaException

        error = msg.error()
        if error is None:
            return False
        if error.code() == KafkaError._PARTITION_EOF:
            return True
        if error.fatal():
            raise KafkaException(error)
        log.warning("consumer error: %s", error)
        return True

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self._assigned += partitions  # resumed after the poll: the assignment is then in place
        self._joined = True
        self._down_since = None  # a group coordinator answered
        self._partitions |= {(p.topic, p.partition) for p in partitions}
        for p in partitions:
            tp = (p.topic, p.partition)
            self._assignments[tp] = self._assignments.get(tp, 0) + 1
        if self._partitions:
            self._ever_assigned = True
        self._idle_since = time.monotonic()

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        # The consumer finished the partitions' rounds first: commit what is stored.
        from confluent_kafka import KafkaException

        self._forget_partitions(partitions)
        try:
            consumer.commit(asynchronous=False)
        except KafkaException as exc:
            log.debug("commit on revoke: %s", exc)

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        self._forget_partitions(partitions)  # another member owns them now: commit nothing

    def _owns(self, item: Item) -> bool:
        """Whether ``item`` is still this consumer's to finish: its partition assigned
        since it was fetched. Revoked meanwhile (even if assigned again), the message
        comes again from the committed offset, to this consumer or another."""
        return item.tp in self._partitions and self._assignments.get(item.tp) == item.assignment

    def _resume_assigned(self) -> None:
        """Resume what the last rebalance assigned: librdkafka may still have it paused from
        a pause before the rebalance."""
        from confluent_kafka import KafkaException

        assigned, self._assigned = self._assigned, []
        if assigned:
            try:
                self._kafka.resume(assigned)
            except KafkaException as exc:  # revoked again meanwhile: its next assignment
                log.debug("resume on assignment: %s", exc)

    def _forget_partitions(self, partitions: list[Any]) -> None:
        from confluent_kafka import KafkaException

        try:
            self._kafka.resume(partitions)  # no pause outlives the assignment it was made in
        except KafkaException as exc:
            log.debug("resume on revoke: %s", exc)
        self._stalls.forget((p.topic, p.partition) for p in partitions)
        for p in partitions:
            tp = (p.topic, p.partition)
            self._paused.pop(tp, None)
            self._resume_at.pop(tp, None)
            self._partitions.discard(tp)
        now = time.monotonic()
        self._idle_since = now
        if not self._partitions:
            self._unassigned_since = now
