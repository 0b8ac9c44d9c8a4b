"""The consume loop: Kafka's at-least-once delivery made effectively-once by a store.

Per poll batch: claim every key in one round trip (``claim_many``), run the handlers of the
keys acquired, and complete each as soon as its handler returns: a completer thread sends
finished keys' completions (``complete_many``) while later handlers run, so a consumer killed
mid-batch repeats only the handlers it was running and the few completions not yet sent.
Once every completion of the round is acknowledged, offsets are stored.
Offsets are stored only for messages that are finished (completed, replayed or
dead-lettered), in partition order: a partition stops at its first unfinished message,
seeks back to it, and waits (paused) for a back-off. The store being unreachable stops
every partition the same way: fail closed.

What stops it on purpose: a Kafka setting librdkafka refuses, or a key template the first
message cannot fill (ConfigError, before anything is claimed); no partitions within
``join_timeout`` (KafkaUnavailable); a dead-letter storm (ConsumeStopped).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from idemctl.consume.event import Event
from idemctl.errors import (
    AttemptsExhausted,
    ConfigError,
    ConsumeAborted,
    ConsumeStopped,
    IdemctlError,
    InvalidKey,
    InvalidPayload,
    KafkaUnavailable,
    StoreUnavailable,
)
from idemctl.keys import DEFAULT_KEY_STRATEGY, Message, MissingField, MissingKey, key_strategy
from idemctl.model import (
    Acquired,
    Busy,
    ClaimRequest,
    Completed,
    Completion,
    Failed,
    Mismatch,
    fingerprint,
)
from idemctl.runner import Context, invoke

if TYPE_CHECKING:
    from idemctl.consume.event import Handler
    from idemctl.stores.base import Store

log = logging.getLogger("idemctl.consume")
kafka_log = logging.getLogger("idemctl.consume.kafka")
"""librdkafka's own log lines (connection retries and the like)."""

MAX_BACKOFF = 60.0
PROGRESS_EVERY = 0.25
"""Seconds between two progress reports (the live view, the benchmark's marks)."""
DOWN_LOG_EVERY = 60.0
"""Seconds between two warnings while the brokers stay unreachable."""
PROBE_EVERY = 5.0
"""Seconds between two metadata requests that tell whether lost brokers are back."""
_SHARED = ("bootstrap.servers", "security.", "sasl.", "ssl.", "client.", "socket.", "broker.")


@dataclass
class ConsumeOptions:
    brokers: str
    topics: list[str]
    group: str
    key: str = DEFAULT_KEY_STRATEGY
    on_missing_key: str = "dlq"
    """For a message without a usable key (none, or one ``validate_key`` refuses) or with a
    payload the fingerprint or the key template cannot read: dlq: dead-letter it; offset: use
    topic-partition-offset as its key; skip: pass it by (its offset is stored); stop (or
    fail): stop the consumer without storing its offset."""
    lease: float | None = None
    max_attempts: int = 5
    backoff: float = 1.0
    """Seconds before the first retry; doubled each attempt, at most 60 s."""
    dlq_topic: str | None = None
    """Default: ``<topic>.dlq`` for each input topic."""
    batch_size: int = 100
    complete_batch: int = 20
    """Completions the completer sends in one round trip at most before it stops waiting."""
    complete_wait: float = 0.005
    """Seconds a finished key's completion waits for others to go with it, at most: with
    ``complete_batch``, what a SIGKILL can cost beyond the handlers it cuts off."""
    concurrency: int = 1
    """Partitions whose handlers run side by side (each partition's in order), for
    handlers that wait on I/O."""
    max_messages: int | None = None
    exit_when_idle: float | None = None
    kafka_config: dict[str, str] = field(default_factory=dict)
    permanent_errors: tuple[type[BaseException], ...] = ()
    transactional: bool = False
    """PostgreSQL: claim, the handler's SQL on ``ctx.connection`` and completion commit in
    one transaction, a message at a time (no batched round trips)."""
    poll_timeout: float = 0.5
    join_timeout: float = 60.0
    """Seconds from the start to the first partition, else KafkaUnavailable (0: wait for
    ever). Under ``exit_when_idle`` also how long lost brokers are waited for, and how long
    a member left without partitions waits for some before it exits."""
    dlq_breaker: int = 20
    """Stop (ConsumeStopped) when this many messages in a row are dead-lettered for the same
    reason: a storm says the consumer is misconfigured, not that the messages are bad.
    0: never."""

    def __post_init__(self) -> None:
        if self.on_missing_key not in ("dlq", "offset", "skip", "stop", "fail"):
            raise ConfigError(
                f"--on-missing-key {self.on_missing_key!r}: use dlq, offset, skip or stop"
            )
        if min(self.max_attempts, self.batch_size, self.concurrency, self.complete_batch) < 1:
            raise ConfigError(
                "--max-attempts, --batch-size, --complete-batch and --concurrency must be at "
                "least 1"
            )
        if self.complete_wait < 0:
            raise ConfigError("--complete-wait cannot be negative")
        if self.dlq_breaker < 0 or self.join_timeout < 0:
            raise ConfigError("--dlq-breaker and --join-timeout cannot be negative")
        key_strategy(self.key)  # fails early on a bad strategy


@dataclass
class Summary:
    """What a run did, message by message, and where it stands now."""

    counts: Counter[str] = field(default_factory=Counter)
    """executed, replayed, dead_lettered, skipped, retried, busy, store_unavailable,
    lease_lost"""
    dead_letters: Counter[str] = field(default_factory=Counter)
    """Dead letters by reason (no idempotency key, invalid idempotency key, ...)."""
    paused: int = 0
    """Partitions held now (busy keys, retries, an unreachable store)."""
    partitions: int = 0
    """Partitions assigned to this consumer now."""
    state: str = "starting"
    """joining group, consuming, no partitions assigned, brokers unreachable for ..., stopped"""
    lag: int | None = None
    """Messages behind the end of the assigned partitions, where the broker reports it."""

    @property
    def finished(self) -> int:
        return self.counts["executed"] + self.counts["replayed"] + self.counts["dead_lettered"]


@dataclass
class _Item:
    msg: Any  # confluent_kafka.Message
    key: str | None = None
    fingerprint: str | None = None
    bad: tuple[str, str] | None = None
    """Why the message cannot be claimed (reason, detail): it goes to the dead-letter topic,
    or is skipped."""
    done: bool = False
    blocked: bool = False


class Consumer:
    """Runs ``handler`` for each message of ``options.topics``, effectively once per key."""

    def __init__(
        self,
        store: Store,
        handler: Handler,
        options: ConsumeOptions,
        *,
        on_progress: Callable[[Summary], None] | None = None,
    ) -> None:
        self.store, self.handler, self.options = store, handler, options
        self.summary = Summary()
        self._strategy = key_strategy(options.key)
        self._offset_strategy = key_strategy("offset")
        self._stop = threading.Event()
        self._counting = threading.Lock()
        self._pool: ThreadPoolExecutor | None = (
            ThreadPoolExecutor(options.concurrency, thread_name_prefix="idemctl-handler")
            if options.concurrency > 1
            else None
        )
        self._paused: dict[tuple[str, int], float] = {}
        self._resume_at: dict[tuple[str, int], int] = {}
        """The offset a held partition was sought back to: anything else fetched for it
        before that offset comes round again was fetched before the seek."""
        self._on_progress = on_progress
        self._kafka: Any = None
        self._producer: Any = None
        self._partitions: set[tuple[str, int]] = set()
        """Assigned now: idle time counts only while there are some (item of a drain)."""
        self._joined = self._ever_assigned = False
        self._unassigned_since = self._idle_since = time.monotonic()
        self._down_since: float | None = None
        """When librdkafka said every broker was down; None while they answer."""
        self._kafka_error = ""
        """librdkafka's last error, for the line that says why the consumer stops."""
        self._fatal: Any = None
        self._warned_down = self._probed = self._progressed = 0.0
        self._storm_reason: str | None = None
        self._storm = 0
        self._storm_tripped: str | None = None
        self._first_keyed = False

    def stop(self) -> None:
        """Drain and return (signal-safe): the running handlers finish, their keys are
        completed, the batch's other claims released, offsets stored and committed."""
        self._stop.set()

    def _count(self, outcome: str) -> None:
        with self._counting:
            self.summary.counts[outcome] += 1
            if outcome in ("executed", "replayed"):
                self._storm_reason, self._storm = None, 0

    # The loop -----------------------------------------------------------------------------

    def open(self) -> None:
        """Build the Kafka clients from the options: a setting librdkafka refuses is a
        ConfigError naming it, before anything is claimed. ``run`` opens them if needed."""
        from confluent_kafka import Consumer as KafkaConsumer
        from confluent_kafka import KafkaException, Producer

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
        # The dead-letter producer shares the connection settings (SASL, SSL), no more.
        producer_config = {k: v for k, v in config.items() if k.startswith(_SHARED)}
        try:
            self._kafka = KafkaConsumer(
                {**config, "error_cb": self._on_kafka_error}, logger=kafka_log
            )
            self._producer = Producer(
                {**producer_config, "enable.idempotence": True}, logger=kafka_log
            )
        except KafkaException as exc:
            if self._kafka is not None:
                self._kafka.close()
                self._kafka = None
            raise ConfigError(f"Kafka client settings: {_kafka_text(exc)}") from None

    def run(self) -> Summary:
        o = self.options
        self.open()
        self._kafka.subscribe(
            o.topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        lease = self.store.default_lease if o.lease is None else o.lease
        self._heartbeat = _Heartbeat(self.store, lease)
        self._heartbeat.start()
        self._completer = _Completer(
            self.store, o.complete_batch, o.complete_wait, self._heartbeat.done
        )
        started = self._unassigned_since = self._idle_since = time.monotonic()
        try:
            while not self._stop.is_set():
                if self._watch(started):
                    break
                self._resume_due()
                want = o.batch_size
                if o.max_messages is not None:  # claim no message that will not run
                    want = min(want, o.max_messages - self.summary.finished)
                fetched = self._kafka.consume(num_messages=want, timeout=o.poll_timeout)
                if fetched:
                    self._down_since = None  # the brokers answer
                messages = [m for m in fetched if not self._error(m)]
                if messages:
                    self._idle_since = time.monotonic()
                    self._batch(messages)
                self._progress()
                if o.max_messages is not None and self.summary.finished >= o.max_messages:
                    break
        finally:
            self._progress(force=True)  # where it stood when it stopped consuming
            self._close()
            self._progress(force=True, state="stopped")
        return self.summary

    def _close(self) -> None:
        from confluent_kafka import KafkaException

        self._heartbeat.stop()
        self._completer.stop()
        if self._pool is not None:
            self._pool.shutdown()
        try:
            self._kafka.commit(asynchronous=False)
        except KafkaException as exc:  # nothing stored since the last commit
            log.debug("final commit: %s", exc)
        self._kafka.close()
        self._producer.flush(10)

    # Is Kafka there, and is there work? ---------------------------------------------------

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
            if o.join_timeout and now - started >= o.join_timeout:
                raise KafkaUnavailable(self._no_partitions(now - started))
            return False
        if o.exit_when_idle is None:
            return False
        if not self._partitions:
            # Between a revoke and the next assignment, or left without partitions: idling
            # does not count; a member left out for join_timeout has nothing to drain.
            self._idle_since = now
            if o.join_timeout and now - self._unassigned_since >= o.join_timeout:
                log.warning(
                    "no partitions assigned for %.0fs: the other members of group %s hold "
                    "them all; exiting (--exit-when-idle)", now - self._unassigned_since, o.group,
                )  # fmt: skip
                return True
            return False
        if self._paused or self._down_since is not None:
            self._idle_since = now  # held or cut off is not drained
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
                "meanwhile", o.brokers, down, self._kafka_error or "no answer",
            )  # fmt: skip
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
            self._ever_assigned and o.exit_when_idle is not None and o.join_timeout
            and down >= o.join_timeout
        ):  # fmt: skip
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
        summary = self.summary
        summary.paused = len(self._paused)
        summary.partitions = len(self._partitions)
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
        self._joined = True
        self._down_since = None  # a group coordinator answered
        self._partitions |= {(p.topic, p.partition) for p in partitions}
        if self._partitions:
            self._ever_assigned = True
        self._idle_since = time.monotonic()

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        # Handlers run between polls, so nothing is in flight here: commit what is stored.
        from confluent_kafka import KafkaException

        self._forget_partitions(partitions)
        try:
            consumer.commit(asynchronous=False)
        except KafkaException as exc:
            log.debug("commit on revoke: %s", exc)

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        self._forget_partitions(partitions)  # another member owns them now: commit nothing

    def _forget_partitions(self, partitions: list[Any]) -> None:
        for p in partitions:
            tp = (p.topic, p.partition)
            self._paused.pop(tp, None)
            self._resume_at.pop(tp, None)
            self._partitions.discard(tp)
        now = time.monotonic()
        self._idle_since = now
        if not self._partitions:
            self._unassigned_since = now

    # Pausing ------------------------------------------------------------------------------

    def _hold(self, item: _Item, seconds: float) -> None:
        """Stop ``item``'s partition at it: seek back, pause, resume after ``seconds``."""
        from confluent_kafka import TopicPartition

        m = item.msg
        tp = TopicPartition(m.topic(), m.partition(), m.offset())
        self._kafka.pause([tp])
        self._kafka.seek(tp)
        self._paused[(m.topic(), m.partition())] = time.monotonic() + min(seconds, MAX_BACKOFF)
        self._resume_at[(m.topic(), m.partition())] = m.offset()

    def _resume_due(self) -> None:
        from confluent_kafka import TopicPartition

        now = time.monotonic()
        due = [tp for tp, at in self._paused.items() if at <= now]
        if due:
            self._kafka.resume([TopicPartition(t, p) for t, p in due])
            for tp in due:
                del self._paused[tp]

    # One batch ----------------------------------------------------------------------------

    def _batch(self, messages: list[Any]) -> None:
        by_partition: dict[tuple[str, int], list[_Item]] = defaultdict(list)
        for m in messages:
            tp = (m.topic(), m.partition())
            if tp in self._paused:
                continue  # fetched before the partition was held
            if tp in self._resume_at:
                if m.offset() != self._resume_at[tp]:
                    continue
                del self._resume_at[tp]
            by_partition[tp].append(self._keyed(m))
        # A key twice in one batch: the later copy waits for the next round, after the
        # first is finished (then it replays). So does the rest of its partition.
        pending = [items for items in by_partition.values() if items]
        while pending:
            round_items: list[_Item] = []
            seen: set[str] = set()
            later: list[list[_Item]] = []
            for items in pending:
                for i, item in enumerate(items):
                    if item.key is not None and item.key in seen:
                        later.append(items[i:])
                        break
                    if item.key is not None:
                        seen.add(item.key)
                    round_items.append(item)
            self._round(round_items)
            if self._storm_tripped is not None:
                raise ConsumeStopped(self._storm_tripped)  # no offset of this batch stored
            if self._stop.is_set():
                break  # draining: later rounds were never claimed
            # A partition that stopped in this round skips the rest of the batch.
            stopped = {self._tp(i) for i in round_items if i.blocked}
            pending = [items for items in later if self._tp(items[0]) not in stopped]
        self._store_offsets(list(by_partition.values()))

    @staticmethod
    def _tp(item: _Item) -> tuple[str, int]:
        return item.msg.topic(), item.msg.partition()

    def _keyed(self, m: Any) -> _Item:
        """The message with its key and fingerprint, or why it has none usable: a bad
        message goes to the dead-letter topic (or ``on_missing_key``); a key template the
        very first message cannot fill stops the consumer."""
        message = Message(m.topic(), m.partition(), m.offset(), m.value(), m.headers() or ())
        first, self._first_keyed = not self._first_keyed, True
        o = self.options
        try:
            key = self._strategy(message)
            return _Item(m, key=key, fingerprint=_fingerprint(m.value()))
        except (InvalidKey, InvalidPayload) as exc:
            if first and isinstance(exc, MissingField) and o.on_missing_key == "dlq":
                raise ConfigError(
                    f"--key {o.key} cannot work: the first message, "
                    f"{m.topic()}[{m.partition()}]@{m.offset()}, is a JSON object but {exc}; "
                    "stopping before anything is claimed or dead-lettered"
                ) from None
            reason = (
                "no idempotency key" if isinstance(exc, MissingKey)
                else "invalid idempotency key" if isinstance(exc, InvalidKey)
                else "unreadable payload"
            )  # fmt: skip
            if o.on_missing_key == "offset":
                try:
                    fp = _fingerprint(m.value())
                except InvalidPayload:
                    fp = None  # the offset is the key: nothing to compare it with
                return _Item(m, key=self._offset_strategy(message), fingerprint=fp)
            if o.on_missing_key in ("stop", "fail"):
                raise ConsumeAborted(
                    f"message {m.topic()}[{m.partition()}]@{m.offset()}: {reason} ({exc}); "
                    f"stopping (--on-missing-key {o.on_missing_key})"
                ) from None
            return _Item(m, bad=(reason, str(exc)))

    def _round(self, items: list[_Item]) -> None:
        """Claim, run and complete ``items`` (distinct keys), partitions in order."""
        if self.options.transactional:
            self._round_transactional(items)
            return
        o = self.options
        blocked: dict[tuple[str, int], int] = {}
        """Each held partition's offset: it goes on from there after the back-off."""

        def usable(item: _Item) -> bool:
            """Not behind a message its partition is held at."""
            at = blocked.get(self._tp(item))
            return at is None or item.msg.offset() < at

        def block(item: _Item, seconds: float, why: str) -> None:
            item.blocked = True
            blocked[self._tp(item)] = item.msg.offset()
            self._count(why)
            self._hold(item, seconds)

        keyed = [i for i in items if i.key is not None]
        try:
            outcomes = self.store.claim_many(
                [ClaimRequest(i.key, i.fingerprint) for i in keyed],  # type: ignore[arg-type]
                o.lease,
            )
        except StoreUnavailable as exc:
            log.warning("store unavailable, holding every partition: %s", exc)
            for item in items:
                if usable(item):
                    block(item, o.backoff, "store_unavailable")
            return
        claimed = dict(zip((id(i) for i in keyed), outcomes, strict=True))
        self._heartbeat.hold([a for a in outcomes if isinstance(a, Acquired)])
        try:
            self._settle_round(items, claimed, usable, block)
        finally:
            self._heartbeat.clear()

    def _settle_round(
        self,
        items: list[_Item],
        claimed: dict[int, Any],
        usable: Callable[[_Item], bool],
        block: Callable[[_Item, float, str], None],
    ) -> None:
        o = self.options
        partitions: dict[tuple[str, int], list[_Item]] = defaultdict(list)
        for item in items:
            partitions[self._tp(item)].append(item)

        def release_from(part: list[_Item], i: int) -> None:
            for later in part[i:]:  # not run now: give their claims back
                held = claimed.get(id(later))
                if isinstance(held, Acquired):
                    self._release(held)

        def work(part: list[_Item]) -> tuple[Any, ...]:
            """One partition's messages in order, each completion handed to the completer
            as its handler returns; stops at the first that must wait, or on stop()."""
            for i, item in enumerate(part):
                if self._stop.is_set():  # SIGTERM: finish the handler in hand, no more
                    release_from(part, i)
                    return ()
                try:
                    wait = self._settle(item, claimed.get(id(item)))
                except StoreUnavailable as exc:  # recording a failure: fail closed
                    log.warning("store unavailable, will retry: %s", exc)
                    wait = (o.backoff, "store_unavailable")
                if isinstance(wait, Completion):
                    self._completer.put(item, wait)
                elif wait is not None:
                    release_from(part, i + 1)  # behind a stopped message: not now
                    return (item, *wait)
            return ()

        parts = list(partitions.values())
        try:
            if self._pool is not None and len(parts) > 1:  # partitions side by side
                stops = list(self._pool.map(work, parts))
            else:
                stops = [work(part) for part in parts]
        finally:
            acknowledged = self._completer.drain()  # every completion handed over, answered
        for stop in stops:
            if stop:
                block(*stop)
        # A completion that failed holds its partition at that message, even where a later
        # message of it stopped the partition already: nothing past it may be stored.
        for item, answer in sorted(acknowledged, key=lambda done: done[0].msg.offset()):
            if answer is True:
                item.done = True
                self._count("executed")
                continue
            if not usable(item):
                continue
            if isinstance(answer, StoreUnavailable):
                log.warning("store unavailable at completion, will retry: %s", answer)
                block(item, o.backoff, "store_unavailable")
            else:
                block(item, o.backoff, "lease_lost")

    def _round_transactional(self, items: list[_Item]) -> None:
        """Each message in a transaction of its own: its effects commit with its key."""
        o = self.options
        stopped: set[tuple[str, int]] = set()
        for item in items:
            if self._tp(item) in stopped:
                continue
            if self._storm_tripped is not None:
                return
            if item.key is None:
                self._unusable(item)
                continue
            try:
                wait = self._run_transactional(item)
            except StoreUnavailable as exc:
                log.warning("store unavailable, will retry: %s", exc)
                wait = (o.backoff, "store_unavailable")
            if wait is not None:
                item.blocked = True
                stopped.add(self._tp(item))
                self._count(wait[1])
                self._hold(item, wait[0])

    def _run_transactional(self, item: _Item) -> tuple[float, str] | None:
        from idemctl.runner import Outcome, run

        event = self._event(item)
        assert item.key is not None
        result = run(
            self.store, item.key, lambda ctx: self.handler(event, ctx),
            fingerprint=item.fingerprint, lease=self.options.lease,
            permanent=self.options.permanent_errors, transactional=True,
            max_attempts=self.options.max_attempts, logger=log,
        )  # fmt: skip
        match result.outcome:
            case Outcome.EXECUTED | Outcome.REPLAYED:
                item.done = True
                self._count(result.outcome.value)
            case Outcome.BUSY | Outcome.LEASE_LOST:
                return self.options.backoff, result.outcome.value
            case Outcome.MISMATCH:
                self._mismatch(item)
            case Outcome.FAILED:
                self._failed_before(item, result.record)
            case Outcome.ERROR:
                assert result.error is not None
                wait = self._failure(item, result.error, result.retriable, result.attempt or 1)
                return None if wait is None else (wait, "retried")
        return None

    def _unusable(self, item: _Item) -> None:
        """A message that cannot be claimed: dead-lettered, or passed by (``skip``)."""
        assert item.bad is not None
        reason, detail = item.bad
        if self.options.on_missing_key != "skip":
            self._dead_letter(item, reason, detail)
            return
        item.done = True
        self._count("skipped")
        m = item.msg
        log.warning(
            "skipped %s[%d]@%d: %s: %s (--on-missing-key skip)",
            m.topic(), m.partition(), m.offset(), reason, detail,
        )  # fmt: skip

    def _mismatch(self, item: _Item) -> None:
        detail = f"key {item.key!r} was seen before with another payload"
        self._dead_letter(item, "fingerprint mismatch", detail)

    def _failed_before(self, item: _Item, record: Any) -> None:
        self._dead_letter(item, "failed before", (record.error if record else None) or "")

    def _failure(
        self, item: _Item, exc: BaseException, retriable: bool, attempt: int
    ) -> float | None:
        """A handler failed on its ``attempt``-th run (or was not run again: AttemptsExhausted):
        seconds before the retry, or None when the message went to the dead-letter topic."""
        error = f"{type(exc).__name__}: {exc}"
        most = self.options.max_attempts
        if isinstance(exc, AttemptsExhausted) or (retriable and attempt >= most):
            self._dead_letter(item, f"failed {most} times", error, exc)
            return None
        if not retriable:
            self._dead_letter(item, "permanent failure", error, exc)
            return None
        log.info("%s failed (attempt %d), retrying: %s", item.key, attempt, error)
        return float(self.options.backoff * 2 ** (attempt - 1))

    @staticmethod
    def _event(item: _Item) -> Event:
        m = item.msg
        kind, timestamp = m.timestamp()
        return Event(
            m.topic(), m.partition(), m.offset(), m.key(), m.value(), tuple(m.headers() or ()),
            timestamp if kind else None,
        )  # fmt: skip

    def _settle(self, item: _Item, outcome: Any) -> Completion | tuple[float, str] | None:
        """What a claim outcome comes to: a completion to make; a back-off (seconds, why)
        before the partition goes on from this message; or None when it is finished."""
        if item.key is None:
            self._unusable(item)
        elif isinstance(outcome, Completed):
            item.done = True
            self._count("replayed")
        elif isinstance(outcome, Busy):
            return self.options.backoff, "busy"
        elif isinstance(outcome, Mismatch):
            self._mismatch(item)
        elif isinstance(outcome, Failed):
            self._failed_before(item, outcome.record)
        else:
            assert isinstance(outcome, Acquired)
            result = self._run(item, outcome)
            return (result, "retried") if isinstance(result, float) else result
        return None

    def _run(self, item: _Item, acquired: Acquired) -> Completion | float | None:
        """The handler's completion; seconds to wait before a retry; or None when the
        message was dead-lettered."""
        event = self._event(item)

        def call(ctx: Context) -> Any:
            return self.handler(event, ctx)

        did = invoke(
            self.store, acquired, call, lease=self.options.lease,
            permanent=self.options.permanent_errors, heartbeat=False,
            max_attempts=self.options.max_attempts, logger=log,
        )  # fmt: skip
        if did.lease_lost is not None:
            return self.options.backoff
        if did.error is None:
            return Completion(acquired.key, acquired.owner, acquired.fencing_token, did.value)
        return self._failure(item, did.error, did.retriable, acquired.attempt)

    def _release(self, acquired: Acquired) -> None:
        """Give back a claim whose handler did not run: its attempt is not counted, so
        --max-attempts counts runs."""
        try:
            self.store.release(
                acquired.key, acquired.owner, acquired.fencing_token, handler_ran=False
            )
        except IdemctlError as exc:  # its lease runs out by itself
            log.debug("release %s: %s", acquired.key, exc)

    # Dead letters and offsets -------------------------------------------------------------

    def _dead_letter(
        self, item: _Item, reason: str, detail: str, exc: BaseException | None = None
    ) -> None:
        """Produce the message to the dead-letter topic and wait for the broker's ack;
        only then is it finished (and its offset may be stored). The ``dlq_breaker``-th in a
        row for one reason trips the breaker: the round ends and the consumer stops."""
        if self._storm_tripped is not None:
            return  # left unfinished: the consumer stops before storing its offset
        m = item.msg
        topic = self.options.dlq_topic or f"{m.topic()}.dlq"
        headers = [
            *(m.headers() or ()),
            # Spring Kafka's names and encodings, so Java tools read them.
            ("kafka_dlt-original-topic", m.topic().encode()),
            ("kafka_dlt-original-partition", m.partition().to_bytes(4, "big", signed=True)),
            ("kafka_dlt-original-offset", m.offset().to_bytes(8, "big", signed=True)),
            ("kafka_dlt-original-consumer-group", self.options.group.encode()),
            ("kafka_dlt-exception-fqcn", _fqcn(exc).encode()),
            ("kafka_dlt-exception-message", f"{reason}: {detail}".encode()[:4000]),
            ("idemctl-dlt-reason", reason.encode()),
        ]
        delivered: list[Any] = []
        self._producer.produce(
            topic, value=m.value(), key=m.key(), headers=headers,
            on_delivery=lambda err, _msg: delivered.append(err),
        )  # fmt: skip
        self._producer.flush(30)
        if not delivered or delivered[0] is not None:
            raise ConsumeAborted(
                f"could not dead-letter {m.topic()}[{m.partition()}]@{m.offset()} to "
                f"{topic}: {delivered[0] if delivered else 'no acknowledgement'}"
            )
        item.done = True
        self._count("dead_lettered")
        with self._counting:
            self.summary.dead_letters[reason] += 1
        log.warning(
            "dead-lettered %s[%d]@%d to %s: %s: %s",
            m.topic(), m.partition(), m.offset(), topic, reason, detail,
        )  # fmt: skip
        self._storm_count(reason, detail, topic)

    def _storm_count(self, reason: str, detail: str, topic: str) -> None:
        breaker = self.options.dlq_breaker
        with self._counting:
            if reason != self._storm_reason:
                self._storm_reason, self._storm = reason, 0
            self._storm += 1
            if breaker and self._storm >= breaker and self._storm_tripped is None:
                self._storm_tripped = (
                    f"{self._storm} messages in a row were dead-lettered for the same reason "
                    f"({reason}: {detail}); stopping (--dlq-breaker {breaker}): they are in "
                    f"{topic}, and the offsets of this last batch were not committed. Fix the "
                    "cause (often --key or the handler) and start again"
                )

    def _store_offsets(self, partitions: list[list[_Item]]) -> None:
        """For each partition, the offset after its last finished message before the
        first unfinished one (which it was sought back to)."""
        from confluent_kafka import TopicPartition

        offsets = []
        for items in partitions:
            finished = [i for i in _while_done(items)]
            if finished:
                m = finished[-1].msg
                offsets.append(TopicPartition(m.topic(), m.partition(), m.offset() + 1))
        if offsets:
            self._kafka.store_offsets(offsets=offsets)


def _while_done(items: list[_Item]) -> list[_Item]:
    out = []
    for item in items:
        if not item.done:
            break
        out.append(item)
    return out


class _Heartbeat(threading.Thread):
    """One thread for the whole consumer: while a round's handlers run, every lease/3 it
    extends the leases of the keys the round holds and has not finished, so a slow round
    does not let them lapse. A round that ends within lease/3 costs it nothing."""

    def __init__(self, store: Store, lease: float) -> None:
        super().__init__(name="idemctl-heartbeat", daemon=True)
        self.store, self.lease = store, lease
        self._held: dict[str, Acquired] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False

    def hold(self, acquired: list[Acquired]) -> None:
        with self._lock:
            self._held = {a.key: a for a in acquired}

    def done(self, keys: list[str]) -> None:
        """Completed: their leases need no more extending."""
        with self._lock:
            for key in keys:
                self._held.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._held = {}

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        self.join(5)

    def run(self) -> None:
        interval = self.lease / 3
        while not self._wake.wait(interval) and not self._stopped:
            with self._lock:
                held = list(self._held.values())
            for a in held:
                try:
                    self.store.extend(a.key, a.owner, a.fencing_token, self.lease)
                except IdemctlError as exc:  # lost or unreachable: completion will tell
                    log.debug("heartbeat for %s: %s", a.key, exc)


class _Completer:
    """Sends finished keys' completions while the round's later handlers run: a batch leaves
    once it holds ``batch`` completions or its oldest has waited ``wait`` seconds, whichever
    comes first; one round trip at a time, those finished meanwhile go in the next. What a
    SIGKILL can cost beyond the handlers it cuts off is what waits here or is on its way.

    ``drain()`` sends what is left at once and returns every answer since the last drain:
    True (completed), False (the lease was lost) or the StoreUnavailable that failed it."""

    def __init__(
        self, store: Store, batch: int, wait: float, completed: Callable[[list[str]], None]
    ) -> None:
        self.store, self.batch, self.wait, self._completed = store, batch, wait, completed
        self._cond = threading.Condition()
        self._queue: list[tuple[_Item, Completion]] = []
        self._since = 0.0
        self._sending = 0
        self._answers: list[tuple[_Item, bool | StoreUnavailable]] = []
        self._failure: BaseException | None = None
        self._now = self._stopped = False
        self._thread: threading.Thread | None = None

    def put(self, item: _Item, completion: Completion) -> None:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="idemctl-completer", daemon=True
                )
                self._thread.start()
            if not self._queue:
                self._since = time.monotonic()
            self._queue.append((item, completion))
            if len(self._queue) == 1 or len(self._queue) >= self.batch:
                self._cond.notify_all()  # the first starts the wait for company

    def drain(self) -> list[tuple[_Item, bool | StoreUnavailable]]:
        with self._cond:
            self._now = True
            self._cond.notify_all()
            while self._queue or self._sending:
                self._cond.wait()
            self._now = False
            answers, self._answers = self._answers, []
            failure, self._failure = self._failure, None
        if failure is not None:
            raise failure
        return answers

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopped:
                    self._cond.wait()
                if not self._queue:
                    return
                while len(self._queue) < self.batch and not (self._now or self._stopped):
                    left = self._since + self.wait - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                sending, self._queue = self._queue, []
                self._sending = len(sending)
            answers = self._send(sending)
            with self._cond:
                self._answers += answers
                self._sending = 0
                self._cond.notify_all()

    def _send(
        self, sending: list[tuple[_Item, Completion]]
    ) -> list[tuple[_Item, bool | StoreUnavailable]]:
        try:
            done = self.store.complete_many([c for _, c in sending])
        except StoreUnavailable as exc:
            return [(item, exc) for item, _ in sending]
        except BaseException as exc:  # raised again by drain(), in the consumer's thread
            with self._cond:
                self._failure = exc
            return []
        self._completed([c.key for (_, c), ok in zip(sending, done, strict=True) if ok])
        return [(item, ok) for (item, _), ok in zip(sending, done, strict=True)]


def _fingerprint(value: bytes | None) -> str | None:
    return None if value is None else fingerprint(value)


def _fqcn(exc: BaseException | None) -> str:
    if exc is None:
        return "idemctl.consume.DeadLetter"
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def _kafka_text(exc: BaseException) -> str:
    """A KafkaException's own words (librdkafka's), not its repr."""
    error: Any = exc.args[0] if exc.args else None
    return str(error.str()) if hasattr(error, "str") else str(exc)
