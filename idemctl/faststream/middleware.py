"""``IdempotencyMiddleware``: a FastStream Kafka subscriber's messages keyed, claimed, run
and committed or paused by the shared policy (``idemctl.kafka.policy``)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import weakref
from collections.abc import Awaitable, Callable, Mapping
from enum import StrEnum
from types import TracebackType
from typing import TYPE_CHECKING, Annotated, Any

from idemctl import aio
from idemctl.errors import (
    ConfigError,
    ConsumeAborted,
    IdemctlError,
    MissingDriver,
    StoreUnavailable,
)
from idemctl.kafka.acts import Acts, DeadLetter, Finished, Paused, about
from idemctl.kafka.deadletter import (
    dead_letter_headers,
    dead_letter_topic,
    fqcn,
)
from idemctl.kafka.keys import Message
from idemctl.kafka.options import Handling, Summary
from idemctl.kafka.policy import MAX_BACKOFF, Keying, keyword
from idemctl.runner import Context, RunResult

try:
    # aiokafka ships no type information (no py.typed): untyped here.
    from aiokafka.errors import KafkaError  # type: ignore[import-untyped]
    from faststream import Context as FromContext
    from faststream.exceptions import SubscriberNotFound
    from faststream.kafka.response import KafkaPublishCommand
    from faststream.middlewares import AckPolicy, BaseMiddleware
except ModuleNotFoundError as exc:  # faststream, or aiokafka underneath its Kafka broker
    raise MissingDriver(
        f"idemctl.faststream needs FastStream's Kafka broker ({exc.name} is missing): "
        "pip install 'idemctl[faststream]'"
    ) from exc

if TYPE_CHECKING:
    from faststream._internal.context.repository import ContextRepo
    from faststream.message import StreamMessage

    from idemctl.aio import AsyncStore

from idemctl.faststream.aiokafka import _DeadLetters, _Item, _Pauses, _refuse, _seek_back

log = logging.getLogger("idemctl.faststream")

IdemContext = Annotated[Context, FromContext("idemctl")]
"""A handler parameter that receives the attempt's ``idemctl.runner.Context`` through
FastStream's own injection (``current_context()`` gives the same)."""


def _permanent_by_default() -> tuple[type[BaseException], ...]:
    """Failures that come back the same on every retry: the payload does not validate
    against the handler's signature (pydantic, when FastStream uses it)."""
    try:
        from pydantic import ValidationError
    except ModuleNotFoundError:
        return ()
    return (ValidationError,)


class IdempotencyMiddleware:
    """A FastStream broker (or router) middleware that runs each message's handler once
    per idempotency key: ``KafkaBroker(..., middlewares=[IdempotencyMiddleware(...)])``.

    ``store``: an ``idemctl.aio.AsyncStore``, or a store URL (opened here, and closed by
    ``aclose``). ``options``: ``idemctl consume``'s options for each message
    (``idemctl.kafka.options.Handling``): ``key`` (a key strategy: ``header:NAME``,
    ``template:{field}:{field}``, ``payload-hash``, ``offset``), ``on_missing_key`` (dlq,
    offset, skip or stop), ``lease``, ``max_attempts``, ``backoff`` (seconds before the
    first retry, doubled each attempt, at most 60), ``dlq_topic`` (default
    ``<topic>.dlq``), ``dlq_timeout``, ``dlq_breaker``, ``order_key``/``sequence``/
    ``on_stale`` (the sequence guard), ``transactional`` (PostgreSQL), ``permanent_errors``
    (exception types that fail a key for good; ``idemctl.Permanent`` always does, and so
    does pydantic's ValidationError here, a payload the handler's signature refuses).
    ``timeout``: seconds a handler may run before it is cancelled with HandlerTimeout (a
    failed, retried attempt; dead-lettered after ``max_attempts``). ``retention``: seconds
    a completed key is remembered (the store's default if None). ``dlq_config``: aiokafka
    producer settings for dead letters, over those taken from the subscriber's
    connection.

    ``summary`` counts what happened (the names ``idemctl consume`` reports). Give
    ``aclose`` to the app's ``after_shutdown``.
    """

    def __init__(
        self,
        store: AsyncStore | str,
        *,
        options: Handling | None = None,
        retention: float | None = None,
        timeout: float | None = None,
        dlq_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.timeout = timeout
        # The Kafka connection, topics and group are the subscriber's: FastStream's.
        given = options or Handling()
        permanent = (*_permanent_by_default(), *given.permanent_errors)
        self.options = dataclasses.replace(given, permanent_errors=permanent)
        self.retention = retention
        self.summary = Summary(state="consuming")
        # A bad URL or a missing driver fails here; connections are made on first use.
        self._opened = isinstance(store, str)
        self.store: AsyncStore = aio.open_store(store) if isinstance(store, str) else store
        self._keying = Keying(self.options, keyword)
        self._groupless: set[int] = set()
        self._pauses: weakref.WeakKeyDictionary[Any, _Pauses] = weakref.WeakKeyDictionary()
        self._dead_letters = _DeadLetters(self.options.dlq_timeout, dict(dlq_config or {}))
        self._acts = Acts(self.options, self.summary, log, keyword)

    def __call__(
        self, msg: Any | None, /, *, context: ContextRepo
    ) -> BaseMiddleware[KafkaPublishCommand, Any]:
        """What FastStream calls for each message (and each publish): the middleware for it."""
        return _Middleware(msg, context=context, idem=self)

    async def aclose(self) -> None:
        """Close the dead-letter producer, and the store if it was opened from a URL."""
        await self._dead_letters.close()
        if self._opened:
            await self.store.aclose()

    # What a message is -----------------------------------------------------------------------

    def _admit(self, record: Any, subscriber: Any) -> _Item | None:
        """``record`` with its key and fingerprint, or why it has none usable; None for a
        subscriber without a group (left alone). Refuses (stops the app, the record not
        committed) a subscriber that commits before its handler runs,
        ``on_missing_key="stop"`` and a key template the first message cannot fill."""
        group = getattr(subscriber, "group_id", None)
        if not group:
            if id(subscriber) not in self._groupless:
                self._groupless.add(id(subscriber))
                log.warning(
                    "subscriber %s has no group_id: idemctl leaves it alone, as nothing it "
                    "finishes could be committed; give it a group_id to run it effectively "
                    "once",
                    getattr(subscriber, "topic_names", "?"),
                )
            return None
        consumer = getattr(record, "consumer", None) or getattr(subscriber, "consumer", None)
        where = f"{record.topic}[{record.partition}]@{record.offset}"
        if subscriber.ack_policy is AckPolicy.ACK_FIRST:
            _refuse(
                consumer,
                [record],
                f"{where}: the subscriber commits offsets before its handler runs "
                "(AckPolicy.ACK_FIRST, FastStream's default for Kafka): give "
                "ack_policy=AckPolicy.ACK to the broker, router or subscriber",
            )
        item = _Item(
            record, subscriber, consumer, group, record.topic, record.partition, record.offset
        )
        message = Message(
            record.topic, record.partition, record.offset, record.value, record.headers or ()
        )
        try:
            a = self._keying.admit(message)
        except (ConfigError, ConsumeAborted) as exc:  # the key template, on_missing_key stop
            _refuse(consumer, [record], str(exc))
        item.key, item.fingerprint, item.order, item.bad = a.key, a.fingerprint, a.order, a.bad
        return item

    # Running it ------------------------------------------------------------------------------

    async def _run(
        self,
        item: _Item,
        call_next: Callable[[Any], Awaitable[Any]],
        message: StreamMessage[Any],
        context: ContextRepo,
    ) -> _Done:
        """Claim the key, run the handler under it, and say what the message came to."""
        if item.bad is not None:
            return await self._unusable(item)
        assert item.key is not None

        async def handler(ctx: Context) -> Any:
            with context.scope("idemctl", ctx):
                return _jsonable(await call_next(message))

        o = self.options
        try:
            result = await aio.run(
                self.store,
                item.key,
                handler,
                fingerprint=item.fingerprint,
                lease=o.lease,
                retention=self.retention,
                permanent=o.permanent_errors,
                transactional=o.transactional,
                timeout=self.timeout,
                max_attempts=o.max_attempts,
                order=item.order,
                logger=log,
            )
        except StoreUnavailable as exc:
            log.warning(
                "store unavailable, pausing every partition: %s",
                exc,
                extra=about(item, "store_unavailable"),
            )
            self._pause(item, o.backoff, "store_unavailable", everything=True)
            return _Done.PAUSED
        except IdemctlError as exc:  # not provisioned, a setting the store refuses, ...
            _refuse(item.consumer, [item.record], f"the store cannot run {item.key!r}: {exc}")
        return await self._act(item, result)

    async def _act(self, item: _Item, result: RunResult) -> _Done:
        """What a RunResult comes to in Kafka: the shared act layer's answer, as for consume."""
        next_ = self._acts.after(item, result)
        if next_ is None:  # the single runner never leaves a key to a batch
            raise AssertionError(f"run() does not answer {result.outcome}")
        if isinstance(next_, Finished) and next_.ran:
            item.result = result.result
        return await self._do(item, next_)

    async def _unusable(self, item: _Item) -> _Done:
        """A message without a usable key: dead-lettered, or passed by (``skip``)."""
        return await self._do(item, self._acts.unusable(item))

    async def _do(self, item: _Item, next_: Finished | Paused | DeadLetter) -> _Done:
        if isinstance(next_, DeadLetter):
            done = await self._dead_letter(item, next_.reason, next_.detail, next_.error)
            if done is _Done.FINISHED and next_.then:
                self._acts.count(next_.then)
            return done
        if isinstance(next_, Finished):
            return _Done.RESULT if next_.ran else _Done.FINISHED
        self._pause(item, next_.seconds, next_.why)
        return _Done.PAUSED

    async def _dead_letter(
        self, item: _Item, reason: str, detail: str, exc: BaseException | None = None
    ) -> _Done:
        """Write the message to its dead-letter topic and wait for the broker: only then is
        it finished. A refused dead letter pauses the partition; the ``dlq_breaker``-th
        dead letter in a row for one reason stops the app (that last one is not
        committed)."""
        o, record = self.options, item.record
        topic = dead_letter_topic(o.dlq_topic, record.topic)
        headers = dead_letter_headers(
            record.headers or (),
            record.topic,
            record.partition,
            record.offset,
            item.group,
            reason,
            detail,
            exc,
        )
        refused = await self._dead_letters.send(item, topic, headers)
        if refused is not None:
            paused = self._acts.refused(item, reason, refused)
            self._pause(item, paused.seconds, paused.why)
            return _Done.PAUSED
        storm = self._acts.dead_lettered(item, reason, detail, topic)
        if storm is not None:
            _refuse(
                item.consumer,
                [record],
                f"{storm}, and the last was not committed. Fix the cause (often key= or the "
                "handler) and start again",
            )
        return _Done.FINISHED

    # Kafka's part ----------------------------------------------------------------------------

    def _pause(self, item: _Item, seconds: float, why: str, *, everything: bool = False) -> None:
        """Stop the message's partition at it (every partition of its consumer with
        ``everything``): seek back, pause, resume after ``seconds`` (at most 60)."""
        self._acts.count(why)
        consumer = item.consumer
        if not hasattr(consumer, "pause"):  # FastStream's test client: nothing to pause
            return
        pauses = self._pauses.get(consumer)
        if pauses is None:
            pauses = self._pauses[consumer] = _Pauses(consumer)
        pauses.pause(item, min(seconds, MAX_BACKOFF), everything=everything)


class _Done(StrEnum):
    """What a message came to."""

    RESULT = "result"
    """Its handler ran, or ran before: finished, with a result to publish."""
    FINISHED = "finished"
    """Finished without a result (dead-lettered, skipped, stale): nothing to publish."""
    PAUSED = "paused"
    """Not finished: its partition is paused at it and it comes again."""


class _Unpublished(Exception):
    """Raised out of ``consume_scope`` so FastStream publishes nothing for the message; the
    middleware's own exit swallows it."""

    def __init__(self, done: _Done) -> None:
        super().__init__(done)
        self.done = done


class _Middleware(BaseMiddleware[KafkaPublishCommand, Any]):
    """One message's passage: keyed on receipt, run in ``consume_scope``, committed or paused
    on exit (after FastStream published the handler's result)."""

    def __init__(self, msg: Any, /, *, context: ContextRepo, idem: IdempotencyMiddleware) -> None:
        super().__init__(msg, context=context)
        self.idem = idem
        self.item: _Item | None = None
        self.message: StreamMessage[Any] | None = None
        self.entered = False
        """consume_scope began: FastStream parsed the record and a handler's filter took it."""
        self.returned = False
        """consume_scope returned the message's result (for FastStream to publish)."""

    async def on_receive(self) -> None:
        record = self.msg
        if record is None:  # a publish, not a consumed record
            return
        subscriber = self.context.get_local("handler_")
        if subscriber is None:  # get_one() or iteration: the caller acknowledges
            return
        if isinstance(record, tuple):
            _refuse(
                getattr(subscriber, "consumer", None),
                record,
                "idemctl.faststream runs one handler per key: batch subscribers "
                "(batch=True) are not supported",
            )
        self.item = self.idem._admit(record, subscriber)

    async def consume_scope(
        self, call_next: Callable[[Any], Awaitable[Any]], msg: StreamMessage[Any]
    ) -> Any:
        self.message = msg
        item = self.item
        if item is None:
            return await call_next(msg)
        self.entered = True
        done = await self.idem._run(item, call_next, msg, self.context)
        if done is not _Done.RESULT:
            raise _Unpublished(done)
        self.returned = True
        return item.result

    async def after_processed(
        self,
        exc_type: type[BaseException] | None = None,
        exc_val: BaseException | None = None,
        exc_tb: TracebackType | None = None,
    ) -> bool | None:
        item = self.item
        if item is None:
            return False
        if exc_val is None:  # its result stored, and published by FastStream
            await self._commit(item)
            return False
        if isinstance(exc_val, _Unpublished):
            if exc_val.done is _Done.FINISHED:
                await self._commit(item)
            else:
                await self._nack()
            return True
        if isinstance(exc_val, SystemExit) or not isinstance(exc_val, Exception):
            _seek_back(item.consumer, [item.record])  # stopping or cancelled: comes again
            await self._nack()
            return False
        if self.returned:
            # The key is completed, but publishing its result failed: the message comes
            # again, replays, and its result is published then.
            log.warning(
                "publishing the result of %s failed, pausing its partition: %s",
                item.where,
                exc_val,
                extra=about(item, "publish_failed"),
            )
            self.idem._pause(item, self.idem.options.backoff, "publish_failed")
            await self._nack()
            return True
        if self.entered:  # not the handler's (run() returns those): a fault on idemctl's side
            log.error(
                "%s: %s; pausing its partition",
                item.where,
                exc_val,
                exc_info=exc_val,
                extra=about(item, "unexpected"),
            )
            self.idem._pause(item, self.idem.options.backoff, "unexpected")
            await self._nack()
            return True
        # FastStream could not hand it to a handler: it could not parse it, or no
        # handler's filter took it.
        if item.bad is not None:
            done = await self.idem._unusable(item)
        else:
            reason = (
                "no handler" if isinstance(exc_val, SubscriberNotFound) else "unreadable message"
            )
            detail = f"{fqcn(exc_val)}: {exc_val}"
            done = await self.idem._dead_letter(item, reason, detail, exc_val)
        if done is _Done.FINISHED:
            await self._commit(item)
        else:
            await self._nack()
        return True

    async def _commit(self, item: _Item) -> None:
        """Commit the consumer's position: past this message and every one it finished
        before (its handlers run one at a time), not past a paused one (sought back)."""
        try:
            if self.message is not None:
                await self.message.ack()  # commits, and tells FastStream it is acknowledged
            elif item.consumer is not None:
                await item.consumer.commit()
        except KafkaError as exc:  # a rebalance took the partition: it comes again, replays
            log.warning(
                "could not commit %s: %s", item.where, exc, extra=about(item, "commit_failed")
            )

    async def _nack(self) -> None:
        """Tell FastStream the message is not acknowledged (so it commits nothing for it)."""
        if self.message is None:
            return
        try:
            await self.message.nack()  # seeks back to it again, which a revoked one refuses
        except KafkaError as exc:  # revoked meanwhile: its new owner goes on from the commit
            log.debug("nack: %s", exc)


@functools.cache
def _to_jsonable() -> Callable[[Any], Any] | None:
    try:
        from pydantic_core import to_jsonable_python
    except ModuleNotFoundError:
        return None
    return to_jsonable_python


def _jsonable(value: Any) -> Any:
    """A handler's value as the store keeps it: pydantic models, dataclasses, datetimes and
    the like as their JSON form (what FastStream would publish), the rest as they are (the
    runner refuses what is not JSON)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    convert = _to_jsonable()
    if convert is None:
        return value
    try:
        return convert(value)
    except (TypeError, ValueError):
        return value
