"""The consume loop: Kafka's at-least-once delivery made effectively-once by a store.

Per poll batch, in rounds of distinct keys: a ``runner.Batch`` claims every key in one round
trip, runs the handlers of the keys it holds, completes each as its handler returns (from a
completer thread, while later handlers run) and gives back those not run. This module does
Kafka's part: polling, per-partition order, pausing a partition (seek back, pause, back-off),
dead letters and offsets. What each message is and what each RunResult comes to in Kafka
is the policy's (``consume.policy``, shared with the FastStream middleware); ``acting``
carries its decisions out, the same for batched and transactional mode.

Offsets are stored only for messages that are finished (completed, replayed, skipped, stale
or dead-lettered), in partition order: a partition stops at its first unfinished message,
seeks back to it, and waits (paused) for a back-off. The store being unreachable stops
every partition the same way: fail closed; so does a dead letter the broker refuses.

What stops it on purpose: a Kafka setting librdkafka refuses, or a key template the first
message cannot fill (ConfigError, before anything is claimed); no partitions within
``join_timeout``, or a Kafka client that failed for good (KafkaUnavailable); a dead-letter
storm or ``--on-missing-key stop`` (ConsumeStopped).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from idemctl.consume.acting import Acting
from idemctl.consume.deadletter import DeadLetters, kafka_text
from idemctl.consume.item import Item, Pause, Stop, about, chunks, fields, while_done
from idemctl.consume.options import ConsumeOptions, Summary
from idemctl.consume.policy import (
    MAX_BACKOFF,
    Breaker,
    Keying,
    Refusals,
)
from idemctl.consume.traced import Tracing
from idemctl.consume.watch import Watch, kafka_log, log
from idemctl.drivers import require
from idemctl.errors import (
    ConfigError,
    ConsumeStopped,
    KafkaUnavailable,
    StoreUnavailable,
)
from idemctl.keys import (
    Message,
)
from idemctl.model import ClaimRequest
from idemctl.runner import Batch, Context, Outcome, RunResult
from idemctl.runner.ordering import missing_predecessor

if TYPE_CHECKING:
    from idemctl.consume.event import Handler
    from idemctl.stores.base import Store

HELD, RAN, EXECUTED = Outcome.HELD, Outcome.RAN, Outcome.EXECUTED


class Consumer(Acting, Watch):
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
        self._gap_since: dict[tuple[str, int, int], float] = {}
        """--contiguous: when the partition was first paused at each message whose
        predecessor is missing."""
        self._stop = threading.Event()
        self._counting = threading.Lock()
        self._pool: ThreadPoolExecutor | None = (
            ThreadPoolExecutor(options.concurrency, thread_name_prefix="idemctl-handler")
            if options.concurrency > 1
            else None
        )
        self._paused: dict[tuple[str, int], float] = {}
        self._resume_at: dict[tuple[str, int], int] = {}
        """The offset a paused partition was sought back to: anything else fetched for it
        before that offset comes round again was fetched before the seek."""
        self._kafka: Any = None
        self._dlq: DeadLetters | None = None
        self._refusals = Refusals(options.backoff)
        self._breaker = Breaker(options.dlq_breaker)
        self._storm_tripped: str | None = None
        self._runner = Batch(
            store,
            lease=options.lease,
            permanent=options.permanent_errors,
            max_attempts=options.max_attempts,
            transactional=options.transactional,
            complete_batch=options.complete_batch,
            complete_wait=options.complete_wait,
            logger=log,
        )
        self._handler_timed: Callable[[float], None] | None = None
        self._trace = Tracing.start(store.url, options.trace_keys)

    def timed(self, handler: Callable[[float], None], store: Callable[[str, float], None]) -> None:
        """Tell ``handler`` each handler run's seconds, and ``store`` each claim and
        completion round trip's (``"claim"`` or ``"complete"``, and the seconds)."""
        self._handler_timed = handler
        self._runner.timed = store

    @property
    def in_flight(self) -> int:
        """Keys this consumer holds now (claimed, not yet completed or given back)."""
        return self._runner.in_flight

    def stop(self) -> None:
        """Drain and return (signal-safe): the running handlers finish, their keys are
        completed, the batch's other claims released, offsets stored and committed."""
        self._stop.set()

    # The loop -----------------------------------------------------------------------------

    def open(self) -> None:
        """Build the Kafka clients from the options: a setting librdkafka refuses is a
        ConfigError naming it, before anything is claimed. ``run`` opens them if needed."""
        require("confluent_kafka", "kafka", "consuming Kafka")
        from confluent_kafka import Consumer as KafkaConsumer
        from confluent_kafka import KafkaException

        if self._kafka is not None:
            return
        o = self.options
        config = {
            "bootstrap.servers": o.brokers,
            "group.id": o.group,
            "enable.auto.offset.store": False,  # an offset is stored only once finished
            "enable.auto.commit": True,
            "auto.offset.reset": "earliest",
            **o.kafka_config,
        }
        try:
            kafka = KafkaConsumer({**config, "error_cb": self._on_kafka_error}, logger=kafka_log)
        except KafkaException as exc:
            raise ConfigError(f"Kafka client settings: {kafka_text(exc)}") from None
        try:
            self._dlq = DeadLetters(o, config)
        except ConfigError:
            kafka.close()
            raise
        self._kafka = kafka

    def run(self) -> Summary:
        from confluent_kafka import KafkaException

        o = self.options
        self.open()
        started = self._unassigned_since = self._idle_since = time.monotonic()
        try:
            self._kafka.subscribe(
                o.topics,
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
            while not self._stop.is_set():
                if self._watch(started):
                    break
                self._resume_due()
                want = o.batch_size
                if o.max_messages is not None:  # claim no message that will not run
                    want = min(want, o.max_messages - self.summary.finished)
                fetched = self._kafka.consume(num_messages=want, timeout=o.poll_timeout)
                self._polls += 1
                self._resume_assigned()
                if fetched:
                    self._down_since = None  # the brokers answer
                messages = [m for m in fetched if m.error() is None or not self._error(m)]
                if messages:
                    self._idle_since = time.monotonic()
                    self._batch(messages)
                self._progress()
                if o.max_messages is not None and self.summary.finished >= o.max_messages:
                    break
        except KafkaException as exc:
            raise KafkaUnavailable(
                f"the Kafka client failed: {kafka_text(exc)}; nothing past the finished "
                "messages was committed"
            ) from None
        finally:
            self._progress(force=True)  # where it stood when it stopped consuming
            self._close()
            self._progress(force=True, state="stopped")
        return self.summary

    def _close(self) -> None:
        from confluent_kafka import KafkaException

        self._runner.close()
        if self._pool is not None:
            self._pool.shutdown()
        try:
            self._kafka.commit(asynchronous=False)
        except KafkaException as exc:  # nothing stored since the last commit
            log.debug("final commit: %s", exc)
        try:
            self._kafka.close()
        except (KafkaException, RuntimeError) as exc:
            log.debug("close: %s", exc)
        if self._dlq is not None:
            self._dlq.close()

    # Pausing ------------------------------------------------------------------------------

    def _pause(self, item: Item, seconds: float) -> None:
        """Stop ``item``'s partition at it: seek back, pause, resume after ``seconds``."""
        from confluent_kafka import KafkaException, TopicPartition

        m = item.msg
        tp = TopicPartition(m.topic(), m.partition(), m.offset())
        try:
            self._kafka.pause([tp])
            self._kafka.seek(tp)
        except KafkaException as exc:  # revoked meanwhile: its new owner starts from the commit
            log.debug("hold %s[%d]: %s", m.topic(), m.partition(), kafka_text(exc))
            return
        self._paused[(m.topic(), m.partition())] = time.monotonic() + min(seconds, MAX_BACKOFF)
        self._resume_at[(m.topic(), m.partition())] = m.offset()

    def _resume_due(self) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        now = time.monotonic()
        due = [tp for tp, at in self._paused.items() if at <= now]
        if due:
            for tp in due:
                del self._paused[tp]
            try:
                self._kafka.resume([TopicPartition(t, p) for t, p in due])
            except KafkaException as exc:  # revoked meanwhile
                log.debug("resume: %s", kafka_text(exc))

    # One batch ----------------------------------------------------------------------------

    def _batch(self, messages: list[Any]) -> None:
        by_partition: dict[tuple[str, int], list[Item]] = defaultdict(list)
        for m in messages:
            tp = (m.topic(), m.partition())
            if tp in self._paused:
                continue  # fetched before the partition was paused
            if tp in self._resume_at:
                if m.offset() != self._resume_at[tp]:
                    continue
                del self._resume_at[tp]
            by_partition[tp].append(self._keyed(m, tp))
        # A key twice in one batch: the later copy waits for the next round, after the
        # first is finished (then it replays). So does the rest of its partition, and so
        # does an entity's second event: the first must settle before the guard can judge it.
        pending = [items for items in by_partition.values() if items]
        while pending:
            round_items: list[Item] = []
            seen: set[str] = set()
            entities: set[str] = set()
            later: list[list[Item]] = []
            for items in pending:
                for i, item in enumerate(items):
                    entity = None if item.order is None else item.order.entity
                    if item.key is not None and (item.key in seen or entity in entities):
                        later.append(items[i:])
                        break
                    if item.key is not None:
                        seen.add(item.key)
                        if entity is not None:
                            entities.add(entity)
                    round_items.append(item)
            self._round(round_items)
            if self._storm_tripped is not None:
                raise ConsumeStopped(self._storm_tripped)  # no offset of this batch stored
            if self._stop.is_set():
                break  # draining: later rounds were never claimed
            # A partition that stopped in this round skips the rest of the batch.
            stopped = {i.tp for i in round_items if i.blocked}
            pending = [items for items in later if items[0].tp not in stopped]
        self._store_offsets(list(by_partition.values()))

    def _keyed(self, m: Any, tp: tuple[str, int]) -> Item:
        """The message with its key and fingerprint, or why it has none usable (the
        policy's ``Keying.admit``)."""
        a = self._keying.admit(Message(tp[0], tp[1], m.offset(), m.value(), m.headers() or ()))
        return Item(m, tp, m.offset(), a.key, a.fingerprint, a.bad, order=a.order)

    def _round(self, items: list[Item]) -> None:
        """Claim, run and complete ``items`` (distinct keys), partitions in order, side by
        side with ``concurrency``. The claims go in chunks of the store's ``claim_chunk``
        keys, each answered while the handlers of the chunk before it run."""
        o = self.options
        blocked: dict[tuple[str, int], int] = {}
        """Each paused partition's offset: it goes on from there after the back-off."""

        def usable(item: Item) -> bool:
            """Not behind a message its partition is paused at."""
            at = blocked.get(item.tp)
            return at is None or item.offset < at

        def block(item: Item, wait: Pause) -> None:
            item.blocked = True
            blocked[item.tp] = item.offset
            self._count(wait[1])
            self._pause(item, wait[0])

        claimed: dict[str, RunResult] = {}

        def release(part: list[Item]) -> None:
            """Give back the claims of messages that will not run now."""
            for item in part:
                if item.key is not None and claimed[item.key].outcome is HELD:
                    self._runner.give_back(item.key)

        def run_partition(part: list[Item]) -> Stop:
            """One partition's messages in order; stops at the first that must wait, on
            stop() (SIGTERM: the handler in hand finishes, no more) or a tripped breaker."""
            for i, item in enumerate(part):
                if self._stop.is_set() or self._storm_tripped is not None:
                    release(part[i:])
                    return None
                wait = self._process(item, claimed.get(item.key) if item.key else None)
                if wait is not None:
                    release(part[i + 1 :])  # behind a stopped message: not now
                    return item, wait
            return None

        asks = self._runner.start_round(
            [ClaimRequest(i.key, i.fingerprint) for i in items if i.key is not None],
            [i.order for i in items if i.key is not None] if self._keying.ordered else (),
        )
        parts = chunks(items, [len(ask.requests) for ask in asks])
        taken = 0
        try:
            for chunk, ask in zip(parts, asks, strict=True):
                if self._stop.is_set() or self._storm_tripped is not None:
                    break
                taken += 1
                try:
                    claimed.update((r.key, r) for r in ask.take())
                    if self._trace is not None:
                        for item in chunk:
                            item.claim_ns = ask.sent
                except StoreUnavailable as exc:
                    log.warning(
                        "store unavailable, holding every partition: %s",
                        exc,
                        extra=fields(outcome="store_unavailable"),
                    )
                    for item in (i for later in parts[taken - 1 :] for i in later):
                        if usable(item):
                            block(item, (o.backoff, "store_unavailable"))
                    break
                release([i for i in chunk if not usable(i)])
                for stop in self._side_by_side(run_partition, [i for i in chunk if usable(i)]):
                    if stop is not None:
                        block(*stop)
        finally:  # chunks sent but not run now are given back; every completion answered
            completed = self._runner.end_round()
        self._completed(items, completed, usable, block)

    def _side_by_side(
        self, run_partition: Callable[[list[Item]], Stop], items: list[Item]
    ) -> list[Stop]:
        """``run_partition`` on each partition's items, side by side with ``concurrency``."""
        partitions: dict[tuple[str, int], list[Item]] = defaultdict(list)
        for item in items:
            partitions[item.tp].append(item)
        parts = list(partitions.values())
        if self._pool is not None and len(parts) > 1:
            return list(self._pool.map(run_partition, parts))
        return [run_partition(part) for part in parts]

    def _completed(
        self,
        items: list[Item],
        completed: list[RunResult],
        usable: Callable[[Item], bool],
        block: Callable[[Item, Pause], None],
    ) -> None:
        """The round's completions answered: executed ones are finished; one that failed
        pauses its partition at its message, even where a later message of it stopped the
        partition already: nothing past it may be stored."""
        keyed = {i.key: i for i in items if i.key is not None}
        failed = []
        for result in completed:
            if result.outcome is EXECUTED:
                item = keyed[result.key]
                item.done, item.outcome = True, EXECUTED.value
            else:
                failed.append(result)
        self._count(EXECUTED.value, len(completed) - len(failed))
        for result in sorted(failed, key=lambda r: keyed[r.key].offset):
            item = keyed[result.key]
            if usable(item):
                wait = self._act(item, result)
                if wait is not None:
                    block(item, wait)
        if self._trace is not None:
            for result in completed:
                item = keyed[result.key]
                if item.span is not None:
                    self._trace.completed(item.span, item.ran_ns, result)
                    self._trace.end(item.span, item.outcome or result.outcome.value)
                    item.span = None

    def _process(self, item: Item, claimed: RunResult | None) -> Pause | None:
        """Run a held key's handler; then what its result comes to. With tracing, inside
        the message's process span, which ends here unless a completion is on its way."""
        trace = self._trace
        if trace is None:
            return self._handle(item, claimed)
        item.span = trace.begin(item.msg, item.key, claimed, item.claim_ns)
        try:
            wait = self._handle(item, claimed)
        except BaseException as exc:
            item.span.record_exception(exc)
            trace.end(item.span, None)
            raise
        if item.done or wait is not None:
            trace.end(item.span, item.outcome if wait is None else wait[1])
            item.span = None
        return wait

    def _handle(self, item: Item, claimed: RunResult | None) -> Pause | None:
        if claimed is None:
            return self._unusable(item)
        if claimed.outcome is not HELD:
            return self._act(item, claimed)
        if self.options.contiguous and item.order is not None:
            wait = self._gap(item, claimed)
            if wait is not None:
                return wait
        event = self._event(item)
        timed = self._handler_timed

        def call(ctx: Context) -> Any:
            if timed is None:
                return self.handler(event, ctx)
            started = time.perf_counter()
            try:
                return self.handler(event, ctx)
            finally:
                timed(time.perf_counter() - started)

        if self._trace is None:
            ran = self._runner.run(claimed.key, call)
        else:
            with self._trace.run(item.span) as span:
                ran = self._runner.run(claimed.key, call)
                self._trace.ran(span, ran)
            item.ran_ns = time.time_ns()
        return None if ran.outcome is RAN else self._act(item, ran)  # RAN: completion on its way

    def _gap(self, item: Item, claimed: RunResult) -> Pause | None:
        """--contiguous: pause the partition at an event whose predecessor is not applied
        yet, the busy path's way, until ``gap_timeout`` has passed since it was first
        paused; then it runs (a gap counted)."""
        assert item.order is not None
        m = item.msg
        at = (m.topic(), m.partition(), m.offset())
        last = claimed.last
        if self.options.transactional:  # the guard is asked inside the transaction
            last = self._runner.last_applied(item.order.entity)
        if not missing_predecessor(item.order, last):
            self._gap_since.pop(at, None)
            return None
        now = time.monotonic()
        since = self._gap_since.setdefault(at, now)
        if now - since < self.options.gap_timeout:
            self._runner.give_back(claimed.key)
            left = self.options.gap_timeout - (now - since)
            return min(self.options.backoff, left), "gap_wait"
        del self._gap_since[at]
        self._count("gaps")
        log.warning(
            "%s[%d]@%d: entity %r applied up to %s, not %d; applying %d after waiting "
            "%.1fs (--gap-timeout)",
            m.topic(),
            m.partition(),
            m.offset(),
            item.order.entity,
            last,
            item.order.sequence - 1,
            item.order.sequence,
            now - since,
            extra=about(item, "gaps", entity=item.order.entity, sequence=item.order.sequence),
        )
        return None

    def _store_offsets(self, partitions: list[list[Item]]) -> None:
        """For each partition, the offset after its last finished message before the
        first unfinished one (which it was sought back to)."""
        from confluent_kafka import KafkaException, TopicPartition

        offsets = []
        for items in partitions:
            finished = while_done(items)
            if finished:
                m = finished[-1].msg
                offsets.append(TopicPartition(m.topic(), m.partition(), m.offset() + 1))
        if offsets:
            try:
                self._kafka.store_offsets(offsets=offsets)
            except KafkaException as exc:  # revoked meanwhile: the new owner goes on
                log.debug("store offsets: %s", kafka_text(exc))
