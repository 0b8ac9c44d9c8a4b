"""idemctl.faststream against the real Kafka-protocol broker (tansu) and real stores: a
FastStream subscriber behind IdempotencyMiddleware runs each key's handler once across
duplicates, dead-letters what it cannot key the way ``idemctl consume`` does, and fails
closed while the store is unreachable. pytest-asyncio is not installed: each test runs its
app with ``asyncio.run``."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from faststream.kafka import KafkaBroker as FastStreamBroker
from faststream.middlewares import AckPolicy

from idemctl.faststream import IdemContext, IdempotencyMiddleware
from idemctl.kafka.options import Handling
from idemctl.runner import current_context
from tests.backends import unique_prefix
from tests.consume.test_consume import committed, names, produce, read_all
from tests.polling import wait_until_async
from tests.servers import KafkaBroker, RedisServer

TANSU = {
    # tansu's group joins take half the session timeout; its high watermark is unreliable
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 500,
    "auto_offset_reset": "earliest",
}
DEADLINE = 90.0


async def until(condition: Callable[[], bool | Awaitable[bool]], what: str) -> None:
    """``condition`` within DEADLINE seconds (tests/polling.py)."""
    await wait_until_async(condition, what, DEADLINE)


async def committed_total(broker: KafkaBroker, topic: str, group: str, partitions: int) -> int:
    """The group's committed offsets on ``topic`` added up (none committed counts 0)."""
    ends = await asyncio.to_thread(committed, broker, topic, group, partitions)
    return sum(max(offset, 0) for offset in ends.values())


async def _equals(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


@asynccontextmanager
async def subscribed(
    kafka_broker: KafkaBroker,
    idem: IdempotencyMiddleware,
    topic: str,
    group: str,
    handler: Callable[..., Awaitable[Any]],
    *,
    publish_to: str | None = None,
    ack_policy: AckPolicy | None = AckPolicy.ACK,
) -> AsyncIterator[FastStreamBroker]:
    """A FastStream broker behind ``idem``, with ``handler`` subscribed to ``topic`` in
    ``group`` (its results published to ``publish_to`` if given), started for the body;
    ``idem`` is closed once the broker has stopped. ``ack_policy=None`` leaves FastStream's
    default."""
    options: dict[str, Any] = {} if ack_policy is None else {"ack_policy": ack_policy}
    broker = FastStreamBroker(kafka_broker.bootstrap, middlewares=[idem], **options)
    if publish_to is not None:
        handler = broker.publisher(publish_to)(handler)
    broker.subscriber(topic, group_id=group, **TANSU)(handler)
    async with broker:
        await broker.start()
        yield broker
    await idem.aclose()


def consume(
    kafka_broker: KafkaBroker,
    idem: IdempotencyMiddleware,
    topic: str,
    group: str,
    handler: Callable[..., Awaitable[Any]],
    *,
    messages: int,
    partitions: int = 1,
    publish_to: str | None = None,
) -> None:
    """Run ``handler`` behind ``idem`` until ``messages`` messages have finished and the
    group's offsets on ``topic`` add up to ``messages``."""

    async def main() -> None:
        async with subscribed(kafka_broker, idem, topic, group, handler, publish_to=publish_to):
            await until(lambda: idem.summary.finished >= messages, f"{messages} messages finished")
            await until(
                lambda: _equals(committed_total(kafka_broker, topic, group, partitions), messages),
                f"offsets committed past all {messages} messages",
            )

    asyncio.run(main())


def recording_keys(ran: list[str]) -> Callable[[dict[str, Any]], Awaitable[None]]:
    """A handler that only appends each message's idempotency key to ``ran``."""

    async def handle(body: dict[str, Any]) -> None:
        ran.append(current_context().key)

    return handle


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/keys.db"
    server = request.getfixturevalue("redis_server")
    return f"redis://127.0.0.1:{server.port}/0?prefix={unique_prefix()}"


def test_each_key_runs_once_across_duplicates_and_offsets_reach_the_end(
    kafka_broker: KafkaBroker, store_url: str
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=3)
    keys = [f"pay-{i}" for i in range(60)]
    messages = [
        {"value": {"payment": k, "cents": 100 + i}, "idem": k, "kkey": k.encode()}
        for i, k in enumerate(keys)
    ]
    # Duplicates, half of them under another Kafka key, so in another partition.
    dupes = [
        {**m, "kkey": m["kkey"] + (b"-elsewhere" if i % 2 else b"")}
        for i, m in enumerate(messages[:25] + messages[:5])
    ]
    produce(kafka_broker, topic, messages + dupes)
    total = len(messages) + len(dupes)
    charged: Counter[str] = Counter()
    seen: list[tuple[str, int]] = []
    idem = IdempotencyMiddleware(store_url, options=Handling(backoff=0.2))

    async def charge(body: dict[str, Any], ctx: IdemContext) -> dict[str, Any]:
        assert current_context() is ctx
        assert ctx.key == body["payment"]
        charged[body["payment"]] += 1
        seen.append((ctx.key, ctx.fencing_token))
        return {"charged": body["cents"]}

    consume(kafka_broker, idem, topic, group, charge, messages=total, partitions=3)
    assert charged == Counter(keys)  # each payment charged once
    assert idem.summary.counts["executed"] == len(keys)
    assert idem.summary.counts["replayed"] == len(dupes)
    assert idem.summary.dead_letters == Counter()


def test_a_message_without_a_key_is_dead_lettered_with_its_reason_and_passed(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(
        kafka_broker,
        topic,
        [
            {"value": {"n": 1}, "idem": "a"},
            {"value": {"n": 2}, "idem": None, "kkey": b"no-key", "headers": [("case", b"x")]},
            {"value": {"n": 3}, "idem": "c"},
        ],
    )
    ran: list[str] = []
    idem = IdempotencyMiddleware(f"sqlite:///{tmp_path}/keys.db", options=Handling(backoff=0.2))

    consume(kafka_broker, idem, topic, group, recording_keys(ran), messages=3)
    assert ran == ["a", "c"]
    assert idem.summary.dead_letters == Counter({"no idempotency key": 1})
    (dead,) = read_all(kafka_broker, f"{topic}.dlq", expect=1)
    headers = dict(dead.headers())
    assert headers["idemctl-dlt-reason"] == b"no idempotency key"
    assert headers["case"] == b"x"  # the message's own headers go with it
    assert headers["kafka_dlt-original-topic"] == topic.encode()
    assert int.from_bytes(headers["kafka_dlt-original-partition"], "big") == 0
    assert int.from_bytes(headers["kafka_dlt-original-offset"], "big") == 1
    assert headers["kafka_dlt-original-consumer-group"] == group.encode()
    assert headers["kafka_dlt-exception-message"].startswith(b"no idempotency key: ")
    assert dead.key() == b"no-key" and dead.value() == b'{"n": 2}'


def test_an_unreachable_store_commits_nothing_and_the_message_runs_once_it_is_back(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    server = RedisServer(tmp_path)
    server.start()
    try:
        url = f"redis://127.0.0.1:{server.port}/0?prefix={unique_prefix()}"
        server.stop()  # down before the first message
        topic, group = names()
        kafka_broker.create_topic(topic, partitions=1)
        produce(kafka_broker, topic, [{"value": {"n": i}, "idem": f"k{i}"} for i in range(3)])
        ran: list[str] = []
        idem = IdempotencyMiddleware(url, options=Handling(backoff=0.2))

        async def main() -> None:
            async with subscribed(kafka_broker, idem, topic, group, recording_keys(ran)):
                await until(
                    lambda: idem.summary.counts["store_unavailable"] >= 3,
                    "the store found unreachable, again and again",
                )
                assert ran == []
                assert await committed_total(kafka_broker, topic, group, 1) == 0  # fail closed
                await asyncio.to_thread(server.start)
                await until(lambda: len(ran) == 3, "every message run once the store is back")
                await until(
                    lambda: _equals(committed_total(kafka_broker, topic, group, 1), 3),
                    "offsets committed once the messages finished",
                )

        asyncio.run(main())
        assert ran == ["k0", "k1", "k2"]  # in order, each once
    finally:
        server.stop()


def test_a_key_held_by_a_dead_worker_waits_for_its_lease_then_is_taken_over(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """The crash window: a worker claimed the key and died before completing it. Its
    partition is held (busy) until the lease runs out; then the handler runs again, told
    it is a takeover, under a higher fencing token."""
    from idemctl import Acquired, open_store

    url = f"sqlite:///{tmp_path}/keys.db"
    with open_store(url) as store:
        # never completed: its owner "was killed"; the lease outlasts the group join (3 s)
        dead = store.claim("pay-1", None, 8.0)
    assert isinstance(dead, Acquired)
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, [{"value": {"n": 1}, "idem": "pay-1"},
                                  {"value": {"n": 2}, "idem": "pay-2"}])  # fmt: skip
    ran: list[tuple[str, bool, int]] = []
    idem = IdempotencyMiddleware(url, options=Handling(backoff=0.2))

    async def handle(body: dict[str, Any], ctx: IdemContext) -> None:
        ran.append((ctx.key, ctx.takeover, ctx.fencing_token))

    consume(kafka_broker, idem, topic, group, handle, messages=2)
    assert [(k, takeover) for k, takeover, _ in ran] == [("pay-1", True), ("pay-2", False)]
    assert ran[0][2] > dead.fencing_token
    assert idem.summary.counts["busy"] >= 1  # held while the dead worker's lease lasted


def test_failures_are_retried_up_to_max_attempts_then_dead_lettered_in_order(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    from idemctl import Permanent

    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(
        kafka_broker,
        topic,
        [{"value": {"do": do}, "idem": do} for do in ("flaky", "broken", "refused", "fine")],
    )
    runs: Counter[str] = Counter()
    order: list[str] = []
    idem = IdempotencyMiddleware(
        f"sqlite:///{tmp_path}/keys.db", options=Handling(backoff=0.1, max_attempts=3)
    )

    async def handle(body: dict[str, Any]) -> str:
        do = body["do"]
        runs[do] += 1
        order.append(do)
        if do == "flaky" and runs[do] == 1:
            raise ConnectionError("the bank timed out")
        if do == "broken":
            raise ValueError("always")
        if do == "refused":
            raise Permanent("card declined")
        return do

    consume(kafka_broker, idem, topic, group, handle, messages=4)
    assert runs == Counter({"flaky": 2, "broken": 3, "refused": 1, "fine": 1})
    assert order == ["flaky", "flaky", "broken", "broken", "broken", "refused", "fine"]
    assert idem.summary.counts["retried"] == 3  # flaky once, broken twice
    assert idem.summary.dead_letters == Counter({"failed 3 times": 1, "permanent failure": 1})
    dead = read_all(kafka_broker, f"{topic}.dlq", expect=2)
    about = {
        dict(m.headers())["idempotency-key"]: (
            dict(m.headers())["idemctl-dlt-reason"],
            dict(m.headers())["kafka_dlt-exception-fqcn"],
            dict(m.headers())["kafka_dlt-exception-message"],
        )
        for m in dead
    }
    assert about == {
        b"broken": (b"failed 3 times", b"builtins.ValueError",
                    b"failed 3 times: ValueError: always"),
        b"refused": (b"permanent failure", b"idemctl.errors.Permanent",
                     b"permanent failure: Permanent: card declined"),
    }  # fmt: skip


def test_a_subscriber_that_commits_before_its_handler_is_refused_before_anything_runs(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """FastStream's default for Kafka, AckPolicy.ACK_FIRST, auto-commits offsets as
    messages are fetched: effectively-once is impossible, so the subscriber stops at its
    first message without running it or committing past it."""
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, [{"value": {"n": i}, "idem": f"k{i}"} for i in range(3)])
    ran: list[str] = []
    idem = IdempotencyMiddleware(f"sqlite:///{tmp_path}/keys.db")

    async def main() -> None:
        handle = recording_keys(ran)
        # ack_policy=None: FastStream's default, ACK_FIRST
        async with subscribed(kafka_broker, idem, topic, group, handle, ack_policy=None) as broker:
            subscriber = broker.subscribers[0]
            await until(lambda: not subscriber.running, "the subscriber stopped")

    asyncio.run(main())
    assert ran == []
    assert sum(max(o, 0) for o in committed(kafka_broker, topic, group, 1).values()) == 0


def test_messages_faststream_cannot_parse_are_dead_lettered_with_their_reason(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """FastStream decodes every header as UTF-8 before any handler: a key header that is
    not UTF-8 is consume's `invalid idempotency key`, another such header makes the message
    `unreadable message`; both are dead-lettered and passed, the good ones run."""
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(
        kafka_broker,
        topic,
        [
            {"value": {"n": 1}, "idem": "a"},
            {"value": {"n": 2}, "idem": None, "headers": [("idempotency-key", b"k-\xff")]},
            {"value": {"n": 3}, "idem": "c", "headers": [("trace", b"\xfe\xff")]},
            {"value": {"n": 4}, "idem": "d"},
        ],
    )
    ran: list[str] = []
    idem = IdempotencyMiddleware(f"sqlite:///{tmp_path}/keys.db", options=Handling(backoff=0.2))

    consume(kafka_broker, idem, topic, group, recording_keys(ran), messages=4)
    assert ran == ["a", "d"]
    assert idem.summary.dead_letters == Counter(
        {"invalid idempotency key": 1, "unreadable message": 1}
    )
    dead = read_all(kafka_broker, f"{topic}.dlq", expect=2)
    reasons = {
        int.from_bytes(dict(m.headers())["kafka_dlt-original-offset"], "big"): dict(m.headers())[
            "idemctl-dlt-reason"
        ]
        for m in dead
    }
    assert reasons == {1: b"invalid idempotency key", 2: b"unreadable message"}


def test_the_sequence_guard_skips_a_stale_event(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(
        kafka_broker,
        topic,
        [
            {"value": {"account": "a1", "seq": 2, "cents": 200}, "idem": "a1-2"},
            {"value": {"account": "a1", "seq": 1, "cents": 100}, "idem": "a1-1"},  # late
            {"value": {"account": "a1", "seq": 3, "cents": 300}, "idem": "a1-3"},
        ],
    )
    applied: list[tuple[str, int | None]] = []
    idem = IdempotencyMiddleware(
        f"sqlite:///{tmp_path}/keys.db",
        options=Handling(order_key="account:{account}", sequence="seq"),
    )

    async def apply(body: dict[str, Any], ctx: IdemContext) -> None:
        applied.append((ctx.key, ctx.sequence))

    consume(kafka_broker, idem, topic, group, apply, messages=3)
    assert applied == [("a1-2", 2), ("a1-3", 3)]
    assert idem.summary.counts["stale"] == 1


def test_a_replay_publishes_the_stored_result_again(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    """The subscriber's publishers send the handler's result; a redelivered message gets
    the stored result back, and it is published again (at least once downstream)."""
    topic, group = names()
    out = f"{topic}.out"
    kafka_broker.create_topic(topic, partitions=1)
    kafka_broker.create_topic(out, partitions=1)
    produce(kafka_broker, topic, [{"value": {"n": 1}, "idem": "a"}] * 2)
    runs: list[str] = []
    idem = IdempotencyMiddleware(f"sqlite:///{tmp_path}/keys.db")

    async def handle(body: dict[str, Any], ctx: IdemContext) -> dict[str, Any]:
        runs.append(ctx.key)
        return {"for": ctx.key, "token": ctx.fencing_token}

    consume(kafka_broker, idem, topic, group, handle, messages=2, publish_to=out)
    assert runs == ["a"]
    published = read_all(kafka_broker, out, expect=2)
    assert len(published) == 2 and published[0].value() == published[1].value()
    assert b'"for":"a"' in published[0].value().replace(b" ", b"")
