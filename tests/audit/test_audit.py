"""audit against a real Kafka-protocol broker (tansu) and real stores: after a clean consume
nothing is lost; a group whose offset was moved past unhandled messages shows each of them as
lost; dead letters, stale events, keys in flight and old messages are told apart from lost
ones; and the audited group's offsets and members stay as they were.

tansu answers a partition's end offset as the base offset of its last record batch plus one,
so ``produce`` here sends the last message of each partition in a batch of its own: the end
offset audit reads is then the true one."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from idemctl import Acquired, Permanent, open_store
from idemctl.audit import LOST_SHOWN, AuditOptions, AuditReport, audit
from idemctl.consume import ConsumeOptions, Consumer, Event, adapt
from idemctl.errors import ConfigError
from idemctl.kafka.options import Summary
from tests.backends import QUICK_FAMILIES, expire_lease, unique_prefix, unique_schema
from tests.consume.test_consume import committed, names
from tests.servers import KafkaBroker

FAST_GROUPS = {"session.timeout.ms": "2000", "heartbeat.interval.ms": "300"}
"""tansu joins a group in about half the session timeout (as verify's chaos settings)."""
ORDER = {"order_key": "account:{account}", "sequence": "seq"}


@pytest.fixture(params=QUICK_FAMILIES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/audit.db"
    elif request.param == "redis":
        server = request.getfixturevalue("redis_server")
        url = f"redis://127.0.0.1:{server.port}/0?prefix={unique_prefix()}"
    else:
        url = request.getfixturevalue("postgres_server").url(schema=unique_schema())
    with open_store(url) as store:
        store.provision()
    return url


def produce(broker: KafkaBroker, topic: str, messages: list[dict[str, Any]]) -> None:
    """Each message: value (JSON-able, or bytes as they are), idem (the idempotency-key
    header, or None), partition (default 0), timestamp (ms since the epoch, default now)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    last = {m.get("partition", 0): i for i, m in enumerate(messages)}
    for i, m in enumerate(messages):
        alone = i in last.values()
        if alone:
            assert producer.flush(30) == 0
        headers = [] if m.get("idem") is None else [("idempotency-key", m["idem"].encode())]
        extra = {"timestamp": m["timestamp"]} if "timestamp" in m else {}
        producer.produce(
            topic,
            value=m["value"] if isinstance(m["value"], bytes) else json.dumps(m["value"]).encode(),
            partition=m.get("partition", 0),
            headers=headers,
            **extra,
        )
        if alone:
            assert producer.flush(30) == 0
    assert producer.flush(30) == 0


def commit(broker: KafkaBroker, topic: str, group: str, offsets: dict[int, int]) -> None:
    """Commit ``offsets`` for ``group`` as another consumer of it would: assigned, not joined."""
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import TopicPartition

    c = KafkaConsumer(broker.client_config(**{"group.id": group, "enable.auto.commit": False}))
    try:
        c.assign([TopicPartition(topic, p, o) for p, o in offsets.items()])
        c.commit(
            offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False
        )
    finally:
        c.close()


def consume(
    broker: KafkaBroker, url: str, topic: str, group: str, handler: Callable[..., Any], **kw: Any
) -> Summary:
    kw.setdefault("exit_when_idle", 1.0)
    kw.setdefault("backoff", 0.1)
    config = {k: str(v) for k, v in broker.client_config(**FAST_GROUPS).items()}
    config.pop("bootstrap.servers")
    opts = ConsumeOptions(broker.bootstrap, [topic], group, kafka_config=config, **kw)
    with open_store(url) as store:
        return Consumer(store, adapt(handler), opts).run()


def run_audit(broker: KafkaBroker, url: str, topic: str, group: str, **kw: Any) -> AuditReport:
    with open_store(url) as store:
        return audit(store, AuditOptions(broker.bootstrap, topic, group, timeout=15, **kw))


def counts(report: AuditReport) -> dict[str, int]:
    """The report's totals that are not 0."""
    return {k: v for k, v in report.totals().items() if v}


def keyed(n: int, partitions: int = 1) -> list[dict[str, Any]]:
    """``n`` messages keyed k-0, k-1, ..., dealt round the partitions."""
    return [{"value": {"n": i}, "idem": f"k-{i}", "partition": i % partitions} for i in range(n)]


def test_a_clean_consume_run_leaves_nothing_lost(kafka_broker: KafkaBroker, store_url: str) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=2)
    produce(kafka_broker, topic, keyed(100, partitions=2))
    summary = consume(kafka_broker, store_url, topic, group, lambda e: {"n": e.json()["n"]})
    assert summary.counts["executed"] == 100
    assert committed(kafka_broker, topic, group, 2) == {0: 50, 1: 50}

    report = run_audit(kafka_broker, store_url, topic, group)
    assert counts(report) == {"done": 100}
    assert report.totals()["lost"] == 0 and report.totals()["pending"] == 0
    assert report.lost == [] and report.audited == 100
    assert report.failing(("lost", "pending", "in_flight")) == []
    assert [(p.partition, p.committed, p.start, p.end, p.audited) for p in report.partitions] == [
        (0, 50, 0, 50, 50),
        (1, 50, 0, 50, 50),
    ]
    # --last: only the last messages below each committed offset
    last = run_audit(kafka_broker, store_url, topic, group, last=10)
    assert counts(last) == {"done": 20}
    assert [(p.start, p.audited) for p in last.partitions] == [(40, 10), (40, 10)]


def test_a_group_moved_past_messages_it_never_handled_shows_them_lost(
    kafka_broker: KafkaBroker, store_url: str
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, keyed(100))
    summary = consume(
        kafka_broker, store_url, topic, group, lambda e: e.json()["n"], max_messages=60
    )
    assert summary.counts["executed"] == 60
    assert committed(kafka_broker, topic, group, 1) == {0: 60}
    commit(kafka_broker, topic, group, {0: 80})  # another consumer of the group skips ahead
    assert committed(kafka_broker, topic, group, 1) == {0: 80}

    report = run_audit(kafka_broker, store_url, topic, group)
    assert counts(report) == {"done": 60, "lost": 20, "pending": 20}
    assert report.failing() == ["lost"]
    first = report.lost[0]
    assert (first.partition, first.offset, first.key) == (0, 60, "k-60")
    assert "no record" in first.why
    assert [(m.offset, m.key) for m in report.lost] == [(o, f"k-{o}") for o in range(60, 80)]
    (p,) = report.partitions
    assert (p.committed, p.end, p.pending) == (80, 100, 20)


class Poison(Exception):
    """What the handler raises for a message it can never handle."""


def test_dead_lettered_messages_are_not_lost_unless_missing_from_the_dead_letter_topic(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    dlq = f"{topic}.dlq"
    url = f"sqlite:///{tmp_path}/keys.db"
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, [
        {"value": {"n": 0}, "idem": "k-0"},
        {"value": {"n": 1}, "idem": None},  # no key: dead-lettered
        {"value": {"n": 2, "poison": True}, "idem": "k-2"},  # a permanent error
        {"value": {"n": 3}, "idem": "k-3"},
        {"value": {"n": 4}, "idem": None},
        {"value": {"n": 5, "refused": True}, "idem": "k-5"},  # Permanent
        {"value": {"n": 6}, "idem": "k-0"},  # k-0's key with another payload
        {"value": {"n": 7}, "idem": "k-7"},
    ])  # fmt: skip

    def handler(event: Event) -> int:
        body = event.json()
        if body.get("poison"):
            raise Poison("never works")
        if body.get("refused"):
            raise Permanent("refused")
        return int(body["n"])

    summary = consume(
        kafka_broker, url, topic, group, handler, permanent_errors=(Poison,), max_attempts=2
    )
    assert summary.counts["executed"] == 3
    assert summary.counts["dead_lettered"] == 5
    assert committed(kafka_broker, topic, group, 1) == {0: 8}

    plain = run_audit(kafka_broker, url, topic, group)
    assert counts(plain) == {"done": 3, "dead_lettered": 5}
    checked = run_audit(kafka_broker, url, topic, group, dlq_topic=dlq)
    assert counts(checked) == {"done": 3, "dead_lettered": 5}
    assert checked.dlq_checked == dlq

    # A message without a key that the group was moved past by hand: never dead-lettered.
    produce(kafka_broker, topic, [{"value": {"n": 8}, "idem": None}])
    commit(kafka_broker, topic, group, {0: 9})
    plain = run_audit(kafka_broker, url, topic, group)
    assert counts(plain) == {"done": 3, "dead_lettered": 6}  # without the topic, taken on trust
    checked = run_audit(kafka_broker, url, topic, group, dlq_topic=dlq)
    assert counts(checked) == {"done": 3, "dead_lettered": 5, "lost": 1}
    (lost,) = checked.lost
    assert (lost.partition, lost.offset, lost.key) == (0, 8, None)
    assert "dead-letter topic" in lost.why


def test_events_the_sequence_guard_found_stale_are_stale_not_done(
    kafka_broker: KafkaBroker, store_url: str
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, [
        {"value": {"account": 1, "seq": s}, "idem": f"ev-1-{s}"} for s in (1, 3, 2)
    ])  # fmt: skip
    applied: list[int] = []

    def apply(event: Event) -> dict[str, int]:
        applied.append(event.json()["seq"])
        return {"balance": event.json()["seq"] * 100}

    summary = consume(kafka_broker, store_url, topic, group, apply, **ORDER)
    assert applied == [1, 3]
    assert summary.counts["stale"] == 1 and summary.counts["executed"] == 2
    assert committed(kafka_broker, topic, group, 1) == {0: 3}

    report = run_audit(kafka_broker, store_url, topic, group, **ORDER)
    assert counts(report) == {"done": 2, "stale": 1}
    # without the guard's settings the stale event's completed key reads as done
    assert counts(run_audit(kafka_broker, store_url, topic, group)) == {"done": 3}


def test_audit_neither_moves_the_groups_offsets_nor_joins_it(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    from confluent_kafka import Consumer as KafkaConsumer

    topic, group = names()
    url = f"sqlite:///{tmp_path}/keys.db"
    kafka_broker.create_topic(topic, partitions=2)
    produce(kafka_broker, topic, keyed(20, partitions=2))
    commit(kafka_broker, topic, group, {0: 4, 1: 7})
    before = committed(kafka_broker, topic, group, 2)
    assert before == {0: 4, 1: 7}

    assigned, revoked = threading.Event(), threading.Event()
    revocations: list[Any] = []
    stop = threading.Event()
    member = KafkaConsumer(
        kafka_broker.client_config(
            **{"group.id": group, "enable.auto.commit": False}, **FAST_GROUPS
        )
    )

    def on_revoke(_: Any, partitions: Any) -> None:
        revocations.append(partitions)
        revoked.set()

    member.subscribe([topic], on_assign=lambda *_: assigned.set(), on_revoke=on_revoke)

    def poll() -> None:
        while not stop.is_set():
            member.poll(0.1)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        assert assigned.wait(30), "the live member never joined"
        report = run_audit(kafka_broker, url, topic, group)
        assert counts(report) == {"lost": 11, "pending": 9}
        # Had audit joined, the member would have given its partitions up at its next
        # heartbeat (300 ms): give that time to show.
        revoked.wait(1.0)
        assert revocations == []
        assert committed(kafka_broker, topic, group, 2) == before
        # and the check can fail: a client that does join makes the member give them up
        joiner = KafkaConsumer(
            kafka_broker.client_config(
                **{"group.id": group, "enable.auto.commit": False}, **FAST_GROUPS
            )
        )
        joiner.subscribe([topic])
        deadline = time.monotonic() + 30
        while not revoked.is_set() and time.monotonic() < deadline:
            joiner.poll(0.1)
        joiner.close()
        assert revocations, "a joining client did not show as a revocation"
    finally:
        stop.set()
        thread.join(10)
        member.close()
    assert committed(kafka_broker, topic, group, 2) == before


def test_keys_in_flight_released_failed_absent_and_old_are_told_apart(
    kafka_broker: KafkaBroker, store_url: str
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    old = int((datetime.now(UTC) - timedelta(days=8)).timestamp() * 1000)  # past retention
    produce(kafka_broker, topic, [
        {"value": {"n": 0}, "idem": "done"},
        {"value": {"n": 1}, "idem": "flight"},
        {"value": {"n": 2}, "idem": "released"},
        {"value": {"n": 3}, "idem": "expired"},
        {"value": {"n": 4}, "idem": "failed"},
        {"value": {"n": 5}, "idem": "absent"},
        {"value": {"n": 6}, "idem": "forgotten", "timestamp": old},
        {"value": {"n": 7}, "idem": "next"},  # above the committed offset
    ])  # fmt: skip
    with open_store(store_url) as other:  # another worker's keys
        claims = {k: other.claim(k, lease=600) for k in ("done", "flight", "released", "failed")}
        claims["expired"] = other.claim("expired", lease=600)
        held = {k: c for k, c in claims.items() if isinstance(c, Acquired)}
        assert held.keys() == claims.keys()
        other.complete("done", held["done"].owner, held["done"].fencing_token, {"ok": True})
        other.release("released", held["released"].owner, held["released"].fencing_token)
        other.fail(
            "failed", held["failed"].owner, held["failed"].fencing_token, "boom", retriable=False
        )
        expire_lease(other, "expired")  # its worker gone: the lease run out by the clock
        r = other.get("expired")
        assert r is not None and not r.lease_live(datetime.now(UTC))
    commit(kafka_broker, topic, group, {0: 7})

    report = run_audit(kafka_broker, store_url, topic, group)
    assert counts(report) == {
        "done": 1, "in_flight": 1, "lost": 3, "dead_lettered": 1, "beyond_retention": 1,
        "pending": 1,
    }  # fmt: skip
    assert [(m.offset, m.key) for m in report.lost] == [
        (2, "released"),
        (3, "expired"),
        (5, "absent"),
    ]
    why = {m.key: m.why for m in report.lost}
    assert "released" in why["released"]
    assert "expired lease" in why["expired"]
    assert "no record" in why["absent"]
    assert report.failing(("lost", "in_flight", "beyond_retention", "pending")) == [
        "lost",
        "in_flight",
        "beyond_retention",
        "pending",
    ]


def test_since_audits_only_the_messages_from_that_time_on(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    url = f"sqlite:///{tmp_path}/keys.db"
    kafka_broker.create_topic(topic, partitions=1)
    # Two batches a minute apart (their timestamps set, for a boundary to the millisecond):
    # the first batch's keys never made it to the store; the second's did.
    first = int(time.time() * 1000) - 120_000
    produce(kafka_broker, topic, [
        {"value": {"n": i}, "idem": f"early-{i}", "timestamp": first + i} for i in range(4)
    ])  # fmt: skip
    second = first + 60_000
    produce(kafka_broker, topic, [
        {"value": {"n": i}, "idem": f"late-{i}", "timestamp": second + i * 1000} for i in range(3)
    ])  # fmt: skip
    with open_store(url) as store:
        for i in range(3):
            claim = store.claim(f"late-{i}")
            assert isinstance(claim, Acquired)
            store.complete(claim.key, claim.owner, claim.fencing_token, i)
    commit(kafka_broker, topic, group, {0: 7})

    everything = run_audit(kafka_broker, url, topic, group)
    assert counts(everything) == {"done": 3, "lost": 4}
    assert [m.key for m in everything.lost] == [f"early-{i}" for i in range(4)]

    since = datetime.fromtimestamp(second / 1000, UTC)
    assert counts(run_audit(kafka_broker, url, topic, group, since=since)) == {"done": 3}
    later = since + timedelta(milliseconds=1)  # after the second batch's first message
    assert counts(run_audit(kafka_broker, url, topic, group, since=later)) == {"done": 2}
    after = since + timedelta(seconds=30)  # after the last message, before now
    assert counts(run_audit(kafka_broker, url, topic, group, since=after)) == {}
    with pytest.raises(ConfigError, match=r"--since .* is in the future"):
        run_audit(kafka_broker, url, topic, group, since=since + timedelta(hours=1))


def test_on_missing_key_keys_messages_as_consume_did(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    url = f"sqlite:///{tmp_path}/keys.db"
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, [
        {"value": {"n": 0}, "idem": "k-0"},
        {"value": {"n": 1}, "idem": None},
        {"value": b"not json", "idem": None},  # no fingerprint either
        {"value": {"n": 3}, "idem": "k-3"},
    ])  # fmt: skip
    summary = consume(kafka_broker, url, topic, group, lambda e: 1, on_missing_key="offset")
    assert summary.counts["executed"] == 4
    with open_store(url) as store:
        assert store.get(f"{topic}-0-1") is not None and store.get(f"{topic}-0-2") is not None

    by_offset = run_audit(kafka_broker, url, topic, group, on_missing_key="offset")
    assert counts(by_offset) == {"done": 4}
    # audited with another --on-missing-key than consume ran with, the keyless messages
    # read as that setting would have had them
    assert counts(run_audit(kafka_broker, url, topic, group)) == {"done": 2, "dead_lettered": 2}
    skipped = run_audit(kafka_broker, url, topic, group, on_missing_key="skip")
    assert counts(skipped) == {"done": 2, "skipped": 2}
    stopped = run_audit(kafka_broker, url, topic, group, on_missing_key="stop")
    assert counts(stopped) == {"done": 2, "lost": 2}
    assert [(m.offset, m.key) for m in stopped.lost] == [(1, None), (2, None)]


def test_the_report_names_the_first_lost_messages_and_counts_them_all(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=2)
    produce(kafka_broker, topic, keyed(460, partitions=2))
    commit(kafka_broker, topic, group, {0: 230, 1: 225})
    seen: list[tuple[int, int, int]] = []
    with open_store(f"sqlite:///{tmp_path}/keys.db") as store:
        report = audit(
            store,
            AuditOptions(kafka_broker.bootstrap, topic, group, batch=50, timeout=15),
            on_progress=lambda p: seen.append((p.total, p.done, p.lost)),
        )
    assert counts(report) == {"lost": 455, "pending": 5}  # the count is whole
    assert len(report.lost) == LOST_SHOWN  # the names are the first, by partition and offset
    assert [(m.partition, m.offset, m.key) for m in report.lost] == [
        (0, o, f"k-{2 * o}") for o in range(LOST_SHOWN)
    ]
    assert seen[0] == (455, 0, 0) and seen[-1] == (455, 455, 455)
    assert [d for _, d, _ in seen] == sorted(d for _, d, _ in seen)


def test_a_transactional_group_on_postgres_is_audited_like_any_other(
    kafka_broker: KafkaBroker, postgres_server: Any
) -> None:
    """--transactional: claim, the handler's SQL and completion commit together; the keys
    are the same records, so audit reads them as it reads any."""
    url = postgres_server.url(schema=unique_schema())
    with open_store(url) as store:
        store.provision()
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, keyed(30))

    def book(event: Event, ctx: Any) -> int:
        ctx.connection.execute("SELECT 1")  # the handler's own SQL, in the key's transaction
        return int(event.json()["n"])

    summary = consume(kafka_broker, url, topic, group, book, transactional=True, max_messages=20)
    assert summary.counts["executed"] == 20
    commit(kafka_broker, topic, group, {0: 25})
    report = run_audit(kafka_broker, url, topic, group)
    assert counts(report) == {"done": 20, "lost": 5, "pending": 5}
    assert [(m.offset, m.key) for m in report.lost] == [(o, f"k-{o}") for o in range(20, 25)]
