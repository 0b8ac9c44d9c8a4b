"""The relay keeps each aggregate's order, on a real PostgreSQL server and the real broker:
a row whose delivery failed holds back the later rows of its aggregate (and only those)
until it is delivered, an aggregate is relayed by one relay at a time, and three relays
at once, with one delivery in ten failing, put every aggregate's events on the topic in
the order they were written, none lost.

Deliveries fail through ``FlakyProducer``, a real producer whose delivery callbacks report
failures on purpose: "lost" messages are never sent, "ack lost" ones are written to the
topic and reported failed all the same (as when an acknowledgement times out), so the
relay sends them again: at least once, duplicates allowed, each with its row's id."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from idemctl.outbox import Outbox
from idemctl.outbox.relay import Relay, RelayOptions, new_producer, publish_in_order
from idemctl.outbox.table import WINDOW, OutboxRow, OutboxTable
from idemctl.stores import open_store
from tests.backends import unique_schema
from tests.outbox.test_outbox import Pg, drop_schema, headers_of, read_topic, tag
from tests.polling import wait_until
from tests.servers import KafkaBroker, PostgresServer


@pytest.fixture
def pg(postgres_server: PostgresServer) -> Iterator[Pg]:
    schema = unique_schema()
    url = postgres_server.url(schema=schema)
    store = open_store(url)
    store.provision()
    admin = postgres_server.connect()
    try:
        yield Pg(postgres_server, schema, url, store, admin)
    finally:
        store.close()
        admin.close()
        drop_schema(postgres_server, schema)


# Failing deliveries on purpose -------------------------------------------------------------


LOST, ACK_LOST = "lost", "ack lost"


@dataclass
class Ledger:
    """What every FlakyProducer of a test did, shared by the relays' threads. Each produce
    is checked at once: the rows written before it of its aggregate (header ``n``: its
    place in the aggregate) must all have been acknowledged by then."""

    acked: dict[bytes, set[int]] = field(default_factory=lambda: defaultdict(set))
    produced: int = 0
    failed: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    """Row ids by how their delivery was made to fail."""
    early: list[str] = field(default_factory=list)
    """Produces that went out before an earlier row of their aggregate was acknowledged."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def produce(self, key: bytes, n: int) -> None:
        with self.lock:
            self.produced += 1
            missing = set(range(n)) - self.acked[key]
            if missing:
                self.early.append(f"{key!r} #{n} before #{sorted(missing)} was acknowledged")

    def ack(self, key: bytes, n: int) -> None:
        with self.lock:
            self.acked[key].add(n)

    def fail(self, how: str, row_id: str) -> None:
        with self.lock:
            self.failed[how].append(row_id)


class FlakyProducer:
    """A real confluent_kafka Producer whose deliveries ``decide`` may fail: LOST (never
    sent; the callback gets an error at the next poll or flush) or ACK_LOST (written to the
    topic, the callback gets an error all the same)."""

    def __init__(
        self,
        broker: KafkaBroker,
        ledger: Ledger,
        decide: Callable[[str, bytes], str | None],
    ) -> None:
        self.real = new_producer(broker.bootstrap, {}, delivery_timeout=10.0)
        self.ledger = ledger
        self.decide = decide
        self.pending: list[Callable[[], None]] = []

    def produce(
        self, topic: str, *, key: bytes, value: bytes | None, headers: Any, on_delivery: Any
    ) -> None:
        found = dict(headers)
        row_id, n = found["id"], int(found["n"])
        self.ledger.produce(key, n)
        how = self.decide(row_id, key)
        if how == LOST:
            self.ledger.fail(how, row_id)
            error = _error(f"injected: {how}")
            self.pending.append(lambda: on_delivery(error, None))
            return

        def delivered(err: Any, msg: Any) -> None:
            if err is None and how == ACK_LOST:
                self.ledger.fail(how, row_id)
                err = _error(f"injected: {how}")
            elif err is None:
                self.ledger.ack(key, n)
            on_delivery(err, msg)

        self.real.produce(topic, key=key, value=value, headers=headers, on_delivery=delivered)

    def _fire(self) -> None:
        pending, self.pending = self.pending, []
        for callback in pending:
            callback()

    def poll(self, timeout: float = 0.0) -> int:
        self._fire()
        return int(self.real.poll(timeout))

    def flush(self, timeout: float = 0.0) -> int:
        self._fire()
        return int(self.real.flush(timeout))

    def __len__(self) -> int:
        return len(self.real) + len(self.pending)


def _error(reason: str) -> Any:
    from confluent_kafka import KafkaError

    return KafkaError(KafkaError._MSG_TIMED_OUT, reason)


def options(broker: KafkaBroker, topic: str, **kw: Any) -> RelayOptions:
    kw.setdefault("poll_interval", 0.05)
    kw.setdefault("exit_when_idle", 1.0)
    kw.setdefault("delivery_timeout", 10.0)
    return RelayOptions(broker.bootstrap, topic_template=topic, **kw)


def write(pg: Pg, events: list[tuple[str, int]], kind: str = "acct") -> list[uuid.UUID]:
    """One transaction: each (aggregateid, n) as an event with header n, in this order."""
    with pg.store.connection() as conn, conn.transaction():  # type: ignore[attr-defined]
        outbox = Outbox(conn, pg.table)
        return [
            outbox.add(kind, aggregate, f"Step{n}", {"n": n}, {"n": str(n)})
            for aggregate, n in events
        ]


def unpublished(pg: Pg) -> list[tuple[str, int]]:
    return [
        (r["aggregateid"], int(r["headers"]["n"]))
        for r in pg.rows().values()
        if r["published_at"] is None
    ]


def on_topic(broker: KafkaBroker, topic: str, expect: int) -> dict[str, list[Any]]:
    """The topic's messages by aggregate (key), each aggregate's in partition order; each
    aggregate's messages must all be in one partition."""
    found: dict[str, list[Any]] = defaultdict(list)
    for m in read_topic(broker, topic, expect):
        found[m.key().decode()].append(m)
    for key, messages in found.items():
        assert len({m.partition() for m in messages}) == 1, f"{key} spans partitions"
        messages.sort(key=lambda m: m.offset())
    return dict(found)


def utc_now() -> datetime:
    return datetime.now(UTC)


def numbers(messages: list[Any]) -> list[int]:
    return [int(dict(headers_of(m))["n"]) for m in messages]


def first_occurrences(messages: list[Any]) -> list[int]:
    seen: dict[str, int] = {}
    for m in messages:
        seen.setdefault(dict(headers_of(m))["id"], int(dict(headers_of(m))["n"]))
    return list(seen.values())


# 1. A failed row holds back its aggregate, and only its aggregate -----------------------------


def test_a_failed_row_holds_back_the_later_rows_of_its_aggregate_only(
    pg: Pg, kafka_broker: KafkaBroker
) -> None:
    topic = kafka_broker.create_topic(f"order-{tag()}", partitions=3)
    ids = write(pg, [("A", 0), ("B", 0), ("A", 1), ("B", 1), ("A", 2), ("B", 2)])
    first_of_a = str(ids[0])
    ledger = Ledger()
    failing = FlakyProducer(
        kafka_broker, ledger, lambda row_id, _key: LOST if row_id == first_of_a else None
    )
    relay = Relay(pg.store, options(kafka_broker, topic, backoff=60.0), producer=failing)
    assert relay.relay_once() == 6  # all six taken: A's rows wait behind A's first
    assert (relay.summary.published, relay.summary.failed) == (3, 1)
    assert ledger.produced == 4  # A#0 and B's three: A#1 and A#2 were never produced
    rows = pg.rows()
    a0 = rows[ids[0]]
    assert a0["published_at"] is None and a0["attempts"] == 1
    assert a0["last_error"] == "injected: lost" and a0["retry_at"] > pg.now()
    for i in (2, 4):  # A#1, A#2: not attempted, not counted, still unpublished
        assert rows[ids[i]]["published_at"] is None and rows[ids[i]]["attempts"] == 0
        assert rows[ids[i]]["retry_at"] is None
    assert all(rows[ids[i]]["published_at"] is not None for i in (1, 3, 5))

    # B goes on while A waits for its first row: a later B row is published, no A row
    (b3,) = write(pg, [("B", 3)])
    assert relay.relay_once() == 1
    assert pg.rows()[b3]["published_at"] is not None
    assert sorted(unpublished(pg)) == [("A", 0), ("A", 1), ("A", 2)]
    assert relay.relay_once() == 0  # A's head is held back: nothing of A is due

    # once A's first row is due again and delivered, A's rows follow it, in order
    pg.set([ids[0]], retry_at=pg.now())
    working = FlakyProducer(kafka_broker, ledger, lambda _row_id, _key: None)
    again = Relay(pg.store, options(kafka_broker, topic), producer=working)
    assert again.relay_once() == 3
    assert unpublished(pg) == []
    assert ledger.early == []
    found = on_topic(kafka_broker, topic, 7)
    assert numbers(found["B"]) == [0, 1, 2, 3]
    assert numbers(found["A"]) == [0, 1, 2]  # the lost delivery never reached the topic


def test_publish_in_order_sends_an_aggregates_next_row_only_after_the_last_was_acknowledged(
    kafka_broker: KafkaBroker,
) -> None:
    """Waves: every aggregate's next row together; an aggregate stops at a failure."""
    topic = kafka_broker.create_topic(f"waves-{tag()}", partitions=3)
    rows = [
        OutboxRow(uuid.uuid4(), "acct", agg, "Step", {"n": n}, {"n": str(n)}, utc_now(), seq=i)
        for i, (agg, n) in enumerate(
            [("A", 0), ("A", 1), ("B", 0), ("A", 2), ("B", 1), ("C", 0), ("B", 2)]
        )
    ]
    ledger = Ledger()
    fail_b1 = str(rows[4].id)
    producer = FlakyProducer(
        kafka_broker, ledger, lambda row_id, _key: ACK_LOST if row_id == fail_b1 else None
    )
    results, held = publish_in_order(producer, rows, lambda _row: topic, 10.0)
    assert ledger.early == []
    assert [r.id for r in held] == [rows[6].id]  # B#2: behind the failed B#1
    assert {i for i, error in results.items() if error is not None} == {rows[4].id}
    assert set(results) == {r.id for r in rows[:6]}
    found = on_topic(kafka_broker, topic, 6)
    assert numbers(found["A"]) == [0, 1, 2]
    assert numbers(found["B"]) == [0, 1]  # B#1 is on the topic: only its ack was lost
    assert numbers(found["C"]) == [0]


# 2. One relay per aggregate ------------------------------------------------------------------


def take(conn: psycopg.Connection[Any], pg: Pg, limit: int) -> list[tuple[str, int]]:
    return [(r.aggregateid, int(r.headers["n"])) for r in OutboxTable(pg.store).take(conn, limit)]


def test_an_aggregate_taken_by_one_transaction_is_skipped_by_every_other(pg: Pg) -> None:
    write(pg, [("A", 0), ("A", 1), ("A", 2), ("B", 0), ("C", 0), ("B", 1)])
    first = pg.server.connect(autocommit=False)
    second = pg.server.connect(autocommit=False)
    third = pg.server.connect(autocommit=False)
    try:
        # the batch ends inside A's run: A#2 is not locked, and still nobody else takes it
        assert take(first, pg, 2) == [("A", 0), ("A", 1)]
        assert take(second, pg, 10) == [("B", 0), ("C", 0), ("B", 1)]
        assert take(third, pg, 10) == []
        # the first relay dies: once its server backend is gone, A is free again, from its
        # first row
        pid = first.info.backend_pid
        first.close()
        wait_until(
            lambda: (
                not pg.admin.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)
                ).fetchone()
            ),
            "the closed connection's backend is gone",
            timeout=10,
            interval=0.01,
        )
        assert take(third, pg, 10) == [("A", 0), ("A", 1), ("A", 2)]
        third.rollback()
        # the second commits B#0 published: the rest of B comes next, from B#1
        ids = {(r["aggregateid"], int(r["headers"]["n"])): i for i, r in pg.rows().items()}
        second.execute(f"UPDATE {pg.table} SET published_at = now() WHERE id = %s", (ids["B", 0],))
        second.commit()
        assert take(third, pg, 10) == [("A", 0), ("A", 1), ("A", 2), ("C", 0), ("B", 1)]
    finally:
        for conn in (first, second, third):
            conn.close()


def test_a_held_back_head_blocks_a_backlog_longer_than_the_first_look(pg: Pg) -> None:
    """The relay looks among the oldest WINDOW x batch rows first; when an aggregate that
    waits for a failed row fills them, the rows behind are found all the same."""
    batch = 5
    backlog = write(pg, [("A", n) for n in range(WINDOW * batch + 10)])
    write(pg, [("B", 0), ("C", 0), ("B", 1)])
    pg.set(
        backlog[:1], attempts=1, last_error="broker down", retry_at=pg.now() + timedelta(hours=1)
    )
    with pg.server.connect(autocommit=False) as conn:
        assert take(conn, pg, batch) == [("B", 0), ("C", 0), ("B", 1)]
    pg.set(backlog[:1], retry_at=pg.now())
    with pg.server.connect(autocommit=False) as conn:
        assert take(conn, pg, batch) == [("A", n) for n in range(batch)]


# 3. Three relays at once, one delivery in ten failing -------------------------------------------

AGGREGATES = 100
EVENTS = 20


def test_three_relays_with_failing_deliveries_keep_every_aggregates_order(
    pg: Pg, kafka_broker: KafkaBroker
) -> None:
    topic = kafka_broker.create_topic(f"order3-{tag()}", partitions=3)
    rng = random.Random(17)
    # Each aggregate's events in order, the aggregates interleaved at random, one to three
    # events of an aggregate in a row, about 50 rows a transaction.
    left = {f"acct-{a:03d}": 0 for a in range(AGGREGATES)}
    transactions: list[list[tuple[str, int]]] = [[]]
    while left:
        aggregate = rng.choice(sorted(left))
        for _ in range(rng.randint(1, 3)):
            if left.get(aggregate) is None:
                break
            transactions[-1].append((aggregate, left[aggregate]))
            left[aggregate] += 1
            if left[aggregate] == EVENTS:
                del left[aggregate]
        if len(transactions[-1]) >= 50:
            transactions.append([])
    half = len(transactions) // 2
    for events in transactions[:half]:
        write(pg, events)

    ledger = Ledger()
    relays, threads, stores = [], [], []
    for i in range(3):
        chance = random.Random(100 + i)

        def decide(_row_id: str, _key: bytes, chance: random.Random = chance) -> str | None:
            if chance.random() >= 0.10:
                return None
            return LOST if chance.random() < 0.5 else ACK_LOST

        store = open_store(pg.url)
        stores.append(store)
        relay = Relay(
            store,
            options(kafka_broker, topic, batch_size=25, backoff=0.05, max_backoff=0.2),
            producer=FlakyProducer(kafka_broker, ledger, decide),
        )
        relays.append(relay)
        threads.append(threading.Thread(target=relay.run, name=f"relay-{i}"))
    started = time.monotonic()
    try:
        for thread in threads:
            thread.start()
        for events in transactions[half:]:  # the rest while the relays run
            before = ledger.produced
            write(pg, events)
            wait_until(lambda: ledger.produced > before, "the relays go on meanwhile", 60)  # noqa: B023
        for thread in threads:
            thread.join(60)
            assert not thread.is_alive(), "a relay still runs after 60 s"
    finally:
        for relay in relays:
            relay.stop()
        for thread in threads:
            thread.join(10)
        for store in stores:
            store.close()
    took = time.monotonic() - started
    total = AGGREGATES * EVENTS
    assert unpublished(pg) == []
    published = [r.summary.published for r in relays]
    failed = [r.summary.failed for r in relays]
    assert sum(published) == total
    assert all(n > 0 for n in published), f"a relay published nothing: {published}"
    assert ledger.early == [], ledger.early[:10]  # no row went out ahead of an earlier one
    injected = {how: len(ids) for how, ids in ledger.failed.items()}
    assert sum(failed) == sum(injected.values())
    assert injected.get(LOST, 0) > 0 and injected.get(ACK_LOST, 0) > 0, injected

    found = on_topic(kafka_broker, topic, total)
    assert sorted(found) == sorted(f"acct-{a:03d}" for a in range(AGGREGATES))
    duplicated: list[str] = []
    for aggregate, messages in found.items():
        # each event at least once; the first copies in the order they were written
        assert first_occurrences(messages) == list(range(EVENTS)), (
            aggregate,
            numbers(messages),
        )
        ids = [dict(headers_of(m))["id"] for m in messages]
        duplicated += [i for i in set(ids) if ids.count(i) > 1]
        for m in messages:
            assert json.loads(m.value()) == {"n": int(dict(headers_of(m))["n"])}
    # duplicates: only rows written to the topic whose acknowledgement was lost
    assert set(duplicated) <= set(ledger.failed[ACK_LOST])
    print(
        f"three relays: {took:.1f}s, published {published}, failed deliveries {failed} "
        f"({injected}), {ledger.produced} produces, {len(duplicated)} duplicated events"
    )
