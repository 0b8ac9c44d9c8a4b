"""The consume loop: Kafka's at-least-once delivery made effectively-once by a store.

The loop polls, and never runs handler code: it hands each free lane (``--concurrency``
threads, ``consume.lanes``) a round of the messages it fetched, a partition in one lane at
a time, and goes on polling (so a slow handler never exceeds ``max.poll.interval.ms``),
serving the rebalance callbacks, pausing and resuming, and storing offsets as rounds come
back. What a lane does with a round (claim in one round trip a chunk, run, complete) is
``consume.rounds``; what each message and RunResult comes to in Kafka is the policy's
(``idemctl.kafka.policy``, shared with the FastStream middleware); ``acting`` carries its
decisions out.

Offsets are stored only for messages that are finished (completed, replayed, skipped, stale
or dead-lettered), in partition order: a partition stops at its first unfinished message,
seeks back to it, and waits (paused) for a back-off. The store being unreachable stops
every partition the same way: fail closed; so does a dead letter the broker refuses.

A handler that does not return is the watchdog's (``consume.overdue``): reported, then
interrupted, then abandoned (``_abandon``: its key failed as timed out, its round settled
without it); once it is overdue, the other partitions go on in another lane, a spare one
if need be (``consume.spares``); past ``--max-abandoned`` the consumer stops
(StuckHandlers). ``stop()`` drains for at most ``--drain-timeout``; what is still running
then is left uncommitted and named (StuckHandlers).

What stops it on purpose: a Kafka setting librdkafka refuses, or a key template the first
message cannot fill (ConfigError, before anything is claimed); no partitions within
``join_timeout``, or a Kafka client that failed for good (KafkaUnavailable); a dead-letter
storm or ``--on-missing-key stop`` (ConsumeStopped).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from idemctl.consume.deadletter import DeadLetters, kafka_text
from idemctl.consume.hooks import Chain, Hooks, Timing
from idemctl.consume.item import Item, about
from idemctl.consume.lanes import Lane, Partition, Round
from idemctl.consume.mailroom import Mailroom
from idemctl.consume.options import ConsumeOptions
from idemctl.consume.overdue import Overdue
from idemctl.consume.pausing import Pausing
from idemctl.consume.rounds import Rounds
from idemctl.consume.spares import Spares
from idemctl.consume.traced import Tracing
from idemctl.consume.watch import CLOSE_TIMEOUT, KafkaState, kafka_log, log, within
from idemctl.drivers import require
from idemctl.durations import format_duration
from idemctl.errors import (
    ConfigError,
    ConsumeStopped,
    HandlerTimeout,
    KafkaUnavailable,
    StuckHandlers,
)
from idemctl.kafka.acts import Acts
from idemctl.kafka.keys import Message
from idemctl.kafka.options import Summary
from idemctl.kafka.policy import Keying, flag
from idemctl.runner import Batch, Step
from idemctl.runner.limits import stack_of

if TYPE_CHECKING:
    from idemctl.consume.event import Handler
    from idemctl.stores.base import Store

PRESS_AFTER = 1.0
"""Seconds the loop goes without fetching (every lane busy, the next round waiting) before
it pauses the partitions in hand and polls only to stay in the group."""


class Consumer(Spares, Pausing, KafkaState):
    """Runs ``handler`` for each message of ``options.topics``, effectively once per key."""

    def __init__(
        self,
        store: Store,
        handler: Handler,
        options: ConsumeOptions,
        *,
        on_progress: Callable[[Summary], None] | None = None,
    ) -> None:
        super().__init__(on_progress, options.stall_timeout)
        self.store, self.handler, self.options = store, handler, options
        self.summary = Summary()
        self._keying = Keying(options)
        self._stop = threading.Event()
        self._paused: dict[Partition, float] = {}
        self._resume_at: dict[Partition, int] = {}
        """The offset a paused partition was sought back to: anything else fetched for it
        before that offset comes round again was fetched before the seek."""
        self._waiting: dict[Partition, list[Item]] = {}
        """Fetched, not handed to a lane yet: the next round."""
        self._in_lane: dict[Partition, Lane] = {}
        self._pressed: set[Partition] = set()
        """Paused while every lane is busy (``PRESS_AFTER``), resumed when one frees."""
        self._parked: set[Partition] = set()
        """Paused while the handler of their lane is overdue (``consume.spares``)."""
        self._fetched_at = time.monotonic()
        self._kafka: Any = None
        self._acts = Acts(options, self.summary, log, flag)
        traced = Tracing.start(store.url, options.trace_keys)
        self._hooks: Hooks = Hooks() if traced is None else traced
        """Tracing and timing (``consume.hooks``)."""
        self._mail = Mailroom(self._acts, self._owns, self._hooks)
        self._rounds = Rounds(handler, options, self._keying, self._acts, self._hooks, self._halted)
        """What the lanes run: all they read of the loop is ``_halted``."""
        self._closing = False
        self._failure: BaseException | None = None
        """Raised by the loop at its next turn (found in a rebalance callback)."""
        self._finished: queue.SimpleQueue[tuple[Lane, Round]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._lanes = [self._lane(i) for i in range(options.concurrency)]
        """The lanes: --concurrency of them, and spare ones beside overdue handlers."""
        self._lane_numbers = itertools.count(options.concurrency)
        self._abandoned: list[str] = []
        """Keys whose handlers' threads were abandoned past the hard limit."""
        hard = options.handler_timeout + options.handler_grace if options.handler_timeout else 0
        self._overdue = Overdue(
            lambda: list(self._lanes), options.stall_timeout, options.handler_timeout, hard,
            self._wake.set,
        )  # fmt: skip

    def _lane(self, index: int) -> Lane:
        o = self.options
        batch = Batch(
            self.store,
            lease=o.lease,
            permanent=o.permanent_errors,
            max_attempts=o.max_attempts,
            transactional=o.transactional,
            complete_batch=o.complete_batch,
            complete_wait=o.complete_wait,
            logger=log,
        )
        batch.timed = self._hooks.store_call
        return Lane(index, batch, self._rounds.work, self._lane_done)

    def _lane_done(self, lane: Lane, rnd: Round) -> None:
        self._finished.put((lane, rnd))
        self._wake.set()

    def use(self, hooks: Hooks) -> None:
        """Tell ``hooks`` of each message's life too (``consume.hooks``), before ``run``."""
        self._hooks = Chain([self._hooks, hooks])
        self._mail.hooks = self._rounds.hooks = self._hooks
        for lane in self._lanes:
            lane.batch.timed = self._hooks.store_call

    def timed(self, handler: Callable[[float], None], store: Callable[[str, float], None]) -> None:
        """Tell ``handler`` each handler run's seconds, and ``store`` each claim and
        completion round trip's (``"claim"`` or ``"complete"``, and the seconds)."""
        self.use(Timing(handler, store))

    @property
    def in_flight(self) -> int:
        """Keys this consumer holds now (claimed, not yet completed or given back)."""
        return sum(lane.batch.in_flight for lane in self._lanes)

    @property
    def stalled(self) -> list[str]:
        """Partitions the watchdog finds stalled and handlers overdue now (``/readyz``)."""
        return list(self._stalls.stalled.values()) + list(self._overdue.overdue.values())

    def _not_stalled(self) -> set[Partition]:
        """Partitions the stall watchdog leaves alone: paused by idemctl, or with
        messages in hand (a lane's handler that does not return is the other watchdog's)."""
        return {*self._paused, *self._pressed, *self._in_lane, *self._waiting, *self._mail.held}

    def _halted(self) -> bool:
        """Draining (``stop()``), or stopping (the dead-letter breaker tripped)."""
        return self._stop.is_set() or self._mail.tripped is not None

    def stop(self) -> None:
        """Drain and return (signal-safe): the running handlers finish (for at most
        ``--drain-timeout``), their keys are completed, the rounds' other claims released,
        offsets stored and committed."""
        self._stop.set()
        self._wake.set()

    # The loop -----------------------------------------------------------------------------

    def open(self) -> None:
        """Build the Kafka clients from the options: a setting librdkafka refuses is a
        ConfigError naming it, before anything is claimed. ``run`` opens them if needed."""
        if self._kafka is None:
            self._kafka, self._mail.dlq = kafka_clients(self.options, self._on_kafka_error)

    def run(self) -> Summary:
        """Consume until stopped, done (``max_messages``, ``exit_when_idle``) or failed;
        StuckHandlers when handlers were left running (their messages uncommitted)."""
        from confluent_kafka import KafkaException

        self.open()
        try:
            self._loop()
        except KafkaException as exc:
            self._wind_down()
            raise KafkaUnavailable(
                f"the Kafka client failed: {kafka_text(exc)}; nothing past the finished "
                "messages was committed"
            ) from None
        except BaseException:
            self._wind_down()
            raise
        left = self._wind_down()
        if left:
            raise StuckHandlers(
                f"--drain-timeout {format_duration(self.options.drain_timeout)} passed with "
                f"handlers still running: {_keys(left)}; their messages were left uncommitted "
                "(their keys are taken over once their leases run out)",
                tuple(left),
            )
        return self.summary

    def _loop(self) -> None:
        o = self.options
        started = self._unassigned_since = self._idle_since = time.monotonic()
        self._kafka.subscribe(
            o.topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        self._overdue.start()
        while not self._stop.is_set():
            self._reap()
            if self._stop.is_set():
                break
            if self._watch(started):
                break
            self._resume_due()
            self._dispatch()  # what waited for the rounds just taken back
            self._fetch()
            self._dispatch()
            self._progress()
            if o.max_messages is not None and self.summary.finished >= o.max_messages:
                break

    def _in_hand(self) -> int:
        """Messages fetched and not finished: waiting for a lane, or in one."""
        waiting = sum(len(items) for items in self._waiting.values())
        rounds = [lane.round for lane in self._lanes if lane.round] + self._mail.rounds()
        return waiting + sum(rnd.unfinished() for rnd in rounds)

    def _fetch(self) -> None:
        """Fetch the next round while the lanes run theirs: at most a batch waits. With
        every lane busy and a round waiting, wait for a lane; past ``PRESS_AFTER``, pause
        every partition and poll only to stay in the group."""
        o = self.options
        busy = any(lane.busy for lane in self._lanes) or self._mail.busy
        want = o.batch_size - sum(len(items) for items in self._waiting.values())
        if o.max_messages is not None:  # claim no message that will not run
            want = min(want, o.max_messages - self.summary.finished - self._in_hand())
        now = time.monotonic()
        if busy or self._waiting:
            self._idle_since = now  # work in hand is not idling
        if want <= 0:
            if self._finished.empty():
                self._wake.wait(o.poll_timeout if now - self._fetched_at < PRESS_AFTER else 0.1)
            self._wake.clear()
            if time.monotonic() - self._fetched_at < PRESS_AFTER:
                return
            self._press()
            want = 1  # nothing comes from a paused partition: the poll keeps the membership
        fetched = self._kafka.consume(
            num_messages=want, timeout=min(o.poll_timeout, 0.02) if busy else o.poll_timeout
        )
        self._fetched_at = time.monotonic()
        self._polls += 1
        self._resume_assigned()
        if fetched:
            self._down_since = None  # the brokers answer
        messages = [m for m in fetched if m.error() is None or not self._error(m)]
        if not messages:
            return
        self._idle_since = time.monotonic()
        for m in messages:
            tp = (m.topic(), m.partition())
            if tp in self._paused or tp in self._pressed:
                continue  # fetched before the partition was paused
            if tp in self._resume_at:
                if m.offset() != self._resume_at[tp]:
                    continue
                del self._resume_at[tp]
            self._waiting.setdefault(tp, []).append(self._keyed(m, tp))

    def _keyed(self, m: Any, tp: Partition) -> Item:
        """The message with its key and fingerprint, or why it has none usable (the
        policy's ``Keying.admit``)."""
        a = self._keying.admit(Message(tp[0], tp[1], m.offset(), m.value(), m.headers() or ()))
        return Item(
            m, tp, m.offset(), a.key, a.fingerprint, a.bad, order=a.order,
            assignment=self._assignments.get(tp, 0),
        )  # fmt: skip

    def _dispatch(self) -> None:
        """Hand the waiting messages of partitions in no lane to the free lanes, their
        partitions shared out among them."""
        free = [lane for lane in self._lanes if not lane.busy]
        held = self._mail.held
        ready = [tp for tp in self._waiting if tp not in self._in_lane and tp not in held]
        if not free or not ready:
            return
        shares: list[dict[Partition, list[Item]]] = [{} for _ in range(min(len(free), len(ready)))]
        for i, tp in enumerate(ready):
            shares[i % len(shares)][tp] = self._waiting.pop(tp)
        for lane, share in zip(free, shares, strict=False):
            for tp in share:
                self._in_lane[tp] = lane
            lane.give(Round(share))

    # Rounds coming back -------------------------------------------------------------------

    def _reap(self) -> None:
        """Take back the rounds the lanes finished and settle the lanes the watchdog
        abandoned; raise what one of them raised."""
        while True:
            try:
                lane, rnd = self._finished.get_nowait()
            except queue.Empty:
                break
            if lane.round is rnd:
                self._settle(lane, rnd)
        for rnd in self._mail.poll():  # its dead letters answered
            self._finish(rnd)
        for lane in list(self._lanes):
            if lane.abandoned is not None and lane.round is not None:
                self._abandon(lane)
        self._spare()
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def _settle(self, lane: Lane, rnd: Round) -> None:
        """A round is back: its dead letters written (``consume.mailroom``), then its
        partitions' offsets stored, each paused where it stopped."""
        lane.round = None
        for tp in rnd.partitions:
            if self._in_lane.get(tp) is lane:
                del self._in_lane[tp]
        self._unpark(rnd)
        if rnd.error is not None or self._mail.tripped is not None or not self._mail.take(rnd):
            self._finish(rnd)
        self._retire(lane)

    def _finish(self, rnd: Round) -> None:
        if self._mail.tripped is not None:
            self._failure = self._failure or ConsumeStopped(self._mail.tripped)
            return  # no offset of this round stored
        if rnd.error is not None:
            self._failure = self._failure or rnd.error
        self._put_back(rnd)
        self._unpress()

    def _put_back(self, rnd: Round) -> None:
        """Store the offsets of what ``rnd`` finished; pause each of its partitions where it
        stopped (sought back to its first unfinished message); one whose stop was a dead
        letter now written goes on with the messages after it at once."""
        self._store_offsets(list(rnd.partitions.values()))
        for tp in rnd.partitions:
            stop = rnd.blocked.get(tp)
            if stop is None and tp in rnd.went_on and not self._stop.is_set():
                rest = [item for item in rnd.partitions[tp] if not item.done]
                if rest and self._owns(rest[0]):  # not revoked while its letter was written
                    for item in rest:
                        item.letter = None  # a verdict behind the stop: decided again
                    self._waiting[tp] = rest + self._waiting.get(tp, [])
                continue
            if stop is None and not self._stop.is_set():
                left = rnd.first_unfinished(tp)
                stop = (left, (0.0, "")) if left is not None else None  # from there, at once
            if stop is not None:
                item, (seconds, _) = stop
                self._waiting.pop(tp, None)  # fetched past it: it comes again
                self._pause(item, seconds)

    def _abandon(self, lane: Lane) -> None:
        """The watchdog abandoned ``lane`` past the hard limit: fail the stuck key as timed
        out (retried, or dead-lettered after --max-attempts), give back the round's other
        claims, settle the round without the stuck thread, and put a fresh lane in its
        place; past --max-abandoned, stop."""
        o = self.options
        running, rnd = lane.abandoned, lane.round
        assert running is not None
        assert rnd is not None
        item = running.item
        assert item.key is not None
        seconds = time.monotonic() - running.started
        self._abandoned.append(item.key)
        limit = format_duration(o.handler_timeout + o.handler_grace)
        log.warning(
            "handler of key %r (%s[%d]@%d) ran %.0fs, past its hard limit %s (--handler-timeout "
            "+ --handler-grace): its thread %s is abandoned (%d of --max-abandoned %d), the "
            "key failed as timed out; it was at:\n%s",
            item.key,
            item.tp[0],
            item.tp[1],
            item.offset,
            seconds,
            limit,
            lane.thread.name,
            len(self._abandoned),
            o.max_abandoned,
            stack_of(running.thread) or "(gone)",
            extra=about(item, "abandoned", seconds=round(seconds, 1)),
        )
        if o.transactional:  # its open transaction holds the key's row while the thread lives
            self._settle(lane, rnd)
            self._failure = self._failure or StuckHandlers(
                f"the handler of key {item.key!r} passed its hard limit {limit} in "
                "transactional mode: its open transaction holds the key while this process "
                "lives; stopping so it can run again",
                (item.key,),
            )
            return
        batch = lane.batch
        result = batch.abandon(
            item.key,
            HandlerTimeout(
                f"the handler ran {seconds:.0f}s, past its hard limit {limit} "
                "(--handler-timeout + --handler-grace): its thread was abandoned"
            ),
        )
        for other in rnd.current:
            if other.key is None or other.key == item.key or other.key in rnd.started:
                continue
            claim = rnd.claimed.get(other.key)
            if claim is not None and claim.outcome is Step.HELD:
                batch.give_back(other.key)
        rounds = self._rounds
        rounds.completed(rnd, rnd.current, batch.end_round())
        wait = rounds.act(item, result)
        if wait is not None:
            rounds.block(rnd, item, wait)
        self._lanes.remove(lane)
        self._settle(lane, rnd)
        lane.close()
        batch.close()
        self._staff()  # a fresh lane in its place, unless a spare one took it already
        if len(self._abandoned) > o.max_abandoned:
            self._failure = self._failure or StuckHandlers(
                f"{len(self._abandoned)} handler(s) passed their hard limit {limit}, more "
                f"than --max-abandoned {o.max_abandoned}: {_keys(self._abandoned)}; stopping "
                "so that a fresh process takes over (their keys were failed as timed out)",
                tuple(self._abandoned),
            )

    def _wind_down(self) -> list[str]:
        """Drain the lanes for at most ``--drain-timeout``, commit, close; the keys of the
        handlers still running then (their messages left uncommitted)."""
        self._progress(force=True)  # where it stood when it stopped consuming
        self._stop.set()
        self._waiting.clear()  # never claimed: the next owner fetches them again
        deadline = time.monotonic() + self.options.drain_timeout
        while (
            any(lane.busy for lane in self._lanes) or self._mail.busy
        ) and time.monotonic() < deadline:
            self._wake.wait(min(0.1, max(deadline - time.monotonic(), 0)))
            self._wake.clear()
            try:
                self._reap()
            except BaseException as exc:  # stopping already
                log.debug("draining: %s", exc)
        left = []
        for lane in self._lanes:
            if lane.round is None:
                continue
            running = lane.running
            unfinished = running.item if running is not None else lane.round.first_unfinished()
            if unfinished is not None:
                u = unfinished
                left.append(u.key or f"{u.tp[0]}[{u.tp[1]}]@{u.offset}")
            self._store_offsets(list(lane.round.partitions.values()))  # what finished
        for rnd in self._mail.rounds():  # dead letters unanswered: from there, next time
            self._store_offsets(list(rnd.partitions.values()))
        if left:
            log.warning(
                "--drain-timeout %s passed with handlers still running: %s; their messages "
                "are left uncommitted",
                format_duration(self.options.drain_timeout),
                _keys(left),
                extra={"idemctl": {"outcome": "drain_timeout", "keys": left}},
            )
        self._overdue.stop()
        self._closing = True
        self._close()
        self._progress(force=True, state="stopped")
        return left

    def _close(self) -> None:
        from confluent_kafka import KafkaException

        for lane in self._lanes:
            lane.close()
            if not lane.busy:  # a stuck thread's batch dies with the process
                lane.batch.close()

        def leave() -> None:
            try:
                self._kafka.commit(asynchronous=False)
            except KafkaException as exc:  # nothing stored since the last commit
                log.debug("final commit: %s", exc)
            try:
                self._kafka.close()
            except (KafkaException, RuntimeError) as exc:
                log.debug("close: %s", exc)

        # librdkafka's synchronous commit and its close wait without a bound (for a group
        # coordinator, say): a consumer told to stop must stop all the same.
        within(leave, CLOSE_TIMEOUT, "the final commit and leaving the group")
        if self._mail.dlq is not None:
            self._mail.dlq.close()

    # Rebalances ---------------------------------------------------------------------------

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        """Finish the rounds of the revoked partitions (for at most --drain-timeout), then
        commit what is stored. Closing, the close committed it already: a commit from
        inside librdkafka's close can wait for ever (seen on CI: the worker never exited)."""
        if self._closing:
            self._forget_partitions(partitions)
            return
        revoked = {(p.topic, p.partition) for p in partitions}
        # Closing (the drain is over): what still runs was named already; no second wait.
        deadline = time.monotonic() + (0 if self._closing else self.options.drain_timeout)
        while any(tp in self._in_lane or tp in self._mail.held for tp in revoked) and (
            time.monotonic() < deadline
        ):
            self._wake.wait(0.05)
            self._wake.clear()
            try:
                self._reap()
            except BaseException as exc:  # raised by the loop's next turn
                self._failure = self._failure or exc
        busy = sorted(tp for tp in revoked if tp in self._in_lane)
        if busy:
            log.warning(
                "revoked while their handlers still ran: %s; their messages are left "
                "uncommitted for the partitions' next owner",
                ", ".join(f"{t}[{p}]" for t, p in busy),
            )
        super()._on_revoke(consumer, partitions)

    def _forget_partitions(self, partitions: list[Any]) -> None:
        super()._forget_partitions(partitions)
        self._forget_parked(partitions)
        for p in partitions:
            tp = (p.topic, p.partition)
            self._waiting.pop(tp, None)
            self._pressed.discard(tp)


def _keys(keys: list[str]) -> str:
    shown = ", ".join(repr(k) for k in keys[:5])
    return shown + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")


def kafka_clients(
    o: ConsumeOptions, on_error: Callable[[Any], None] | None = None
) -> tuple[Any, DeadLetters]:
    """The Kafka consumer and the dead-letter producer the options make (the consumer joins
    no group until it subscribes): a setting librdkafka refuses is a ConfigError naming it.
    ``check_kafka`` makes and drops them, for a supervisor that starts workers with them."""
    require("confluent_kafka", "kafka", "consuming Kafka")
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import KafkaException

    config = {
        "bootstrap.servers": o.brokers,
        "group.id": o.group,
        "enable.auto.offset.store": False,  # an offset is stored only once finished
        "enable.auto.commit": True,
        "auto.offset.reset": "earliest",
        **o.kafka_config,
    }
    callbacks = {} if on_error is None else {"error_cb": on_error}
    try:
        kafka = KafkaConsumer({**config, **callbacks}, logger=kafka_log)
    except KafkaException as exc:
        raise ConfigError(f"Kafka client settings: {kafka_text(exc)}") from None
    try:
        return kafka, DeadLetters(o, config)
    except ConfigError:
        kafka.close()
        raise


def check_kafka(o: ConsumeOptions) -> None:
    """ConfigError where librdkafka refuses a setting of ``o``; nothing is joined or sent."""
    kafka, _ = kafka_clients(o)
    kafka.close()
